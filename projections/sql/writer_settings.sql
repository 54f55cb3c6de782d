-- Connection settings of the projector's writer: checkpoint (fold the WAL into the file) every
-- 256 MB of WAL rather than DuckDB's 16 MB, so that a table's last, partly filled row group is not
-- rewritten at every other batch. A crash replays at most that much WAL on the next open.
SET checkpoint_threshold = '256MB';
-- One DuckDB thread (for the whole database instance, the projector's lookups included): a batch's
-- inserts took as long with two, and the second thread cost about 15% more CPU, which the decode
-- workers beside it need (bench/projector.py).
SET threads = 1;
