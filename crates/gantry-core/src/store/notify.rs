//! The notification outbox (migration 0009): subscriptions, events written in the transaction of
//! the change they report ([`on_transition`]), and deliveries (one event to one target) with their
//! tries. Sending is elsewhere (`crate::notify`); this file is only rows.

use rusqlite::{params, Connection, OptionalExtension, Row};

use super::*;
use crate::protocol::notify::{DeliveryState, NotifyDelivery, NotifyEvent, NotifyTarget, Subscription};

/// The event of a job state change, if it is one people are told about.
pub fn event_of_state(to: JobState) -> Option<NotifyEvent> {
    match to {
        JobState::Running => Some(NotifyEvent::Started),
        JobState::Succeeded => Some(NotifyEvent::Finished),
        JobState::Failed => Some(NotifyEvent::Failed),
        JobState::TimedOut => Some(NotifyEvent::TimedOut),
        JobState::Cancelled => Some(NotifyEvent::Cancelled),
        JobState::Queued | JobState::Starting => None,
    }
}

/// Called by [`Store::event`] inside every state change's transaction: the notification is
/// committed with the change or not at all. Written only while the job's owner or the lab has a
/// subscription (one indexed look-up otherwise).
pub(super) fn on_transition(
    tx: &Connection,
    job_id: i64,
    at: i64,
    from: Option<JobState>,
    to: JobState,
    msg: Option<&str>,
) -> Result<()> {
    match event_of_state(to) {
        Some(kind) => record_job_event(tx, kind, job_id, at, msg),
        // A running job queued again because its last attempt ended by preemption (not a retry).
        None if to == JobState::Queued
            && matches!(from, Some(JobState::Running | JobState::Starting))
            && last_attempt_preempted(tx, job_id)? =>
        {
            record_job_event(tx, NotifyEvent::Preempted, job_id, at, msg)
        }
        None => Ok(()),
    }
}

fn last_attempt_preempted(tx: &Connection, job_id: i64) -> Result<bool> {
    let reason: Option<String> = tx
        .prepare_cached("SELECT reason FROM attempts WHERE job_id = ?1 ORDER BY id DESC LIMIT 1")?
        .query_row([job_id], |r| r.get(0))
        .optional()?
        .flatten();
    Ok(reason.as_deref() == Some("preempted"))
}

/// Write `kind` for `job_id` (to its owner and the lab's webhooks) in the caller's transaction. Other
/// paths that change a job (preemption, sessions) call this with their own kind.
/// An event not about a job state change, inside the caller's transaction (committed with the
/// change it reports).
pub fn record_in(
    tx: &Connection,
    kind: NotifyEvent,
    job_id: Option<i64>,
    uid: Option<u32>,
    at: i64,
    text: Option<&str>,
) -> Result<()> {
    tx.prepare_cached("INSERT INTO notify_events (kind, job_id, uid, at, text) VALUES (?1, ?2, ?3, ?4, ?5)")?
        .execute(params![kind.as_str(), job_id, uid, at, text])?;
    Ok(())
}

pub fn record_job_event(tx: &Connection, kind: NotifyEvent, job_id: i64, at: i64, text: Option<&str>) -> Result<()> {
    tx.prepare_cached(
        "INSERT INTO notify_events (kind, job_id, uid, at, text) SELECT ?2, j.id, j.owner_uid, ?3, ?4 FROM jobs j WHERE j.id = ?1 \
         AND EXISTS (SELECT 1 FROM notify_subs s WHERE s.uid = j.owner_uid OR s.uid IS NULL)",
    )?
    .execute(params![job_id, kind.as_str(), at, text])?;
    Ok(())
}

/// An event not yet expanded into deliveries.
#[derive(Debug, Clone)]
pub struct NewEvent {
    pub id: i64,
    pub kind: NotifyEvent,
    pub job: Option<Job>,
    pub uid: Option<u32>,
    pub at: i64,
    pub text: Option<String>,
}

/// A delivery to send now.
#[derive(Debug, Clone)]
pub struct Due {
    pub id: i64,
    /// Its event and subscription (the public id is made of them).
    pub event_id: i64,
    pub sub_id: i64,
    pub uid: Option<u32>,
    pub target: NotifyTarget,
    pub payload: String,
    pub tries: u32,
    pub event: NotifyEvent,
}

fn target_of(kind: &str, target: String) -> NotifyTarget {
    match kind {
        "email" => NotifyTarget::Email { address: target },
        _ => NotifyTarget::Webhook { url: target },
    }
}

fn events_of(json: &str) -> Vec<NotifyEvent> {
    serde_json::from_str::<Vec<String>>(json)
        .unwrap_or_default()
        .iter()
        .filter_map(|s| NotifyEvent::parse(s))
        .collect()
}

fn sub_from_row(r: &Row) -> rusqlite::Result<Subscription> {
    let kind: String = r.get(2)?;
    let events: String = r.get(4)?;
    Ok(Subscription {
        id: r.get(0)?,
        owner: r.get(1)?,
        target: target_of(&kind, r.get(3)?),
        on: events_of(&events),
        job: r.get(5)?,
        created_at: r.get(6)?,
    })
}

const SUB_COLS: &str = "id, owner, kind, target, events, job_id, created_at";

/// Whether a subscription wants this event: the job's own `notify:` list wins over the target's
/// `--on`; a `--job` subscription hears only of that job; a test goes to every target of its user.
pub fn wants(sub: &Subscription, sub_uid: Option<u32>, ev: &NewEvent) -> bool {
    if ev.kind == NotifyEvent::Test {
        return sub_uid.is_some() && sub_uid == ev.uid;
    }
    match sub_uid {
        // The lab's webhooks: every job's and the lab's events they list.
        None => sub.on.contains(&ev.kind),
        // A user's: only events of their own jobs (or addressed to them).
        Some(uid) => {
            if ev.uid != Some(uid) {
                return false;
            }
            if sub.job.is_some() && sub.job != ev.job.as_ref().map(|j| j.id) {
                return false;
            }
            match ev.job.as_ref().and_then(|j| j.job.spec.notify.as_ref()) {
                Some(list) if ev.kind.is_job_event() => list.contains(&ev.kind),
                _ => sub.on.contains(&ev.kind),
            }
        }
    }
}

impl Store {
    /// Subscribe `uid`; refused (`Ok(None)`) when they have `max` already.
    pub fn notify_subscribe(
        &mut self,
        uid: u32,
        owner: &str,
        target: &NotifyTarget,
        on: &[NotifyEvent],
        job: Option<i64>,
        max: usize,
    ) -> Result<Option<Subscription>> {
        let now = self.now();
        let tx = self.conn.transaction()?;
        let have: i64 = tx.query_row("SELECT COUNT(*) FROM notify_subs WHERE uid = ?1", [uid], |r| r.get(0))?;
        if have as usize >= max {
            return Ok(None);
        }
        let names: Vec<&str> = on.iter().map(|e| e.as_str()).collect();
        tx.execute(
            "INSERT INTO notify_subs (uid, owner, kind, target, events, job_id, created_at) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
            params![uid, owner, target.kind(), target.address(), serde_json::to_string(&names)?, job, now],
        )?;
        let id = tx.last_insert_rowid();
        let s = tx.query_row(
            &format!("SELECT {SUB_COLS} FROM notify_subs WHERE id = ?1"),
            [id],
            sub_from_row,
        )?;
        tx.commit()?;
        Ok(Some(s))
    }

    /// `uid`'s subscriptions, then the lab's webhooks.
    pub fn notify_subscriptions(&self, uid: u32) -> Result<Vec<Subscription>> {
        let mut st = self.conn.prepare_cached(&format!(
            "SELECT {SUB_COLS} FROM notify_subs WHERE uid = ?1 OR uid IS NULL ORDER BY uid IS NULL, id"
        ))?;
        let rows = st
            .query_map([uid], sub_from_row)?
            .collect::<rusqlite::Result<Vec<_>>>()?;
        Ok(rows)
    }

    /// Remove one of `uid`'s own subscriptions (never another's, never the lab's).
    pub fn notify_unsubscribe(&mut self, uid: u32, id: i64) -> Result<bool> {
        Ok(self
            .conn
            .execute("DELETE FROM notify_subs WHERE id = ?1 AND uid = ?2", params![id, uid])?
            == 1)
    }

    /// Make the lab's webhooks those of the lab config (on start and on every reload).
    pub fn notify_sync_lab(&mut self, hooks: &[(String, Vec<NotifyEvent>)]) -> Result<()> {
        let now = self.now();
        let tx = self.conn.transaction()?;
        let have: Vec<(String, String)> = {
            let mut st = tx.prepare("SELECT target, events FROM notify_subs WHERE uid IS NULL ORDER BY id")?;
            let rows = st
                .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))?
                .collect::<rusqlite::Result<Vec<_>>>()?;
            rows
        };
        let want: Vec<(String, String)> = hooks
            .iter()
            .map(|(u, on)| {
                Ok((
                    u.clone(),
                    serde_json::to_string(&on.iter().map(|e| e.as_str()).collect::<Vec<_>>())?,
                ))
            })
            .collect::<Result<_>>()?;
        if have == want {
            return Ok(());
        }
        tx.execute("DELETE FROM notify_subs WHERE uid IS NULL", [])?;
        for (url, events) in &want {
            tx.execute("INSERT INTO notify_subs (uid, owner, kind, target, events, created_at) VALUES (NULL, NULL, 'webhook', ?1, ?2, ?3)", params![url, events, now])?;
        }
        tx.commit()?;
        Ok(())
    }

    /// An event not about a job state change (a test, a booking, a session), for `uid` or the lab.
    pub fn notify_record(
        &mut self,
        kind: NotifyEvent,
        job_id: Option<i64>,
        uid: Option<u32>,
        text: Option<&str>,
    ) -> Result<i64> {
        let now = self.now();
        self.conn.execute(
            "INSERT INTO notify_events (kind, job_id, uid, at, text) VALUES (?1, ?2, ?3, ?4, ?5)",
            params![kind.as_str(), job_id, uid, now, text],
        )?;
        Ok(self.conn.last_insert_rowid())
    }

    /// Expand up to `limit` new events into deliveries, in one transaction: each matching
    /// subscription gets one (`UNIQUE (event_id, sub_id)`), with the body `payload` builds (given the
    /// delivery's stable id); one over `max_pending` waiting deliveries of its user is recorded as
    /// dropped. Returns how many deliveries were made.
    pub fn notify_expand(
        &mut self,
        limit: usize,
        max_pending: usize,
        id_of: impl Fn(i64, i64) -> String,
        payload: impl Fn(&NewEvent, &Subscription, Option<u32>, &str) -> String,
    ) -> Result<usize> {
        let now = self.now();
        let tx = self.conn.transaction()?;
        // (id, kind, job id, uid, at, text) of each event not yet expanded into deliveries.
        type EventRow = (i64, String, Option<i64>, Option<u32>, i64, Option<String>);
        let events: Vec<EventRow> = {
            let mut st = tx.prepare_cached(
                "SELECT id, kind, job_id, uid, at, text FROM notify_events WHERE expanded = 0 ORDER BY id LIMIT ?1",
            )?;
            let rows = st
                .query_map([limit as i64], |r| {
                    Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?, r.get(5)?))
                })?
                .collect::<rusqlite::Result<Vec<_>>>()?;
            rows
        };
        if events.is_empty() {
            return Ok(0);
        }
        let subs: Vec<(Option<u32>, Subscription)> = {
            let mut st = tx.prepare_cached(&format!("SELECT uid, {} FROM notify_subs ORDER BY id", SUB_COLS))?;
            let rows = st
                .query_map([], |r| {
                    let uid: Option<u32> = r.get(0)?;
                    let kind: String = r.get(3)?;
                    let events: String = r.get(5)?;
                    Ok((
                        uid,
                        Subscription {
                            id: r.get(1)?,
                            owner: r.get(2)?,
                            target: target_of(&kind, r.get(4)?),
                            on: events_of(&events),
                            job: r.get(6)?,
                            created_at: r.get(7)?,
                        },
                    ))
                })?
                .collect::<rusqlite::Result<Vec<_>>>()?;
            rows
        };
        let mut made = 0;
        for (id, kind, job_id, uid, at, text) in events {
            tx.execute("UPDATE notify_events SET expanded = 1 WHERE id = ?1", [id])?;
            let Some(kind) = NotifyEvent::parse(&kind) else {
                continue;
            };
            let job = match job_id {
                Some(j) => tx
                    .prepare_cached(&format!("SELECT {JOB_COLS} FROM jobs WHERE id = ?1"))?
                    .query_row([j], job_from_row)
                    .optional()?,
                None => None,
            };
            let ev = NewEvent {
                id,
                kind,
                job,
                uid,
                at,
                text,
            };
            for (sub_uid, sub) in subs.iter().filter(|(u, s)| wants(s, *u, &ev)) {
                let did = id_of(ev.id, sub.id);
                let body = payload(&ev, sub, *sub_uid, &did);
                let waiting: i64 = match sub_uid {
                    Some(u) => tx.query_row(
                        "SELECT COUNT(*) FROM notify_deliveries WHERE uid = ?1 AND state = 'pending'",
                        [u],
                        |r| r.get(0),
                    )?,
                    None => tx.query_row(
                        "SELECT COUNT(*) FROM notify_deliveries WHERE uid IS NULL AND state = 'pending'",
                        [],
                        |r| r.get(0),
                    )?,
                };
                let (state, err, done) = if waiting as usize >= max_pending {
                    ("dropped", Some(format!("{waiting} notifications were already waiting to be sent (the lab's `[notify] max_pending`); this one was not sent")), Some(now))
                } else {
                    ("pending", None, None)
                };
                tx.execute(
                    "INSERT OR IGNORE INTO notify_deliveries (event_id, sub_id, uid, kind, target, payload, state, next_at, last_error, created_at, done_at) \
                     VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11)",
                    params![ev.id, sub.id, sub_uid, sub.target.kind(), sub.target.address(), body, state, now, err, now, done],
                )?;
                made += 1;
            }
        }
        tx.commit()?;
        Ok(made)
    }

    /// Deliveries due at `now`, oldest first.
    pub fn notify_due(&self, now: i64, limit: usize) -> Result<Vec<Due>> {
        let mut st = self.conn.prepare_cached(
            "SELECT d.id, d.uid, d.kind, d.target, d.payload, d.tries, e.kind, d.event_id, d.sub_id FROM notify_deliveries d JOIN notify_events e ON e.id = d.event_id \
             WHERE d.state = 'pending' AND d.next_at <= ?1 ORDER BY d.next_at, d.id LIMIT ?2",
        )?;
        let rows = st
            .query_map(params![now, limit as i64], |r| {
                let kind: String = r.get(2)?;
                let ev: String = r.get(6)?;
                Ok(Due {
                    id: r.get(0)?,
                    event_id: r.get(7)?,
                    sub_id: r.get(8)?,
                    uid: r.get(1)?,
                    target: target_of(&kind, r.get(3)?),
                    payload: r.get(4)?,
                    tries: r.get(5)?,
                    event: NotifyEvent::parse(&ev).unwrap_or(NotifyEvent::Test),
                })
            })?
            .collect::<rusqlite::Result<Vec<_>>>()?;
        Ok(rows)
    }

    /// The earliest next try of a pending delivery.
    pub fn notify_next_due(&self) -> Result<Option<i64>> {
        Ok(self.conn.query_row(
            "SELECT MIN(next_at) FROM notify_deliveries WHERE state = 'pending'",
            [],
            |r| r.get(0),
        )?)
    }

    /// The send went through.
    pub fn notify_delivered(&mut self, id: i64) -> Result<()> {
        let now = self.now();
        self.conn.execute("UPDATE notify_deliveries SET state = 'delivered', tries = tries + 1, done_at = ?2, last_error = NULL WHERE id = ?1 AND state = 'pending'", params![id, now])?;
        Ok(())
    }

    /// The send failed: try again at `next_at`, or (`None`) give up.
    pub fn notify_failed(&mut self, id: i64, error: &str, next_at: Option<i64>) -> Result<()> {
        let now = self.now();
        match next_at {
            Some(at) => self.conn.execute("UPDATE notify_deliveries SET tries = tries + 1, next_at = ?2, last_error = ?3 WHERE id = ?1 AND state = 'pending'", params![id, at, error])?,
            None => self.conn.execute(
                "UPDATE notify_deliveries SET state = 'failed', tries = tries + 1, done_at = ?2, last_error = ?3 WHERE id = ?1 AND state = 'pending'",
                params![id, now, error],
            )?,
        };
        Ok(())
    }

    /// `uid`'s deliveries (`None`: the lab's), newest first.
    pub fn notify_log(
        &self,
        uid: Option<u32>,
        limit: usize,
        id_of: impl Fn(i64, i64) -> String,
    ) -> Result<Vec<NotifyDelivery>> {
        let mut st = self.conn.prepare_cached(
            "SELECT d.event_id, d.sub_id, e.kind, e.job_id, d.kind, d.target, d.state, d.tries, e.at, d.next_at, d.done_at, d.last_error \
             FROM notify_deliveries d JOIN notify_events e ON e.id = d.event_id WHERE d.uid IS ?1 ORDER BY d.id DESC LIMIT ?2",
        )?;
        let rows = st
            .query_map(params![uid, limit as i64], |r| {
                let ev: String = r.get(2)?;
                let kind: String = r.get(4)?;
                let state: String = r.get(6)?;
                let state = DeliveryState::parse(&state).unwrap_or(DeliveryState::Failed);
                Ok(NotifyDelivery {
                    id: id_of(r.get(0)?, r.get(1)?),
                    event: NotifyEvent::parse(&ev).unwrap_or(NotifyEvent::Test),
                    job_id: r.get(3)?,
                    target: target_of(&kind, r.get(5)?),
                    state,
                    tries: r.get(7)?,
                    at: r.get(8)?,
                    next_at: Some(r.get::<_, i64>(9)?).filter(|_| state == DeliveryState::Pending),
                    done_at: r.get(10)?,
                    last_error: r.get(11)?,
                })
            })?
            .collect::<rusqlite::Result<Vec<_>>>()?;
        Ok(rows)
    }

    /// Forget deliveries done before `before`, and expanded events none refers to any more.
    pub fn notify_prune(&mut self, before: i64) -> Result<usize> {
        let tx = self.conn.transaction()?;
        let n = tx.execute(
            "DELETE FROM notify_deliveries WHERE state != 'pending' AND done_at < ?1",
            [before],
        )?;
        tx.execute("DELETE FROM notify_events WHERE expanded = 1 AND at < ?1 AND id NOT IN (SELECT event_id FROM notify_deliveries)", [before])?;
        tx.commit()?;
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn store_with_job(owner_uid: u32, notify: Option<Vec<NotifyEvent>>) -> (Store, i64) {
        let mut s = Store::open_in_memory().unwrap();
        let mut v = crate::spec::validate_text("image: a\n", crate::spec::Format::Yaml, &Default::default()).unwrap();
        v.spec.notify = notify;
        let owner = Owner {
            uid: owner_uid,
            gid: owner_uid,
            name: format!("u{owner_uid}"),
        };
        let id = s.insert_job(&v, &owner, "test", None, |_, _| None).unwrap();
        (s, id)
    }

    fn hook(url: &str) -> NotifyTarget {
        NotifyTarget::Webhook { url: url.into() }
    }

    fn expand(s: &mut Store) -> usize {
        s.notify_expand(
            100,
            3,
            |e, d| format!("{e}-{d}"),
            |ev, _, _, id| format!("{}:{id}", ev.kind.as_str()),
        )
        .unwrap()
    }

    /// Who hears of what: the owner's targets by their `--on`, the job's `notify:` over it, a
    /// `--job` target only of that job, never another user's target; the lab's by their list.
    #[test]
    fn events_reach_the_owners_matching_targets_and_the_labs() {
        let (mut s, job) = store_with_job(1000, None);
        let all = s
            .notify_subscribe(1000, "u1000", &hook("http://a/all"), &NotifyEvent::ALL, None, 10)
            .unwrap()
            .unwrap();
        let fail = s
            .notify_subscribe(1000, "u1000", &hook("http://a/fail"), &[NotifyEvent::Failed], None, 10)
            .unwrap()
            .unwrap();
        let other = s
            .notify_subscribe(
                1000,
                "u1000",
                &hook("http://a/other-job"),
                &NotifyEvent::ALL,
                Some(job + 1),
                10,
            )
            .unwrap()
            .unwrap();
        let bob = s
            .notify_subscribe(1001, "u1001", &hook("http://b/all"), &NotifyEvent::ALL, None, 10)
            .unwrap()
            .unwrap();
        s.notify_sync_lab(&[("http://lab/finished".into(), vec![NotifyEvent::Finished])])
            .unwrap();
        let lab = s
            .notify_subscriptions(1000)
            .unwrap()
            .into_iter()
            .find(|x| x.owner.is_none())
            .unwrap();
        let a = s.begin_attempt(job, &[], &[]).unwrap().unwrap();
        s.set_running(job).unwrap();
        let end = Ending {
            next: JobState::Succeeded,
            exit_code: Some(0),
            reason: crate::protocol::EndReason::Exited,
            message: None,
            not_before: None,
        };
        s.end_attempt(job, a.id, &end).unwrap();
        assert_eq!(expand(&mut s), 3, "started and finished to `all`, finished to the lab");
        let log = s.notify_log(Some(1000), 10, |e, d| format!("{e}-{d}")).unwrap();
        let got: Vec<(NotifyEvent, String)> = log
            .iter()
            .rev()
            .map(|d| (d.event, d.target.address().to_string()))
            .collect();
        assert_eq!(
            got,
            [
                (NotifyEvent::Started, "http://a/all".to_string()),
                (NotifyEvent::Finished, "http://a/all".to_string())
            ]
        );
        assert!(log
            .iter()
            .all(|d| !d.id.ends_with(&format!("-{}", fail.id)) && !d.id.ends_with(&format!("-{}", other.id))));
        assert!(
            s.notify_log(Some(1001), 10, |e, d| format!("{e}-{d}"))
                .unwrap()
                .is_empty(),
            "bob ({}) hears nothing of u1000's job",
            bob.id
        );
        let lab_log = s.notify_log(None, 10, |e, d| format!("{e}-{d}")).unwrap();
        assert_eq!(lab_log.len(), 1);
        assert!(lab_log[0].id.ends_with(&format!("-{}", lab.id)));
        assert_eq!(expand(&mut s), 0, "each event is expanded once");
        assert_eq!(
            s.notify_subscribe(1000, "u1000", &hook("http://a/x"), &[], None, 3)
                .unwrap(),
            None,
            "the per-user cap"
        );
        assert!(
            !s.notify_unsubscribe(1001, all.id).unwrap(),
            "bob cannot remove alice's subscription"
        );
        assert!(s.notify_unsubscribe(1000, all.id).unwrap());
    }

    #[test]
    fn the_jobs_own_list_wins_and_a_full_outbox_drops_with_a_reason() {
        let (mut s, job) = store_with_job(1000, Some(vec![NotifyEvent::Started]));
        s.notify_subscribe(1000, "u1000", &hook("http://a/fail"), &[NotifyEvent::Failed], None, 10)
            .unwrap()
            .unwrap();
        s.begin_attempt(job, &[], &[]).unwrap().unwrap();
        s.set_running(job).unwrap();
        assert_eq!(
            expand(&mut s),
            1,
            "`notify: [started]` in the spec reaches a target that listed only `failed`"
        );
        for _ in 0..3 {
            s.notify_record(NotifyEvent::Test, None, Some(1000), None).unwrap();
        }
        expand(&mut s);
        let log = s.notify_log(Some(1000), 10, |e, d| format!("{e}-{d}")).unwrap();
        let states: Vec<DeliveryState> = log.iter().rev().map(|d| d.state).collect();
        assert_eq!(
            states,
            [
                DeliveryState::Pending,
                DeliveryState::Pending,
                DeliveryState::Pending,
                DeliveryState::Dropped
            ]
        );
        assert!(
            log[0].last_error.as_deref().unwrap().contains("max_pending"),
            "{:?}",
            log[0]
        );
        let due = s.notify_due(i64::MAX, 10).unwrap();
        assert_eq!(due.len(), 3);
        s.notify_failed(due[0].id, "refused", Some(i64::MAX)).unwrap();
        s.notify_failed(due[1].id, "refused", None).unwrap();
        s.notify_delivered(due[2].id).unwrap();
        s.notify_delivered(due[2].id).unwrap();
        let log = s.notify_log(Some(1000), 10, |e, d| format!("{e}-{d}")).unwrap();
        let by_state = |st| log.iter().filter(|d| d.state == st).count();
        assert_eq!(
            (
                by_state(DeliveryState::Pending),
                by_state(DeliveryState::Failed),
                by_state(DeliveryState::Delivered)
            ),
            (1, 1, 1)
        );
        assert_eq!(
            log.iter().find(|d| d.state == DeliveryState::Delivered).unwrap().tries,
            1,
            "marked delivered once"
        );
    }

    /// The kinds other paths emit (preemption in its own transaction; sessions and bookings for a
    /// user) reach the targets that list them, and only those.
    #[test]
    fn preemption_session_and_booking_events_reach_who_asked_for_them() {
        let (mut s, job) = store_with_job(1000, None);
        s.notify_subscribe(
            1000,
            "u1000",
            &hook("http://a/p"),
            &[NotifyEvent::Preempted, NotifyEvent::SessionIdle],
            None,
            10,
        )
        .unwrap()
        .unwrap();
        s.notify_subscribe(
            1000,
            "u1000",
            &hook("http://a/b"),
            &[NotifyEvent::BookingStarting],
            None,
            10,
        )
        .unwrap()
        .unwrap();
        s.notify_subscribe(1001, "u1001", &hook("http://b/all"), &NotifyEvent::ALL, None, 10)
            .unwrap()
            .unwrap();
        {
            let tx = s.conn.transaction().unwrap();
            record_job_event(&tx, NotifyEvent::Preempted, job, 5, Some("made room for job 9")).unwrap();
            tx.commit().unwrap();
        }
        s.notify_record(NotifyEvent::SessionIdle, None, Some(1000), Some("idle 50 min"))
            .unwrap();
        s.notify_record(NotifyEvent::BookingStarting, None, Some(1000), Some("GPU 0 at 14:00"))
            .unwrap();
        assert_eq!(expand(&mut s), 3);
        let log = s.notify_log(Some(1000), 10, |e, d| format!("{e}-{d}")).unwrap();
        let got: Vec<(NotifyEvent, &str)> = log.iter().rev().map(|d| (d.event, d.target.address())).collect();
        assert_eq!(
            got,
            [
                (NotifyEvent::Preempted, "http://a/p"),
                (NotifyEvent::SessionIdle, "http://a/p"),
                (NotifyEvent::BookingStarting, "http://a/b")
            ]
        );
        assert_eq!(log.last().unwrap().job_id, Some(job));
        assert!(
            s.notify_log(Some(1001), 10, |e, d| format!("{e}-{d}"))
                .unwrap()
                .is_empty(),
            "another user's events never reach u1001"
        );
    }
}
