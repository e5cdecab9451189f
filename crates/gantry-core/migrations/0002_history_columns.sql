-- Version 2: history sorts on indexed columns instead of expressions; scheduling reads light rows.
ALTER TABLE jobs ADD COLUMN duration_ms INTEGER;        -- finished_at - started_at, set when the job ends
ALTER TABLE jobs ADD COLUMN gpu_ms INTEGER;             -- duration_ms x gpus
ALTER TABLE jobs ADD COLUMN expected_runtime_ms INTEGER;
ALTER TABLE jobs ADD COLUMN after_ids TEXT;             -- JSON array of job ids this job waits for
UPDATE jobs SET duration_ms = finished_at - started_at, gpu_ms = (finished_at - started_at) * gpus
  WHERE finished_at IS NOT NULL AND started_at IS NOT NULL;
CREATE INDEX jobs_hist_duration ON jobs(duration_ms) WHERE finished_at IS NOT NULL;
CREATE INDEX jobs_hist_gpu ON jobs(gpu_ms) WHERE finished_at IS NOT NULL;
CREATE INDEX jobs_hist_name ON jobs(name) WHERE finished_at IS NOT NULL;
CREATE INDEX jobs_hist_state ON jobs(state, finished_at DESC) WHERE finished_at IS NOT NULL;
CREATE INDEX jobs_queued ON jobs(priority DESC, submitted_at) WHERE state = 'queued';
