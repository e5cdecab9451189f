//! GPU bookings (`gantry book`): rows of `bookings` (migration 0011). A booking is never deleted:
//! cancelling or releasing closes it. Checks that depend on the other bookings (overlaps against the
//! GPU count, the weekly limit) run inside the inserting transaction, so two requests at once cannot
//! both pass them.

use rusqlite::{params, OptionalExtension};

use super::{notify, Result, Store};
use crate::protocol::{BookingState, NotifyEvent};

/// One booking as stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Booking {
    pub id: i64,
    pub uid: u32,
    pub owner: String,
    pub gpus: u32,
    pub gpu_type: Option<String>,
    pub start_ms: i64,
    pub end_ms: i64,
    pub note: Option<String>,
    pub created_ms: i64,
    /// When its owner's job or session first ran on its GPUs during it.
    pub used_ms: Option<i64>,
    /// `Cancelled` or `Released`; `None` while open.
    pub closed: Option<BookingState>,
    pub closed_ms: Option<i64>,
    pub closed_why: Option<String>,
}

impl Booking {
    /// Its state at `now`.
    pub fn state(&self, now: i64) -> BookingState {
        match self.closed {
            Some(s) => s,
            None if now >= self.end_ms => BookingState::Ended,
            None if now >= self.start_ms => BookingState::Active,
            None => BookingState::Booked,
        }
    }
}

/// A booking to make.
#[derive(Debug, Clone)]
pub struct NewBooking {
    pub uid: u32,
    pub owner: String,
    pub gpus: u32,
    pub gpu_type: Option<String>,
    pub start_ms: i64,
    pub end_ms: i64,
    pub note: Option<String>,
}

const COLUMNS: &str =
    "id, uid, owner, gpus, gpu_type, start_ms, end_ms, note, created_ms, used_ms, closed, closed_ms, closed_why";

fn row(r: &rusqlite::Row) -> rusqlite::Result<Booking> {
    let closed: Option<String> = r.get(10)?;
    Ok(Booking {
        id: r.get(0)?,
        uid: r.get(1)?,
        owner: r.get(2)?,
        gpus: r.get(3)?,
        gpu_type: r.get(4)?,
        start_ms: r.get(5)?,
        end_ms: r.get(6)?,
        note: r.get(7)?,
        created_ms: r.get(8)?,
        used_ms: r.get(9)?,
        closed: closed.as_deref().and_then(BookingState::parse),
        closed_ms: r.get(11)?,
        closed_why: r.get(12)?,
    })
}

impl Store {
    /// Insert `b` if `check` accepts it, given the bookings that end after `since` and were not
    /// cancelled before their start (open ones; released ones: a no-show still counts toward its
    /// owner's week; ones cancelled after their start: their start preempted).
    /// `Ok(Err(why))`: refused, nothing written.
    pub fn book(
        &mut self,
        b: &NewBooking,
        since: i64,
        check: impl FnOnce(&[Booking]) -> std::result::Result<(), String>,
    ) -> Result<std::result::Result<Booking, String>> {
        let now = self.now();
        let tx = self.conn.transaction()?;
        let others: Vec<Booking> = {
            let mut st = tx.prepare_cached(&format!("SELECT {COLUMNS} FROM bookings WHERE end_ms > ?1 AND (closed IS NULL OR closed = 'released' OR (closed = 'cancelled' AND closed_ms > start_ms)) ORDER BY start_ms, id"))?;
            let rows = st.query_map([since], row)?.collect::<rusqlite::Result<Vec<_>>>()?;
            rows
        };
        if let Err(why) = check(&others) {
            return Ok(Err(why));
        }
        tx.execute(
            "INSERT INTO bookings (uid, owner, gpus, gpu_type, start_ms, end_ms, note, created_ms) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
            params![b.uid, b.owner, b.gpus, b.gpu_type, b.start_ms, b.end_ms, b.note, now],
        )?;
        let id = tx.last_insert_rowid();
        let made = tx.query_row(&format!("SELECT {COLUMNS} FROM bookings WHERE id = ?1"), [id], row)?;
        tx.commit()?;
        Ok(Ok(made))
    }

    pub fn booking(&self, id: i64) -> Result<Option<Booking>> {
        Ok(self
            .conn
            .query_row(&format!("SELECT {COLUMNS} FROM bookings WHERE id = ?1"), [id], row)
            .optional()?)
    }

    /// Open bookings that have not ended at `now`, by start.
    pub fn open_bookings(&self, now: i64) -> Result<Vec<Booking>> {
        let mut st = self.conn.prepare_cached(&format!(
            "SELECT {COLUMNS} FROM bookings WHERE closed IS NULL AND end_ms > ?1 ORDER BY start_ms, id"
        ))?;
        let rows = st.query_map([now], row)?.collect::<rusqlite::Result<Vec<_>>>()?;
        Ok(rows)
    }

    /// Closed or ended bookings, newest start first (`gantry bookings --all`).
    pub fn past_bookings(&self, now: i64, limit: u32) -> Result<Vec<Booking>> {
        let mut st = self.conn.prepare_cached(&format!("SELECT {COLUMNS} FROM bookings WHERE closed IS NOT NULL OR end_ms <= ?1 ORDER BY start_ms DESC, id DESC LIMIT ?2"))?;
        let rows = st
            .query_map(params![now, limit], row)?
            .collect::<rusqlite::Result<Vec<_>>>()?;
        Ok(rows)
    }

    /// Close an open booking that has not ended (`Cancelled` or `Released`), with why; a release
    /// is notified to its owner in the same transaction. `false`: it was closed or over already.
    pub fn close_booking(&mut self, id: i64, how: BookingState, why: &str) -> Result<bool> {
        let now = self.now();
        let tx = self.conn.transaction()?;
        let n = tx.execute(
            "UPDATE bookings SET closed = ?2, closed_ms = ?3, closed_why = ?4 WHERE id = ?1 AND closed IS NULL AND end_ms > ?3",
            params![id, how.as_str(), now, why],
        )?;
        if n == 1 && how == BookingState::Released {
            let uid: u32 = tx.query_row("SELECT uid FROM bookings WHERE id = ?1", [id], |r| r.get(0))?;
            notify::record_in(
                &tx,
                NotifyEvent::BookingReleased,
                None,
                Some(uid),
                now,
                Some(&format!("booking {id}: {why}")),
            )?;
        }
        tx.commit()?;
        Ok(n == 1)
    }

    /// Tell the booking's owner it starts soon: a `booking_starting` notification, recorded in the
    /// same transaction as the mark that it was sent, so it goes once per booking (restarts
    /// included). False when it was sent already or the booking is closed.
    pub fn booking_starting(&mut self, id: i64, text: &str) -> Result<bool> {
        let now = self.now();
        let tx = self.conn.transaction()?;
        let n = tx.execute("UPDATE bookings SET starting_notified_ms = ?2 WHERE id = ?1 AND starting_notified_ms IS NULL AND closed IS NULL", params![id, now])?;
        if n == 1 {
            let uid: u32 = tx.query_row("SELECT uid FROM bookings WHERE id = ?1", [id], |r| r.get(0))?;
            notify::record_in(&tx, NotifyEvent::BookingStarting, None, Some(uid), now, Some(text))?;
        }
        tx.commit()?;
        Ok(n == 1)
    }

    /// Record that the booking's owner used it (first time only).
    pub fn booking_used(&mut self, id: i64) -> Result<()> {
        let now = self.now();
        self.conn.execute(
            "UPDATE bookings SET used_ms = ?2 WHERE id = ?1 AND used_ms IS NULL",
            params![id, now],
        )?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Times in the test are ms after T, a day from now (closing needs a booking not over yet).
    fn t() -> i64 {
        crate::clock::now_ms() + 86_400_000
    }
    fn new(uid: u32, start: i64, end: i64) -> NewBooking {
        NewBooking {
            uid,
            owner: format!("u{uid}"),
            gpus: 1,
            gpu_type: None,
            start_ms: t() + start,
            end_ms: t() + end,
            note: Some("demo".into()),
        }
    }

    #[test]
    fn bookings_are_checked_inserted_closed_and_never_deleted() {
        let mut s = Store::open_in_memory().unwrap();
        let a = s
            .book(&new(1000, 100, 200), 0, |o| {
                if o.is_empty() {
                    Ok(())
                } else {
                    Err("x".into())
                }
            })
            .unwrap()
            .unwrap();
        let t0 = a.start_ms - 100;
        assert_eq!(
            (a.state(t0 + 50), a.state(t0 + 150), a.state(t0 + 200)),
            (BookingState::Booked, BookingState::Active, BookingState::Ended)
        );
        // The check sees the first one and may refuse: nothing written.
        let refused = s
            .book(&new(1001, 150, 250), 0, |o| {
                if o.len() == 1 {
                    Err("clash with 1".into())
                } else {
                    Ok(())
                }
            })
            .unwrap();
        assert_eq!(refused, Err("clash with 1".into()));
        assert_eq!(s.open_bookings(0).unwrap().len(), 1);
        assert!(s
            .close_booking(a.id, BookingState::Cancelled, "cancelled by u1000")
            .unwrap());
        assert!(
            !s.close_booking(a.id, BookingState::Cancelled, "again").unwrap(),
            "closed once"
        );
        assert!(s.open_bookings(0).unwrap().is_empty());
        let kept = s.booking(a.id).unwrap().unwrap();
        assert_eq!(
            (kept.closed, kept.closed_why.as_deref(), kept.state(t0 + 150)),
            (
                Some(BookingState::Cancelled),
                Some("cancelled by u1000"),
                BookingState::Cancelled
            )
        );
        assert_eq!(s.past_bookings(0, 10).unwrap().len(), 1);
        // A cancelled booking is not shown to later checks; a released one is (it counts toward the week).
        let b = s
            .book(&new(1000, 300, 400), 0, |o| {
                if o.is_empty() {
                    Ok(())
                } else {
                    Err("saw a cancelled one".into())
                }
            })
            .unwrap()
            .unwrap();
        assert!(s
            .close_booking(b.id, BookingState::Released, "unused for 30 min")
            .unwrap());
        let seen = s
            .book(&new(1000, 500, 600), 0, |o| {
                if o.len() == 1 && o[0].closed == Some(BookingState::Released) {
                    Ok(())
                } else {
                    Err(format!("{o:?}"))
                }
            })
            .unwrap();
        assert!(seen.is_ok(), "{seen:?}");
        s.booking_used(b.id).unwrap();
        assert!(s.booking(b.id).unwrap().unwrap().used_ms.is_some());
    }
}
