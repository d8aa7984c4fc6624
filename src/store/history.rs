//! History kept for a while, then pruned: hourly windows, decision tallies and
//! the catalog audit trail.

use std::time::Duration;

use chrono::{DateTime, Utc};

use super::Store;

impl Store {
    /// Deletes up to `batch` windows that ended longer than `retention` ago; how many.
    pub async fn prune_windows(&self, retention: Duration, batch: i64) -> Result<u64, sqlx::Error> {
        let pruned = sqlx::query_file!(
            "sql/history_prune_windows.sql",
            retention.as_secs_f64(),
            batch
        )
        .execute(self.pool())
        .await?;
        Ok(pruned.rows_affected())
    }

    /// Deletes up to `batch` tallies of windows that ended longer than
    /// `retention` ago; how many.
    pub async fn prune_tallies(&self, retention: Duration, batch: i64) -> Result<u64, sqlx::Error> {
        let pruned = sqlx::query_file!(
            "sql/history_prune_tallies.sql",
            retention.as_secs_f64(),
            batch
        )
        .execute(self.pool())
        .await?;
        Ok(pruned.rows_affected())
    }

    /// Deletes up to `batch` audit entries older than `retention`; how many.
    pub async fn prune_audit(&self, retention: Duration, batch: i64) -> Result<u64, sqlx::Error> {
        let pruned = sqlx::query_file!("sql/audit_prune.sql", retention.as_secs_f64(), batch)
            .execute(self.pool())
            .await?;
        Ok(pruned.rows_affected())
    }

    /// The oldest window whose tallies are still kept (of `quota`, or of any).
    pub async fn oldest_tally(
        &self,
        quota: Option<&str>,
    ) -> Result<Option<DateTime<Utc>>, sqlx::Error> {
        let row = sqlx::query_file!("sql/report_history.sql", quota)
            .fetch_one(self.pool())
            .await?;
        Ok(row.oldest_tally)
    }
}
