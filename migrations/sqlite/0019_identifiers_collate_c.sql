-- Postgres's migration 0019 makes identifiers compare byte by byte (`COLLATE "C"`).
-- SQLite compares text with BINARY, byte by byte, unless told otherwise: nothing to do.
-- The file keeps the two stores' migrations numbered alike.
SELECT 1;
