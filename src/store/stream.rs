//! Share-stream presence (design.md §10): which clients are connected, on any
//! replica, and what the quotas their flows spend allow now.

use super::Store;

/// One quota as a share stream reports it.
#[derive(Clone, Debug, PartialEq, serde::Serialize, utoipa::ToSchema)]
pub struct QuotaShare {
    pub quota: String,
    /// Tokens per second, the adaptive factor applied; `null` without cadence.
    pub rate: Option<f64>,
    /// Bucket size, the adaptive factor applied; `null` without cadence.
    pub burst: Option<f64>,
    /// Live share-stream clients of this quota across replicas: each one's
    /// share is `rate / clients`.
    pub clients: i64,
}

impl Store {
    pub async fn join_stream(&self, flows: &[String]) -> Result<i64, sqlx::Error> {
        sqlx::query_file_scalar!("sql/stream_join.sql", flows)
            .fetch_one(self.pool())
            .await
    }

    pub async fn beat_stream(&self, id: i64, flows: &[String]) -> Result<(), sqlx::Error> {
        sqlx::query_file!("sql/stream_beat.sql", id, flows)
            .execute(self.pool())
            .await?;
        Ok(())
    }

    pub async fn leave_stream(&self, id: i64) -> Result<(), sqlx::Error> {
        sqlx::query_file!("sql/stream_leave.sql", id)
            .execute(self.pool())
            .await?;
        Ok(())
    }

    /// The quotas `flows` spend, by name.
    pub async fn stream_shares(&self, flows: &[String]) -> Result<Vec<QuotaShare>, sqlx::Error> {
        let rows = sqlx::query_file!("sql/stream_shares.sql", flows)
            .fetch_all(self.pool())
            .await?;
        Ok(rows
            .into_iter()
            .map(|row| QuotaShare {
                quota: row.quota,
                rate: row.effective_rate,
                burst: row.effective_burst,
                clients: row.clients,
            })
            .collect())
    }
}
