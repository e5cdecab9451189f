-- Version 19: when a preempted attempt was sent its checkpoint signal. Written before the signal, so
-- an engine killed mid-preemption does not send it again on restart: it waits out what is left of
-- the grace, then stops the container (the job saves once, not twice).
ALTER TABLE attempts ADD COLUMN preempt_signalled_ms INTEGER;
