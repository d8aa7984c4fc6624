//! Catalog administration and window inspection.

use chrono::{DateTime, Utc};
use serde::Serialize;
use utoipa::ToSchema;

use super::Store;
use crate::catalog::Mode;

#[derive(Clone, Debug, Serialize, ToSchema)]
pub struct QuotaRow {
    pub name: String,
    pub hourly_ceiling: i64,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
}

#[derive(Clone, Debug, Serialize, ToSchema)]
pub struct FlowRow {
    pub name: String,
    pub quota: String,
    #[schema(value_type = Mode)]
    pub mode: String,
    pub priority: i16,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
}

#[derive(Clone, Debug, Serialize, ToSchema)]
pub struct WindowRow {
    pub quota: String,
    pub window_start: DateTime<Utc>,
    pub count: i64,
    pub hourly_ceiling: i64,
    pub granted: i64,
    pub deferred: i64,
    pub would_defer: i64,
    pub bypassed: i64,
    pub unthrottled: i64,
}

impl Store {
    pub async fn put_quota(
        &self,
        name: &str,
        hourly_ceiling: i64,
    ) -> Result<QuotaRow, sqlx::Error> {
        sqlx::query_file_as!(QuotaRow, "sql/put_quota.sql", name, hourly_ceiling)
            .fetch_one(self.pool())
            .await
    }

    pub async fn list_quotas(&self) -> Result<Vec<QuotaRow>, sqlx::Error> {
        sqlx::query_file_as!(QuotaRow, "sql/list_quotas.sql")
            .fetch_all(self.pool())
            .await
    }

    /// Creates or updates a flow; a quota it names that does not exist yet is
    /// created with `default_ceiling`.
    pub async fn put_flow(
        &self,
        name: &str,
        quota: &str,
        mode: Option<Mode>,
        priority: Option<i16>,
        default_ceiling: i64,
    ) -> Result<FlowRow, sqlx::Error> {
        let mut tx = self.pool().begin().await?;
        sqlx::query_file!("sql/ensure_quota.sql", quota, default_ceiling)
            .execute(&mut *tx)
            .await?;
        let row = sqlx::query_file_as!(
            FlowRow,
            "sql/put_flow.sql",
            name,
            quota,
            mode.map(|m| m.as_str()),
            priority
        )
        .fetch_one(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(row)
    }

    pub async fn list_flows(&self) -> Result<Vec<FlowRow>, sqlx::Error> {
        sqlx::query_file_as!(FlowRow, "sql/list_flows.sql")
            .fetch_all(self.pool())
            .await
    }

    /// Windows of the last `hours` hours, newest first.
    pub async fn recent_windows(
        &self,
        quota: Option<&str>,
        hours: i32,
    ) -> Result<Vec<WindowRow>, sqlx::Error> {
        sqlx::query_file_as!(WindowRow, "sql/recent_windows.sql", quota, hours)
            .fetch_all(self.pool())
            .await
    }
}
