-- Connection settings of the projector's writer: checkpoint (fold the WAL into the file) every
-- 256 MB of WAL rather than DuckDB's 16 MB, so that a table's last, partly filled row group is not
-- rewritten at every other batch. A crash replays at most that much WAL on the next open.
SET checkpoint_threshold = '256MB';
-- One DuckDB thread (for the whole database instance, the projector's lookups included): a batch's
-- inserts took as long with two, and the second thread cost about 15% more CPU, which the decode
-- workers beside it need (bench/projector.py).
SET threads = 1;
-- Write each full row group (122,880 rows) of a transaction to the file as soon as it fills, not
-- five at a time (DuckDB's default): behind a backlog a shared transaction rarely reaches five, and
-- every row group not written by then was compressed at COMMIT, while the decode workers had nothing
-- left to do. Written as it fills, it is compressed while they decode the batches after it.
SET write_buffer_row_group_count = 1;
