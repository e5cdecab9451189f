-- Version 8: idempotency keys of submits (`SubmitRequest.idempotency_key`). A client whose submit
-- lost its answer (the engine crashed after the commit) sends it again with the same key and gets
-- the jobs of the first try, never a second copy. A key belongs to the uid that sent it: another
-- user's same key finds nothing and blocks nothing. Kept a day (`SUBMIT_KEY_TTL`), at most
-- `SUBMIT_KEYS_PER_USER` per uid (the oldest go first). Written in the transaction of the job it
-- answers with, so a crash never keeps one without the other.
CREATE TABLE submit_keys (
    uid         INTEGER NOT NULL,
    key         TEXT    NOT NULL,
    -- What was submitted (file name, base dir, text): the same key with another spec is refused.
    fingerprint TEXT    NOT NULL,
    job_ids     TEXT    NOT NULL,   -- JSON array, in order (a `matrix` queues several)
    created_at  INTEGER NOT NULL,
    PRIMARY KEY (uid, key)
);
CREATE INDEX submit_keys_by_user ON submit_keys(uid, created_at);
CREATE INDEX submit_keys_by_age ON submit_keys(created_at);
