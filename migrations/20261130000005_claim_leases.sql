-- A claim on a quota with `max_in_flight` holds a concurrency slot like any
-- grant; the item remembers that lease so finishing the item frees the slot.
ALTER TABLE work_item ADD COLUMN slot_lease_id bigint;
