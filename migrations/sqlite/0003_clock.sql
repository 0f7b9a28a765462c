-- One clock for every statement that needs the time, read the same way on both databases:
-- `SELECT now_ms FROM clock`, epoch milliseconds.
CREATE VIEW clock AS SELECT CAST(unixepoch('subsec') * 1000 AS INTEGER) AS now_ms;
