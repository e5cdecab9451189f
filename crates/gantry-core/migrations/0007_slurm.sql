-- Version 7: the Slurm backend. An attempt submitted to Slurm is tracked by its Slurm job id; NULL
-- while it is being submitted (the intent: on restart, Gantry looks for its marker in Slurm before
-- submitting again) and for attempts run by the Docker backend.
ALTER TABLE attempts ADD COLUMN slurm_job_id INTEGER;
