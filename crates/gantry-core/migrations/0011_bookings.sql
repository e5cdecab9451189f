-- Version 11: GPU bookings (`gantry book`). A booking is never deleted: cancelling or releasing it
-- (a no-show) closes it, with when and why, so `gantry bookings --all` keeps its history. Its
-- Booked/Active/Ended state follows from its times while it is open.
CREATE TABLE bookings (
    id          INTEGER PRIMARY KEY AUTOINCREMENT,
    uid         INTEGER NOT NULL,
    owner       TEXT NOT NULL,
    gpus        INTEGER NOT NULL CHECK (gpus > 0),
    gpu_type    TEXT,
    start_ms    INTEGER NOT NULL,
    end_ms      INTEGER NOT NULL CHECK (end_ms > start_ms),
    note        TEXT,
    created_ms  INTEGER NOT NULL,
    used_ms     INTEGER,                 -- when its owner's job or session first ran on its GPUs
    closed      TEXT CHECK (closed IN ('cancelled', 'released')),
    closed_ms   INTEGER,
    closed_why  TEXT
);
CREATE INDEX bookings_open ON bookings(end_ms) WHERE closed IS NULL;
CREATE INDEX bookings_owner ON bookings(uid, start_ms);
