-- Version 6: history at 100k runs. The text search uses a trigram index; each sort key gets an
-- index that also holds every filter column, so a broad filter walks the sort order without reading
-- the (wide) job rows; counts per filter are kept up to date by triggers.

-- Substring search on the name and image of finished runs (the trigram index answers LIKE '%...%'
-- candidates). Only finished runs: a submit does not pay for it.
CREATE VIRTUAL TABLE jobs_fts USING fts5(name, image, content='jobs', content_rowid='id', tokenize='trigram');
INSERT INTO jobs_fts(rowid, name, image) SELECT id, name, image FROM jobs WHERE finished_at IS NOT NULL;
CREATE TRIGGER jobs_fts_insert AFTER INSERT ON jobs WHEN NEW.finished_at IS NOT NULL BEGIN
    INSERT INTO jobs_fts(rowid, name, image) VALUES (NEW.id, NEW.name, NEW.image);
END;
CREATE TRIGGER jobs_fts_delete AFTER DELETE ON jobs WHEN OLD.finished_at IS NOT NULL BEGIN
    INSERT INTO jobs_fts(jobs_fts, rowid, name, image) VALUES ('delete', OLD.id, OLD.name, OLD.image);
END;
CREATE TRIGGER jobs_fts_update AFTER UPDATE OF finished_at, name, image ON jobs
WHEN OLD.finished_at IS NOT NULL OR NEW.finished_at IS NOT NULL BEGIN
    INSERT INTO jobs_fts(jobs_fts, rowid, name, image) SELECT 'delete', OLD.id, OLD.name, OLD.image WHERE OLD.finished_at IS NOT NULL;
    INSERT INTO jobs_fts(rowid, name, image) SELECT NEW.id, NEW.name, NEW.image WHERE NEW.finished_at IS NOT NULL;
END;

-- One covering index per sort key: (key, id) orders a page; the rest answers every filter.
DROP INDEX jobs_finished;
DROP INDEX jobs_hist_duration;
DROP INDEX jobs_hist_gpu;
DROP INDEX jobs_hist_name;
CREATE INDEX jobs_hs_finished ON jobs(finished_at, id, state, owner, image, name) WHERE finished_at IS NOT NULL;
CREATE INDEX jobs_hs_started ON jobs(started_at, id, state, owner, finished_at, image, name) WHERE finished_at IS NOT NULL;
CREATE INDEX jobs_hs_duration ON jobs(duration_ms, id, state, owner, finished_at, image, name) WHERE finished_at IS NOT NULL;
CREATE INDEX jobs_hs_gpu ON jobs(gpu_ms, id, state, owner, finished_at, image, name) WHERE finished_at IS NOT NULL;
CREATE INDEX jobs_hs_name ON jobs(name, id, state, owner, finished_at, image) WHERE finished_at IS NOT NULL;
CREATE INDEX jobs_hs_owner ON jobs(owner, id, state, finished_at, image, name) WHERE finished_at IS NOT NULL;
CREATE INDEX jobs_hs_exit ON jobs(exit_code, id, state, owner, finished_at, image, name) WHERE finished_at IS NOT NULL;
CREATE INDEX jobs_hs_id ON jobs(id, state, owner, finished_at, image, name) WHERE finished_at IS NOT NULL;
CREATE INDEX jobs_hist_image ON jobs(image, finished_at) WHERE finished_at IS NOT NULL;

-- Counts per filter (the history's "N runs"). A row is added on first use (the newest 64 are kept);
-- the triggers keep each exact.
-- `text` is the LIKE pattern of the text filter.
CREATE TABLE history_counts (
    key      TEXT PRIMARY KEY,
    owner    TEXT,
    state    TEXT,
    since    INTEGER,
    until    INTEGER,
    image    TEXT,
    text     TEXT,
    n        INTEGER NOT NULL
);
CREATE TRIGGER history_counts_insert AFTER INSERT ON jobs WHEN NEW.finished_at IS NOT NULL BEGIN
    UPDATE history_counts SET n = n + 1
    WHERE (owner IS NULL OR owner = NEW.owner) AND (state IS NULL OR state = NEW.state)
      AND (since IS NULL OR NEW.finished_at >= since) AND (until IS NULL OR NEW.finished_at < until)
      AND (image IS NULL OR image = NEW.image)
      AND (text IS NULL OR NEW.name LIKE text ESCAPE '\' OR NEW.image LIKE text ESCAPE '\');
END;
CREATE TRIGGER history_counts_delete AFTER DELETE ON jobs WHEN OLD.finished_at IS NOT NULL BEGIN
    UPDATE history_counts SET n = n - 1
    WHERE (owner IS NULL OR owner = OLD.owner) AND (state IS NULL OR state = OLD.state)
      AND (since IS NULL OR OLD.finished_at >= since) AND (until IS NULL OR OLD.finished_at < until)
      AND (image IS NULL OR image = OLD.image)
      AND (text IS NULL OR OLD.name LIKE text ESCAPE '\' OR OLD.image LIKE text ESCAPE '\');
END;
-- An update is a delete of the old row and an insert of the new one, for the rows that were or are history.
CREATE TRIGGER history_counts_update AFTER UPDATE OF finished_at, state, owner, image, name ON jobs
WHEN OLD.finished_at IS NOT NULL OR NEW.finished_at IS NOT NULL BEGIN
    UPDATE history_counts SET n = n - 1
    WHERE OLD.finished_at IS NOT NULL
      AND (owner IS NULL OR owner = OLD.owner) AND (state IS NULL OR state = OLD.state)
      AND (since IS NULL OR OLD.finished_at >= since) AND (until IS NULL OR OLD.finished_at < until)
      AND (image IS NULL OR image = OLD.image)
      AND (text IS NULL OR OLD.name LIKE text ESCAPE '\' OR OLD.image LIKE text ESCAPE '\');
    UPDATE history_counts SET n = n + 1
    WHERE NEW.finished_at IS NOT NULL
      AND (owner IS NULL OR owner = NEW.owner) AND (state IS NULL OR state = NEW.state)
      AND (since IS NULL OR NEW.finished_at >= since) AND (until IS NULL OR NEW.finished_at < until)
      AND (image IS NULL OR image = NEW.image)
      AND (text IS NULL OR NEW.name LIKE text ESCAPE '\' OR NEW.image LIKE text ESCAPE '\');
END;
