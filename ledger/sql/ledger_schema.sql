-- The ledger's own table in the projection database, created by `ledger.store.ensure_schema` (never by
-- a projection migration). One row per signed digest: the stream and number it is filed under, its
-- body (canonical JSON, exactly the signed bytes), the base64 Ed25519 signature, and the packed
-- entries (60 bytes per covered event) whose SHA-256 the body states as span_hash.
CREATE TABLE IF NOT EXISTS ledger_digests (
    topic           VARCHAR NOT NULL,
    partition       INTEGER NOT NULL,
    digest_seq      BIGINT NOT NULL,
    body            VARCHAR NOT NULL,
    signature       VARCHAR NOT NULL,
    entries         BLOB NOT NULL,
    PRIMARY KEY (topic, partition, digest_seq)
);
