SELECT count(*) FROM projector_starts WHERE projection = $projection;
