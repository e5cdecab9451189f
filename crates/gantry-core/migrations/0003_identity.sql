-- Version 3: the database's own identity. `db_uid` is random per database: it names log files and
-- containers, so a lost or replaced database never shows an old job's output or container under a new job.
CREATE TABLE meta (
    key   TEXT PRIMARY KEY,
    value TEXT NOT NULL
) WITHOUT ROWID;
INSERT INTO meta (key, value) VALUES ('db_uid', lower(hex(randomblob(6))));
-- Per-user queue caps count queued jobs by owner.
CREATE INDEX jobs_queued_owner ON jobs(owner_uid) WHERE state = 'queued';
