-- 009: every start of a projector on this database, for the operator's restart count
-- (`preflight_projector_starts_total`). One row per start, written when the database is opened; not a
-- projection of the log (replay and compare_projections leave it out).
CREATE TABLE projector_starts (
    projection      VARCHAR NOT NULL,
    started_at      TIMESTAMPTZ NOT NULL DEFAULT now(),
    pid             INTEGER
);
