-- Whether the attached database has a table of this name in its main schema.
-- param name VARCHAR
SELECT count(*) > 0
FROM duckdb_tables()
WHERE database_name = current_database() AND schema_name = 'main' AND table_name = $name;
