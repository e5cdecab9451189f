-- Version 9: preemption. An attempt may end `preempted` (the table is rebuilt: SQLite cannot
-- change a CHECK constraint in place). Before Gantry signals an attempt it preempts, it writes why
-- (for which job, the reason shown): an engine killed mid-preemption then finishes it on restart
-- (the attempt ends `preempted` and the job is queued again, whatever the container's exit code), so
-- the job is never lost (a checkpointing job that exits 0 is not "succeeded") and never runs twice.
CREATE TABLE attempts_v9 (
    id               INTEGER PRIMARY KEY AUTOINCREMENT,
    job_id           INTEGER NOT NULL REFERENCES jobs(id),
    n                INTEGER NOT NULL,
    container_id     TEXT,
    gpus             TEXT NOT NULL,          -- JSON array of GPU indexes
    gpu_uuids        TEXT NOT NULL,          -- JSON array of GPU UUIDs
    started_at       INTEGER NOT NULL,
    ended_at         INTEGER,
    exit_code        INTEGER,
    reason           TEXT CHECK (reason IN ('exited','oom','timeout','cancelled','lost','engine_error','preempted')),
    message          TEXT,
    slurm_job_id     INTEGER,
    slurm_array_task INTEGER,
    preempt_for      INTEGER,                -- the job it is (being) preempted for
    preempt_why      TEXT,                   -- "job 41 (alice's 4-GPU job waited 3h)"
    UNIQUE (job_id, n)
);
INSERT INTO attempts_v9 (id, job_id, n, container_id, gpus, gpu_uuids, started_at, ended_at, exit_code, reason, message, slurm_job_id, slurm_array_task)
    SELECT id, job_id, n, container_id, gpus, gpu_uuids, started_at, ended_at, exit_code, reason, message, slurm_job_id, slurm_array_task FROM attempts;
DROP TABLE attempts;
ALTER TABLE attempts_v9 RENAME TO attempts;
CREATE INDEX attempts_open ON attempts(job_id) WHERE ended_at IS NULL;
CREATE INDEX attempts_preempted ON attempts(job_id, reason);
CREATE INDEX attempts_preempt_for ON attempts(preempt_for) WHERE preempt_for IS NOT NULL;
