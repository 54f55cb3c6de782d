INSERT INTO field_provenance BY NAME
SELECT * REPLACE (
    CAST(value AS JSON) AS value,
    TRY_CAST(resolved_at AS TIMESTAMPTZ) AS resolved_at
)
FROM batch_field_provenance
ON CONFLICT DO NOTHING;
