-- Version 4: `gantry hold ID` keeps a queued job from starting until `gantry release ID`.
ALTER TABLE jobs ADD COLUMN held INTEGER NOT NULL DEFAULT 0;
