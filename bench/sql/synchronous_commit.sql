-- Whether commits are durable on the database the bench measures: the run
-- prints it, so a table measured with synchronous_commit = off shows it.
SELECT current_setting('synchronous_commit') AS "setting!"
