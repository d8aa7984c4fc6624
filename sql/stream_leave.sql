-- A share stream disconnected: it stops counting at once.
DELETE FROM stream_client WHERE id = $1
