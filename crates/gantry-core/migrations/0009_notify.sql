-- Version 9: notifications (issue 20). A durable outbox: the event is written in the transaction of
-- the state change it reports (`store::notify::on_transition`), so a crash never keeps one without
-- the other; the engine's delivery task then expands it into one delivery per target and sends
-- each, marking it delivered after the send succeeded.

-- Who wants to hear about what. `uid` NULL: one of the lab's webhooks (`[notify] webhooks`),
-- written from the lab config on start and reload.
CREATE TABLE notify_subs (
    id          INTEGER PRIMARY KEY AUTOINCREMENT,
    uid         INTEGER,
    owner       TEXT,
    kind        TEXT    NOT NULL CHECK (kind IN ('email', 'webhook')),
    target      TEXT    NOT NULL,
    events      TEXT    NOT NULL,   -- JSON array of event names
    job_id      INTEGER,            -- only this job's events
    created_at  INTEGER NOT NULL
);
CREATE INDEX notify_subs_by_uid ON notify_subs(uid);

-- What happened. Only written while someone (the job's owner, or the lab) has a subscription.
CREATE TABLE notify_events (
    id          INTEGER PRIMARY KEY AUTOINCREMENT,
    kind        TEXT    NOT NULL,
    job_id      INTEGER,
    uid         INTEGER,            -- the job's owner; NULL: the lab's (e.g. a store problem)
    at          INTEGER NOT NULL,
    text        TEXT,
    expanded    INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX notify_events_new ON notify_events(id) WHERE expanded = 0;

-- One event to one target. `payload` is built once, so every try sends the same body and id.
CREATE TABLE notify_deliveries (
    id          INTEGER PRIMARY KEY AUTOINCREMENT,
    event_id    INTEGER NOT NULL REFERENCES notify_events(id),
    sub_id      INTEGER NOT NULL,   -- the subscription it was for (it may be gone since)
    uid         INTEGER,            -- whose (NULL: the lab's)
    kind        TEXT    NOT NULL,
    target      TEXT    NOT NULL,
    payload     TEXT    NOT NULL,
    state       TEXT    NOT NULL CHECK (state IN ('pending', 'delivered', 'failed', 'dropped')),
    tries       INTEGER NOT NULL DEFAULT 0,
    next_at     INTEGER NOT NULL,
    last_error  TEXT,
    created_at  INTEGER NOT NULL,
    done_at     INTEGER,
    UNIQUE (event_id, sub_id)
);
CREATE INDEX notify_due ON notify_deliveries(next_at) WHERE state = 'pending';
CREATE INDEX notify_by_uid ON notify_deliveries(uid, id);
CREATE INDEX notify_by_age ON notify_deliveries(created_at);
