-- Attach a database read-only under the fixed name the comparison reads.
ATTACH $path AS left_db (READ_ONLY);
