//! GPU bookings in the engine: the lab's rules checked when one is made (`Engine::book`), the
//! open ones handed to each scheduling pass ([`crate::scheduler::BookHold`]), and no-shows released.
//! The placement rules are the scheduler's ([`crate::scheduler::book`]).

use std::collections::HashMap;

use super::{Engine, EngineError};
use crate::protocol::{BookRequest, BookingRules, BookingState, BookingView, Bookings, BookingsQuery};
use crate::scheduler::{Assigned, BookHold, GpuFilter};
use crate::store::{Booking, NewBooking};
use crate::units::{duration_setting, local_datetime, local_hhmm};

/// What the engine keeps of bookings between passes.
#[derive(Default)]
pub(crate) struct BookCache {
    /// The open bookings (`None`: read them again: one was made, cancelled or released).
    open: Option<Vec<Booking>>,
    /// The last pass's GPUs per booking (`gantry bookings` shows them while active).
    assigned: Vec<Assigned>,
    /// Whether each queued job would be preemptible (read from its spec once).
    preemptible: HashMap<i64, bool>,
    /// Bookings whose owner this engine has told they start soon (the store's mark is the truth).
    told: std::collections::HashSet<i64>,
    /// When each active, used booking was last seen used (in memory: after a restart the clock
    /// starts again, in its owner's favour).
    last_use: HashMap<i64, i64>,
}

const DAY: i64 = 86_400_000;
const NOTE_MAX: usize = 200;

/// Monday 00:00 UTC of the week `ms` falls in (1970-01-01 was a Thursday).
fn week_start(ms: i64) -> i64 {
    let days = ms.div_euclid(DAY);
    (days - (days + 3).rem_euclid(7)) * DAY
}

/// How much of a booking counts toward its owner's week (ms): all of it, unless it was cancelled
/// after its start: then until the end of the slot it was cancelled in, at least one slot (a
/// booking's start preempts; cancelling it right after must not make that free).
fn counted_ms(b: &Booking, slot: i64) -> i64 {
    match (b.closed, b.closed_ms) {
        (Some(BookingState::Cancelled), Some(at)) if at > b.start_ms => {
            let used = (at - b.start_ms).saturating_add(slot - 1) / slot.max(1) * slot;
            used.max(slot).min(b.end_ms.saturating_sub(b.start_ms))
        }
        (Some(BookingState::Cancelled), _) => 0,
        _ => b.end_ms.saturating_sub(b.start_ms),
    }
}

/// "14:00–18:00", or with dates when it does not start and end on the same local day.
pub(crate) fn span(start: i64, end: i64) -> String {
    let (a, b) = (local_datetime(start), local_datetime(end));
    if a[..10] == b[..10] {
        format!("{}–{}", &a[11..], &b[11..])
    } else {
        format!("{a}–{b}")
    }
}

/// `14:00` today, else `2026-12-03 14:00` (local time).
fn when(ms: i64, now: i64) -> String {
    let (t, n) = (local_datetime(ms), local_datetime(now));
    if t[..10] == n[..10] {
        t[11..].to_string()
    } else {
        t
    }
}

impl Engine {
    pub(crate) fn booking_rules(&self) -> BookingRules {
        let b = &self.policy().bookings;
        BookingRules {
            enabled: b.enabled,
            slot_ms: b.slot.as_millis() as i64,
            max_ahead_ms: b.max_ahead.as_millis() as i64,
            max_length_ms: b.max_length.as_millis() as i64,
            max_gpu_hours_week: b.max_gpu_hours_per_week,
            max_gpus: b
                .max_gpus
                .unwrap_or(self.latest.read().unwrap().iter().filter(|g| self.usable(g)).count() as u32),
            release_after_ms: b.release_after.as_millis() as i64,
        }
    }

    /// GPUs of this machine a booking asking for `gpu_type` may hold (index, name, memory).
    fn bookable(&self, gpu_type: Option<&str>) -> Vec<u32> {
        let f = GpuFilter {
            gpu_type: gpu_type.map(Into::into),
            min_memory: None,
        };
        self.latest
            .read()
            .unwrap()
            .iter()
            .filter(|g| self.usable(g) && g.mig_parent.is_none() && f.eligible(&g.name, g.memory_total))
            .map(|g| g.index)
            .collect()
    }

    pub(crate) fn booking_view(&self, b: &Booking, caller: u32, now: i64) -> BookingView {
        let state = b.state(now);
        let see_note = caller == b.uid || self.policy().is_admin(caller);
        let (gpu_indices, waiting_for) = if state == BookingState::Active {
            let c = self.book_cache.lock().unwrap();
            c.assigned
                .iter()
                .find(|a| a.booking == b.id)
                .map(|a| (a.gpus.clone(), a.waiting_for.clone()))
                .unwrap_or_default()
        } else {
            (vec![], vec![])
        };
        BookingView {
            id: b.id,
            owner: b.owner.clone(),
            uid: b.uid,
            gpus: b.gpus,
            gpu_type: b.gpu_type.clone(),
            start_ms: b.start_ms,
            end_ms: b.end_ms,
            state,
            note: if see_note { b.note.clone() } else { None },
            mine: caller == b.uid,
            created_ms: b.created_ms,
            closed_ms: b.closed_ms.or((state == BookingState::Ended).then_some(b.end_ms)),
            closed_why: b.closed_why.clone(),
            gpu_indices,
            waiting_for,
        }
    }

    /// `gantry book`: check the lab's rules, then book (the clash and weekly checks inside the
    /// inserting transaction).
    pub fn book(&self, uid: u32, owner: &str, req: BookRequest) -> Result<BookingView, EngineError> {
        let policy = self.policy();
        let rules = &policy.bookings;
        let refuse = |m: String| Err(EngineError::BookingRefused(m));
        if !rules.enabled {
            return refuse(format!(
                "bookings are turned off on this machine{}; ask the lab's admin",
                self.set_in("bookings.enabled")
            ));
        }
        let now = self.now();
        let slot = rules.slot.as_millis() as i64;
        let slot_h = duration_setting(rules.slot);
        let gpus = self.bookable(req.gpu_type.as_deref());
        let what = req.gpu_type.as_deref().map(|t| format!(" {t}")).unwrap_or_default();
        if req.gpus == 0 {
            return refuse("a booking needs at least 1 GPU (--gpus 1)".into());
        }
        if gpus.is_empty() {
            return refuse(format!(
                "this machine has no{what} GPUs to book{}",
                if what.is_empty() {
                    String::new()
                } else {
                    "; leave out --gpu-type, or see `gantry gpus`".into()
                }
            ));
        }
        let max = rules.max_gpus.unwrap_or(u32::MAX).min(gpus.len() as u32);
        if req.gpus > max {
            let why = if rules.max_gpus.is_some_and(|m| m < gpus.len() as u32) {
                format!(
                    "the lab allows at most {max} per booking{}",
                    self.set_in("bookings.max_gpus")
                )
            } else {
                format!(
                    "this machine has {}{what} GPU{}",
                    gpus.len(),
                    if gpus.len() == 1 { "" } else { "s" }
                )
            };
            return refuse(format!("{} GPUs asked for: {why}; use --gpus {max} or fewer", req.gpus));
        }
        // Checked first, with checked arithmetic: every sum below then stays far inside an i64.
        let length = match req.end_ms.checked_sub(req.start_ms) {
            Some(l) if l > 0 => l,
            _ => return refuse("the booking ends before it starts; give --for a positive length".into()),
        };
        let max_length = rules.max_length.as_millis() as i64;
        if length > max_length {
            return refuse(format!(
                "the booking would last {}; the lab allows bookings of at most {}{}. Book at most --for {} (longer work goes in the queue as jobs)",
                crate::units::duration_brief_ms(length),
                duration_setting(rules.max_length),
                self.set_in("bookings.max_length"),
                duration_setting(rules.max_length)
            ));
        }
        let ahead = rules.max_ahead.as_millis() as i64;
        if req.start_ms > now + ahead {
            return refuse(format!(
                "bookings may start at most {} ahead{} (until {}); {} is later",
                duration_setting(rules.max_ahead),
                self.set_in("bookings.max_ahead"),
                local_datetime(now + ahead),
                local_datetime(req.start_ms)
            ));
        }
        let aligned = |ms: i64| ms.rem_euclid(slot) == 0;
        if !aligned(req.start_ms) {
            let before = req.start_ms - req.start_ms.rem_euclid(slot);
            return refuse(format!(
                "a booking starts on a {slot_h} slot{} and {} is not on one; use {} or {}",
                self.set_in("bookings.slot"),
                local_hhmm(req.start_ms),
                local_hhmm(before),
                local_hhmm(before + slot)
            ));
        }
        if !aligned(req.end_ms - req.start_ms) {
            return refuse(format!(
                "a booking lasts a whole number of {slot_h} slots{}; {} is not (use --for {})",
                self.set_in("bookings.slot"),
                crate::units::duration_ms(req.end_ms - req.start_ms),
                crate::units::duration_ms((req.end_ms - req.start_ms).div_euclid(slot).max(1) * slot)
            ));
        }
        if req.start_ms.saturating_add(slot) <= now {
            return refuse(format!(
                "{} is in the past; book from the current slot ({}) on",
                local_datetime(req.start_ms),
                local_hhmm(now - now.rem_euclid(slot))
            ));
        }
        let note = req
            .note
            .as_deref()
            .map(str::trim)
            .filter(|n| !n.is_empty())
            .map(str::to_string);
        if let Some(n) = &note {
            if n.chars().count() > NOTE_MAX || n.chars().any(|c| c.is_control()) {
                return refuse(format!(
                    "the note is {} characters or has control characters; keep it to one line of at most {NOTE_MAX}",
                    n.chars().count()
                ));
            }
        }
        let week = week_start(req.start_ms);
        let new = NewBooking {
            uid,
            owner: owner.to_string(),
            gpus: req.gpus,
            gpu_type: req.gpu_type.clone(),
            start_ms: req.start_ms,
            end_ms: req.end_ms,
            note,
        };
        let capacity = gpus.len() as u32;
        let weekly = rules.max_gpu_hours_per_week;
        let weekly_in = self.set_in("bookings.max_gpu_hours_per_week");
        let shared = |b: &Booking| {
            let theirs = self.bookable(b.gpu_type.as_deref());
            theirs.iter().any(|g| gpus.contains(g))
        };
        let made = self.store().book(&new, week.min(now), |others| {
            // Clashes: the most GPUs booked at once during the new booking, among those that may
            // hold the same GPUs.
            let clash: Vec<&Booking> = others.iter().filter(|b| b.closed.is_none() && b.start_ms < new.end_ms && new.start_ms < b.end_ms && shared(b)).collect();
            let points = std::iter::once(new.start_ms).chain(clash.iter().map(|b| b.start_ms.max(new.start_ms)));
            for t in points {
                let at: Vec<&&Booking> = clash.iter().filter(|b| b.start_ms <= t && t < b.end_ms).collect();
                let booked: u32 = at.iter().map(|b| b.gpus).sum();
                if booked + new.gpus > capacity {
                    let names: Vec<String> = at.iter().map(|b| format!("booking {} ({}, {} GPU{}, {})", b.id, b.owner, b.gpus, if b.gpus == 1 { "" } else { "s" }, span(b.start_ms, b.end_ms))).collect();
                    return Err(format!(
                        "{booked} of this machine's {capacity}{what} GPUs are booked at {}: {}; {} left, you asked for {}. Pick another time (`gantry bookings` shows them) or ask for fewer GPUs",
                        local_datetime(t),
                        names.join(", "),
                        capacity - booked.min(capacity),
                        new.gpus
                    ));
                }
            }
            if let Some(max) = weekly {
                // In milli-GPU-hours, in i128: stored rows from before `max_length` may be huge.
                let milli = |gpus: u32, ms: i64| gpus as i128 * ms as i128 / 3600;
                let had: i128 = others
                    .iter()
                    .filter(|b| b.uid == new.uid && week_start(b.start_ms) == week)
                    .map(|b| milli(b.gpus, counted_ms(b, slot)))
                    .sum();
                let want = milli(new.gpus, new.end_ms - new.start_ms);
                if had + want > max as i128 * 1000 {
                    let h = |m: i128| if m % 1000 == 0 { format!("{}", m / 1000) } else { format!("{:.1}", m as f64 / 1000.0) };
                    return Err(format!(
                        "this booking is {} GPU-hours and you have {} booked in the week from {} (Monday, UTC; a booking cancelled after its start counts until then, at least one slot); the lab allows {max} per user per week{weekly_in}. Book fewer GPUs or hours, or cancel one before it starts (`gantry book cancel ID`)",
                        h(want),
                        h(had),
                        &local_datetime(week)[..10]
                    ));
                }
            }
            // The same user's open booking of the same GPUs at the same time: a duplicate (a second
            // `gantry book` of the same slot), or a wish for more GPUs that is one booking.
            if let Some(d) = others.iter().find(|b| {
                b.uid == new.uid && b.closed.is_none() && b.gpu_type == new.gpu_type && b.start_ms < new.end_ms && new.start_ms < b.end_ms
            }) {
                return Err(format!(
                    "you already have booking {} ({} GPU{}, {}) at that time; to hold more GPUs or longer, cancel it (`gantry book cancel {}`) and book once with the GPUs and time you need",
                    d.id,
                    d.gpus,
                    if d.gpus == 1 { "" } else { "s" },
                    span(d.start_ms, d.end_ms),
                    d.id
                ));
            }
            Ok(())
        });
        match made {
            Ok(Ok(b)) => {
                self.book_cache.lock().unwrap().open = None;
                *self.last_pass.lock().unwrap() = None;
                self.wake.notify_one();
                tracing::info!(booking = b.id, owner = %b.owner, "booked {} GPU(s) {}", b.gpus, span(b.start_ms, b.end_ms));
                Ok(self.booking_view(&b, uid, now))
            }
            Ok(Err(why)) => refuse(why),
            Err(e) => {
                self.store_failed("recording a booking", &e);
                Err(e.into())
            }
        }
    }

    /// `gantry bookings`.
    pub fn bookings(&self, caller: u32, q: &BookingsQuery) -> Result<Bookings, EngineError> {
        let now = self.now();
        let mut rows = self.reader().open_bookings(now)?;
        if q.all {
            rows.extend(
                self.reader()
                    .past_bookings(now, q.limit.unwrap_or(100).clamp(1, 10_000))?,
            );
        }
        Ok(Bookings {
            now_ms: now,
            rules: self.booking_rules(),
            bookings: rows.iter().map(|b| self.booking_view(b, caller, now)).collect(),
        })
    }

    /// `gantry book cancel ID`: its owner or an admin (root).
    pub fn cancel_booking(&self, caller: u32, id: i64) -> Result<BookingView, EngineError> {
        let now = self.now();
        let b = self.reader().booking(id)?.ok_or(EngineError::NoSuchBooking(id))?;
        if caller != b.uid && !self.policy().is_admin(caller) {
            return Err(EngineError::NotBookingOwner { id, owner: b.owner });
        }
        let state = b.state(now);
        if !state.is_open() {
            return Err(EngineError::BookingRefused(format!(
                "booking {id} is {} already; nothing to cancel",
                state.as_str()
            )));
        }
        let by = crate::access::user_name(caller);
        let closed = self
            .store()
            .close_booking(id, BookingState::Cancelled, &format!("cancelled by {by}"));
        match closed {
            Ok(_) => {}
            Err(e) => {
                self.store_failed(&format!("cancelling booking {id}"), &e);
                return Err(e.into());
            }
        }
        self.book_cache.lock().unwrap().open = None;
        *self.last_pass.lock().unwrap() = None;
        self.wake.notify_one();
        let b = self.reader().booking(id)?.ok_or(EngineError::NoSuchBooking(id))?;
        Ok(self.booking_view(&b, caller, now))
    }

    /// The open bookings for this pass, as the scheduler sees them (`None`: a read failed; the
    /// pass goes on without them only after the store problem is set).
    pub(super) fn booking_holds(&self, now: i64) -> Vec<BookHold> {
        let open = {
            let cached = self.book_cache.lock().unwrap().open.clone();
            match cached {
                Some(o) => o,
                None => match self.reader().open_bookings(now) {
                    Ok(o) => {
                        self.book_cache.lock().unwrap().open = Some(o.clone());
                        o
                    }
                    Err(e) => {
                        self.store_failed("reading the bookings", &e);
                        return vec![];
                    }
                },
            }
        };
        open.iter()
            .filter(|b| b.end_ms > now)
            .map(|b| BookHold {
                id: b.id,
                user: b.owner.clone(),
                gpus: b.gpus,
                filter: GpuFilter {
                    gpu_type: b.gpu_type.clone(),
                    min_memory: None,
                },
                start_ms: b.start_ms,
                end_ms: b.end_ms,
                from: when(b.start_ms, now),
                until: when(b.end_ms, now),
            })
            .collect()
    }

    /// What changes with the clock: whether each open booking starts soon, has started or ended
    /// (the pass must run again when one does).
    pub(super) fn bookings_phase(&self, now: i64) -> Vec<(i64, bool, bool, bool)> {
        let lead = crate::defaults::BOOKING_STARTING_LEAD.as_millis() as i64;
        let c = self.book_cache.lock().unwrap();
        c.open
            .as_ref()
            .map(|o| {
                o.iter()
                    .map(|b| (b.id, b.start_ms - lead <= now, b.start_ms <= now, b.end_ms <= now))
                    .collect()
            })
            .unwrap_or_default()
    }

    /// Which queued jobs would be preemptible, from their specs (read once per job).
    pub(super) fn queued_preemptible(&self, ids: &[i64]) -> Vec<i64> {
        let policy = self.policy();
        if !policy.preemption.enabled {
            return vec![];
        }
        let mut c = self.book_cache.lock().unwrap();
        c.preemptible.retain(|id, _| ids.contains(id));
        let mut out = vec![];
        for id in ids {
            let p = match c.preemptible.get(id) {
                Some(p) => *p,
                None => {
                    let Ok(Some(job)) = self.reader().job(*id) else {
                        continue;
                    };
                    let p = policy.preemption.preemptible(&job.job.spec);
                    c.preemptible.insert(*id, p);
                    p
                }
            };
            if p {
                out.push(*id);
            }
        }
        out
    }

    /// With nothing queued there is no pass: give the bookings their GPUs and tend them all the same.
    pub(crate) fn bookings_without_a_pass(&self, gpus: Vec<crate::scheduler::GpuView>) {
        let now = self.now();
        let holds = self.booking_holds(now);
        if holds.is_empty() {
            self.tend_bookings(now, vec![]);
            return;
        }
        let running: Vec<crate::scheduler::RunningJob> = self
            .running
            .lock()
            .unwrap()
            .iter()
            .map(|(id, h)| crate::scheduler::RunningJob {
                job_id: *id,
                user: h.owner.clone(),
                gpus: h.gpus.clone(),
                gpu_memory: h.gpu_memory,
                expected_end_ms: h.expected_end,
                needs: h.needs,
                victim: h.victim.clone(),
                declared: h.declared,
            })
            .collect();
        let state = crate::scheduler::State {
            now_ms: now,
            gpus,
            running,
            queued: vec![],
            config: crate::scheduler::Config {
                bookings: holds,
                ..Default::default()
            },
            typical_wait_ms: None,
            host: None,
        };
        let plan = crate::scheduler::plan(&state);
        self.preempt(plan.preempt);
        self.tend_bookings(now, crate::scheduler::assign(&state));
    }

    /// After a pass: keep its GPUs per booking, note which active bookings their owners use, and
    /// release those unused for `release_after` since their start.
    pub(super) fn tend_bookings(&self, now: i64, assigned: Vec<Assigned>) {
        let release_after = self.policy().bookings.release_after.as_millis() as i64;
        let open = self.book_cache.lock().unwrap().open.clone().unwrap_or_default();
        let owners_gpus: Vec<(String, Vec<u32>)> = self
            .running
            .lock()
            .unwrap()
            .values()
            .map(|h| (h.owner.clone(), h.gpus.clone()))
            .collect();
        // Owners' queued jobs that could go on a booking of `n` GPUs (not held, asking for 1 to n).
        let queued_for: Vec<(String, u32)> = self
            .queue
            .lock()
            .unwrap()
            .rows()
            .iter()
            .filter(|j| !j.held && j.gpus > 0)
            .map(|j| (j.owner.clone(), j.gpus))
            .collect();
        let mut changed = false;
        // Starting soon: told once (the store keeps the mark; `told` spares the write every pass).
        let lead = crate::defaults::BOOKING_STARTING_LEAD.as_millis() as i64;
        for b in open
            .iter()
            .filter(|b| b.closed.is_none() && b.start_ms - lead <= now && now < b.start_ms)
        {
            if self.book_cache.lock().unwrap().told.contains(&b.id) {
                continue;
            }
            let text = format!(
                "booking {}: {} GPU{} {}",
                b.id,
                b.gpus,
                if b.gpus == 1 { "" } else { "s" },
                span(b.start_ms, b.end_ms)
            );
            match self.store().booking_starting(b.id, &text) {
                Ok(_) => {
                    self.book_cache.lock().unwrap().told.insert(b.id);
                }
                Err(e) => {
                    self.store_failed(&format!("telling the owner of booking {} it starts soon", b.id), &e);
                    return;
                }
            }
        }
        for b in open
            .iter()
            .filter(|b| b.closed.is_none() && b.start_ms <= now && now < b.end_ms)
        {
            let gpus = assigned
                .iter()
                .find(|a| a.booking == b.id)
                .map(|a| a.gpus.clone())
                .unwrap_or_default();
            let used = owners_gpus
                .iter()
                .any(|(o, g)| *o == b.owner && g.iter().any(|g| gpus.contains(g)));
            if used {
                self.book_cache.lock().unwrap().last_use.insert(b.id, now);
                if b.used_ms.is_none() {
                    let r = self.store().booking_used(b.id);
                    if let Err(e) = r {
                        self.store_failed(&format!("recording that booking {} is used", b.id), &e);
                        return;
                    }
                    changed = true;
                }
                continue;
            }
            let idle_for = |ms: i64| duration_setting(std::time::Duration::from_millis(ms.max(0) as u64));
            let why = if b.used_ms.is_some() {
                // Used, then left: released once unused for `release_after` since its owner's last
                // use, whatever its owner has queued (a booking is GPUs in use, not a queue's claim).
                let last = *self.book_cache.lock().unwrap().last_use.entry(b.id).or_insert(now);
                (now >= last + release_after).then(|| {
                    format!(
                        "released: unused for {} since its owner's last job on it",
                        idle_for(release_after)
                    )
                })
            } else {
                // Not a no-show while it waits for a job to leave its GPUs, or while its owner has a
                // job queued that it could hold.
                let waiting = assigned.iter().any(|a| a.booking == b.id && !a.waiting_for.is_empty());
                let queued = queued_for.iter().any(|(o, n)| *o == b.owner && *n <= b.gpus);
                (now >= b.start_ms + release_after && !waiting && !queued)
                    .then(|| format!("released: unused for {} after its start", idle_for(release_after)))
            };
            if let Some(why) = why {
                let r = self.store().close_booking(b.id, BookingState::Released, &why);
                match r {
                    Ok(_) => {
                        tracing::info!(booking = b.id, owner = %b.owner, "booking {} of {} {why}", b.id, b.owner);
                        self.book_cache.lock().unwrap().last_use.remove(&b.id);
                        changed = true;
                    }
                    Err(e) => {
                        self.store_failed(&format!("releasing booking {}", b.id), &e);
                        return;
                    }
                }
            }
        }
        let mut c = self.book_cache.lock().unwrap();
        c.last_use
            .retain(|id, _| open.iter().any(|b| b.id == *id && b.end_ms > now));
        c.assigned = assigned;
        if changed {
            c.open = None;
            drop(c);
            *self.last_pass.lock().unwrap() = None;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn weeks_start_on_monday_utc() {
        // 2026-12-02 is a Wednesday; its week starts on Monday 2026-11-30.
        let wed = 1_796_169_600_000 + 13 * 3_600_000; // 2026-12-02 13:00 UTC
        assert_eq!(week_start(wed), 1_796_169_600_000 - 2 * DAY);
        assert_eq!(week_start(week_start(wed)), week_start(wed));
    }
}
