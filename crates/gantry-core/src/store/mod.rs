//! The durable queue: SQLite in WAL mode, versioned migrations, every state change in one
//! transaction together with its event-log row.

use std::path::Path;

use rusqlite::{params, Connection, OptionalExtension};

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("database error: {0}")]
    Sqlite(#[from] rusqlite::Error),
    #[error("stored job data is corrupt: {0}")]
    Json(#[from] serde_json::Error),
    #[error("cannot open the database file: {0}")]
    Io(std::io::Error),
    #[error("the database was written by a newer Gantry (schema {found}, this build knows {known}); upgrade Gantry")]
    TooNew { found: i64, known: i64 },
}

pub type Result<T> = std::result::Result<T, StoreError>;

/// Migrations, applied in order; `PRAGMA user_version` records how many ran.
const MIGRATIONS: &[&str] = &[
    include_str!("../../migrations/0001_init.sql"),
    include_str!("../../migrations/0002_history_columns.sql"),
    include_str!("../../migrations/0003_identity.sql"),
    include_str!("../../migrations/0004_hold.sql"),
    include_str!("../../migrations/0005_user_inboxes.sql"),
    include_str!("../../migrations/0006_history_fast.sql"),
    include_str!("../../migrations/0007_slurm.sql"),
    include_str!("../../migrations/0008_submit_keys.sql"),
    include_str!("../../migrations/0009_notify.sql"),
    include_str!("../../migrations/0010_preemption.sql"),
    include_str!("../../migrations/0011_bookings.sql"),
    include_str!("../../migrations/0012_booking_starting.sql"),
    include_str!("../../migrations/0016_results.sql"),
    include_str!("../../migrations/0017_efficiency.sql"),
    include_str!("../../migrations/0019_preempt_signalled.sql"),
];

/// Filters matching more runs than this walk the sort key's index (filtering on the way) instead of
/// collecting and sorting every match: past a few thousand matches the walk is the cheaper plan.
const BROAD_FILTER: i64 = 2000;
/// A text search with at most this many candidates in the trigram index is counted through it;
/// with more, by testing each finished run (about as fast at 10k, faster above).
const FTS_CANDIDATES_MAX: i64 = 10_000;
/// How many filters keep a cached count (`history_counts`; every one costs a little on each job end).
const CACHED_COUNTS: i64 = 64;

mod bookings;
mod efficiency;
mod history;
mod model;
pub mod notify;
mod queue;
mod results;
mod stats;
pub use bookings::*;
pub use model::*;
pub use queue::*;
pub use results::*;
pub use stats::*;

pub struct Store {
    conn: Connection,
    /// The queue in memory, when this connection keeps it (see [`Store::track_queue`]).
    queue: Option<SharedQueue>,
    /// What "now" is for the timestamps this store writes: the engine's clock.
    clock: std::sync::Arc<dyn crate::clock::Clock>,
}

pub use crate::clock::now_ms;

impl Store {
    /// Open (or create) the database, readable and writable by the engine's user only: it holds
    /// every user's specs and environment.
    pub fn open(path: &Path) -> Result<Store> {
        use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
        let f = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .mode(0o600)
            .open(path)
            .map_err(StoreError::Io)?;
        f.set_permissions(std::fs::Permissions::from_mode(0o600))
            .map_err(StoreError::Io)?;
        let conn = Connection::open(path)?;
        let store = Self::init(conn)?;
        // SQLite creates -wal/-shm with the database's mode; tighten ones left by older versions.
        for ext in ["-wal", "-shm"] {
            let mut p = path.as_os_str().to_owned();
            p.push(ext);
            let _ = std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o600));
        }
        Ok(store)
    }

    pub fn open_in_memory() -> Result<Store> {
        Self::init(Connection::open_in_memory()?)
    }

    fn init(mut conn: Connection) -> Result<Store> {
        conn.pragma_update(None, "journal_mode", "WAL")?;
        conn.pragma_update(None, "synchronous", "NORMAL")?;
        conn.pragma_update(None, "foreign_keys", "ON")?;
        conn.busy_timeout(std::time::Duration::from_secs(5))?;
        let version: i64 = conn.pragma_query_value(None, "user_version", |r| r.get(0))?;
        let known = MIGRATIONS.len() as i64;
        if version > known {
            return Err(StoreError::TooNew { found: version, known });
        }
        for (i, sql) in MIGRATIONS.iter().enumerate().skip(version as usize) {
            let tx = conn.transaction()?;
            tx.execute_batch(sql)?;
            tx.pragma_update(None, "user_version", (i + 1) as i64)?;
            tx.commit()?;
        }
        // Refresh the query planner's statistics when they are stale (cheap when they are not).
        conn.execute_batch("PRAGMA optimize=0x10002;")?;
        Ok(Store {
            conn,
            queue: None,
            clock: crate::clock::system(),
        })
    }

    /// Timestamps written from now on read `clock` (the engine's: paused tokio time in its tests).
    pub fn set_clock(&mut self, clock: std::sync::Arc<dyn crate::clock::Clock>) {
        self.clock = clock;
    }

    pub(super) fn now(&self) -> i64 {
        self.clock.now_ms()
    }

    fn event(
        tx: &Connection,
        job_id: i64,
        at: i64,
        from: Option<JobState>,
        to: JobState,
        msg: Option<&str>,
    ) -> Result<()> {
        tx.prepare_cached(
            "INSERT INTO events (job_id, at, from_state, to_state, message) VALUES (?1, ?2, ?3, ?4, ?5)",
        )?
        .execute(params![job_id, at, from.map(|s| s.as_str()), to.as_str(), msg])?;
        // The notification of this change, in the same transaction (the outbox).
        notify::on_transition(tx, job_id, at, from, to, msg)
    }

    pub fn meta(&self, key: &str) -> Result<Option<String>> {
        Ok(self
            .conn
            .query_row("SELECT value FROM meta WHERE key = ?1", [key], |r| r.get(0))
            .optional()?)
    }

    pub fn set_meta(&mut self, key: &str, value: &str) -> Result<()> {
        self.conn.execute(
            "INSERT OR REPLACE INTO meta (key, value) VALUES (?1, ?2)",
            params![key, value],
        )?;
        Ok(())
    }

    /// The highest job id ever handed out by this database (0 if none).
    pub fn job_id_high_water(&self) -> Result<i64> {
        let seq: Option<i64> = self
            .conn
            .query_row("SELECT seq FROM sqlite_sequence WHERE name = 'jobs'", [], |r| r.get(0))
            .optional()?;
        let max: Option<i64> = self.conn.query_row("SELECT MAX(id) FROM jobs", [], |r| r.get(0))?;
        Ok(seq.unwrap_or(0).max(max.unwrap_or(0)))
    }

    /// Make the next job id larger than `floor`: ids are never reused, even after a lost WAL.
    pub fn raise_job_ids_above(&mut self, floor: i64) -> Result<()> {
        if self.job_id_high_water()? >= floor {
            return Ok(());
        }
        let tx = self.conn.transaction()?;
        let n = tx.execute("UPDATE sqlite_sequence SET seq = ?1 WHERE name = 'jobs'", [floor])?;
        if n == 0 {
            tx.execute("INSERT INTO sqlite_sequence (name, seq) VALUES ('jobs', ?1)", [floor])?;
        }
        tx.commit()?;
        Ok(())
    }

    /// Users who set up their drop folder with `gantry inbox init`.
    pub fn user_inboxes(&self) -> Result<Vec<u32>> {
        let mut q = self.conn.prepare("SELECT uid FROM user_inboxes ORDER BY uid")?;
        let uids = q.query_map([], |r| r.get(0))?.collect::<rusqlite::Result<_>>()?;
        Ok(uids)
    }

    pub fn add_user_inbox(&mut self, uid: u32) -> Result<()> {
        self.conn.execute(
            "INSERT OR IGNORE INTO user_inboxes (uid, registered_at) VALUES (?1, ?2)",
            params![uid, self.now()],
        )?;
        Ok(())
    }

    /// Run `f` with fsync off (bulk loading for benchmarks and imports), then restore durability.
    pub fn bulk<T>(&mut self, f: impl FnOnce(&mut Store) -> T) -> Result<T> {
        self.conn.pragma_update(None, "synchronous", "OFF")?;
        let out = f(self);
        self.conn.pragma_update(None, "synchronous", "NORMAL")?;
        Ok(out)
    }
}
#[cfg(test)]
mod tests;
