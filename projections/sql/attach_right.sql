-- Attach a database read-only under the fixed name the comparison reads.
ATTACH $path AS right_db (READ_ONLY);
