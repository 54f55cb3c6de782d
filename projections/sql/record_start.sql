-- A projector starts on this database (see migration 009); then how many starts its projection has had.
INSERT INTO projector_starts (projection, pid) VALUES ($projection, $pid);
