-- A share stream connects: its presence row, for the first heartbeat.
INSERT INTO stream_client (flows) VALUES ($1) RETURNING id
