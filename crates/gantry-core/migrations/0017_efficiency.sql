-- Version 17 (issue 30 item 3): how well each attempt used what it held, measured by the engine
-- while it ran (cgroup CPU time and peak RAM, the 1 Hz GPU samples), saved every few seconds and
-- at its end; and the GPU memory each job shape was stopped for using, kept across restarts.
CREATE TABLE attempt_efficiency (
    attempt_id      INTEGER PRIMARY KEY REFERENCES attempts(id),
    job_id          INTEGER NOT NULL REFERENCES jobs(id),
    cpus_milli      INTEGER NOT NULL,   -- CPUs held (its limit), thousandths
    ram_held        INTEGER,            -- bytes, its memory limit
    cpu_ns          INTEGER,            -- CPU time of its container (cgroup), at the last sample
    cpu_wall_ms     INTEGER,            -- from its start to that sample
    ram_peak        INTEGER,            -- bytes, the cgroup's peak
    gpus            INTEGER NOT NULL DEFAULT 0,
    gpu_util_sum    REAL NOT NULL DEFAULT 0,   -- sum over samples of the mean util of its GPUs (0..1)
    gpu_samples     INTEGER NOT NULL DEFAULT 0,
    gpu_shared      INTEGER NOT NULL DEFAULT 0, -- samples in which one of its GPUs ran another job too
    gpu_memory_peak INTEGER,            -- bytes its processes held on one GPU, at most
    gpu_memory_simulated INTEGER NOT NULL DEFAULT 0, -- 1: a simulated GPU's figure (its declaration)
    gpu_memory_total INTEGER            -- bytes of one of its GPUs
);
CREATE INDEX attempt_efficiency_job ON attempt_efficiency(job_id);

CREATE TABLE learned_gpu_memory (
    shape TEXT PRIMARY KEY,   -- the job shape (estimate::JobKey as JSON): owner, name, image, GPUs, memory
    bytes INTEGER NOT NULL,
    at    INTEGER NOT NULL
);
