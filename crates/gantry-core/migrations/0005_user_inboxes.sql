-- Version 5: users who set up their drop folder with `gantry inbox init`; the system engine watches
-- `~/<inbox_path>` of each (group members need no row: the group says so).
CREATE TABLE user_inboxes (
    uid INTEGER PRIMARY KEY,
    registered_at INTEGER NOT NULL
);
