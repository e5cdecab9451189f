-- Version 16: what runs achieved (issue 30). Each job's metric series across its attempts (the
-- summary a comparison reads without touching points), their points (thinned to the lab's bound),
-- params and tags, how reading went, and where each reader got to in each file (committed with the
-- points it read, so a restart neither loses nor repeats a point).
CREATE TABLE metric_series (
    id          INTEGER PRIMARY KEY,
    job_id      INTEGER NOT NULL REFERENCES jobs(id) ON DELETE CASCADE,
    name        TEXT    NOT NULL,
    source      TEXT    NOT NULL,
    goal        TEXT    NOT NULL,
    -- NULL: NaN (SQLite stores NaN as NULL); infinities are stored as themselves.
    last        REAL,
    last_step   INTEGER NOT NULL,
    last_attempt INTEGER NOT NULL,
    best        REAL,
    best_step   INTEGER,
    -- Points logged in all; points stored now; the next point's sequence number.
    count       INTEGER NOT NULL,
    stored      INTEGER NOT NULL,
    next_seq    INTEGER NOT NULL,
    UNIQUE (job_id, name)
);

CREATE TABLE metric_points (
    series_id INTEGER NOT NULL REFERENCES metric_series(id) ON DELETE CASCADE,
    seq       INTEGER NOT NULL,
    attempt   INTEGER NOT NULL,
    step      INTEGER NOT NULL,
    at        INTEGER NOT NULL,
    value     REAL,
    PRIMARY KEY (series_id, seq)
) WITHOUT ROWID;

CREATE TABLE job_params (
    job_id INTEGER NOT NULL REFERENCES jobs(id) ON DELETE CASCADE,
    key    TEXT    NOT NULL,
    value  TEXT    NOT NULL,
    source TEXT    NOT NULL,
    PRIMARY KEY (job_id, key)
) WITHOUT ROWID;

CREATE TABLE job_tags (
    job_id INTEGER NOT NULL REFERENCES jobs(id) ON DELETE CASCADE,
    key    TEXT    NOT NULL,
    value  TEXT    NOT NULL,
    PRIMARY KEY (job_id, key)
) WITHOUT ROWID;

CREATE TABLE job_ingest (
    job_id         INTEGER PRIMARY KEY REFERENCES jobs(id) ON DELETE CASCADE,
    garbage_lines  INTEGER NOT NULL DEFAULT 0,
    bad_records    INTEGER NOT NULL DEFAULT 0,
    bytes_read     INTEGER NOT NULL DEFAULT 0,
    bytes_limit    INTEGER NOT NULL DEFAULT 0,
    dropped_points INTEGER NOT NULL DEFAULT 0,
    dropped_names  INTEGER NOT NULL DEFAULT 0,
    -- JSON array of notes, one per kind of problem.
    notes          TEXT    NOT NULL DEFAULT '[]'
);

-- `key`: the file (`metrics`, `tb:<file name>`); `offset`: bytes consumed; `lines`: lines consumed.
CREATE TABLE metric_cursors (
    job_id  INTEGER NOT NULL REFERENCES jobs(id) ON DELETE CASCADE,
    attempt INTEGER NOT NULL,
    key     TEXT    NOT NULL,
    offset  INTEGER NOT NULL,
    lines   INTEGER NOT NULL,
    PRIMARY KEY (job_id, attempt, key)
) WITHOUT ROWID;
