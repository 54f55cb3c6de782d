SELECT count(*) FROM information_schema.tables
WHERE table_name = 'schema_migrations' AND table_schema = 'main' AND table_catalog = current_database();
