-- Version 7: the Slurm backend. An attempt submitted to Slurm is tracked by its Slurm job id; NULL
-- while it is being submitted (the intent: on restart, Gantry looks for its marker in Slurm before
-- submitting again) and for attempts run by the Docker backend.
ALTER TABLE attempts ADD COLUMN slurm_job_id INTEGER;
-- The task of a Slurm job array the attempt runs as (a `matrix` submitted as one array); NULL otherwise.
ALTER TABLE attempts ADD COLUMN slurm_array_task INTEGER;
