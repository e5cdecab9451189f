-- Gantry store, version 1. Times are milliseconds since the Unix epoch (UTC).
CREATE TABLE jobs (
    id            INTEGER PRIMARY KEY AUTOINCREMENT,
    name          TEXT    NOT NULL,
    owner_uid     INTEGER NOT NULL,
    owner_gid     INTEGER NOT NULL,
    owner         TEXT    NOT NULL,
    image         TEXT    NOT NULL,
    gpus          INTEGER NOT NULL,
    gpu_memory    INTEGER,
    priority      INTEGER NOT NULL DEFAULT 0,
    retries       INTEGER NOT NULL DEFAULT 0,
    timeout_ms    INTEGER,
    spec_json     TEXT    NOT NULL,
    state         TEXT    NOT NULL CHECK (state IN ('queued','starting','running','succeeded','failed','cancelled','timed_out')),
    source        TEXT    NOT NULL,
    source_key    TEXT UNIQUE,
    submitted_at  INTEGER NOT NULL,
    not_before    INTEGER,
    started_at    INTEGER,
    finished_at   INTEGER,
    exit_code     INTEGER,
    attempts      INTEGER NOT NULL DEFAULT 0,
    cancel_requested INTEGER NOT NULL DEFAULT 0,
    message       TEXT
);
CREATE INDEX jobs_active ON jobs(state) WHERE state IN ('queued','starting','running');
CREATE INDEX jobs_finished ON jobs(finished_at DESC) WHERE finished_at IS NOT NULL;
CREATE INDEX jobs_owner ON jobs(owner, finished_at DESC);

CREATE TABLE attempts (
    id            INTEGER PRIMARY KEY AUTOINCREMENT,
    job_id        INTEGER NOT NULL REFERENCES jobs(id),
    n             INTEGER NOT NULL,
    container_id  TEXT,
    gpus          TEXT NOT NULL,          -- JSON array of GPU indexes
    gpu_uuids     TEXT NOT NULL,          -- JSON array of GPU UUIDs
    started_at    INTEGER NOT NULL,
    ended_at      INTEGER,
    exit_code     INTEGER,
    reason        TEXT CHECK (reason IN ('exited','oom','timeout','cancelled','lost','engine_error')),
    message       TEXT,
    UNIQUE (job_id, n)
);
CREATE INDEX attempts_open ON attempts(job_id) WHERE ended_at IS NULL;

CREATE TABLE events (
    id         INTEGER PRIMARY KEY AUTOINCREMENT,
    job_id     INTEGER NOT NULL REFERENCES jobs(id),
    at         INTEGER NOT NULL,
    from_state TEXT,
    to_state   TEXT NOT NULL,
    message    TEXT
);
CREATE INDEX events_job ON events(job_id, id);

-- Per-minute GPU aggregates for history charts.
CREATE TABLE gpu_minutes (
    gpu_index   INTEGER NOT NULL,
    minute      INTEGER NOT NULL,   -- ms of the minute start
    util_avg    REAL    NOT NULL,
    util_max    INTEGER NOT NULL,
    mem_used_avg INTEGER NOT NULL,
    mem_total   INTEGER NOT NULL,
    PRIMARY KEY (gpu_index, minute)
) WITHOUT ROWID;
