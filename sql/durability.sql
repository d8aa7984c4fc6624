-- What the store can lose in a failover (docs/design.md §13), read on every
-- catalog sync: whether a commit waits for a synchronous standby
-- (synchronous_commit at on, remote_write or remote_apply, with
-- synchronous_standby_names set), the standbys streaming from this server and
-- how many of them are synchronous (0 when the role may not see them: grant
-- it pg_monitor), and the timeline, which a promoted standby raises (NULL on
-- a server in recovery, which has no current WAL position to read).
SELECT current_setting('synchronous_commit')        AS "synchronous_commit!",
       current_setting('synchronous_standby_names') AS "synchronous_standby_names!",
       (SELECT count(*) FROM pg_stat_replication)   AS "standbys!",
       (SELECT count(*) FROM pg_stat_replication
        WHERE sync_state IN ('sync', 'quorum'))    AS "synchronous_standbys!",
       CASE WHEN NOT pg_is_in_recovery() THEN
           ('x' || substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8))::bit(32)::int
       END                                          AS timeline
