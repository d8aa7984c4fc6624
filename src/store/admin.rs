//! Catalog administration and window inspection.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use sqlx::{Postgres, Transaction};
use utoipa::ToSchema;

use super::Store;
use crate::catalog::{validate_limits, Mode};

#[derive(Clone, Debug, Serialize, ToSchema)]
pub struct QuotaRow {
    pub name: String,
    pub hourly_ceiling: i64,
    /// Cadence: sustained tokens per second, as configured.
    pub rate: Option<f64>,
    /// Cadence: bucket size, as configured.
    pub burst: Option<f64>,
    pub adaptive: bool,
    pub max_in_flight: Option<i32>,
    pub priority2_share: Option<i16>,
    pub priority3_share: Option<i16>,
    /// Cadence in force now, after adaptive shrinking and recovery.
    pub effective_rate: Option<f64>,
    pub effective_burst: Option<f64>,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
}

/// A quota's limits as declared, in `PUT /v1/quotas/{name}` or a config
/// file's `[quotas.NAME]`; a limit left out is off.
#[derive(Clone, Debug, Default, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct QuotaLimits {
    /// Slots per UTC hour; defaults to QUOTA_HOURLY_CEILING. Below 1 refuses everything.
    pub hourly_ceiling: Option<i64>,
    /// Cadence: sustained tokens per second (with `burst`).
    pub rate: Option<f64>,
    /// Cadence: bucket size, at least 1 (with `rate`).
    pub burst: Option<f64>,
    /// Shrink the cadence on upstream errors (default true).
    pub adaptive: Option<bool>,
    /// Concurrency slots; a grant holds a lease on one.
    #[schema(minimum = 1, maximum = 10000)]
    pub max_in_flight: Option<i32>,
    /// Headroom: percent of the ceiling open to priority-2 flows.
    #[schema(minimum = 0, maximum = 100)]
    pub priority2_share: Option<i16>,
    /// Headroom: percent of the ceiling open to priority-3 flows.
    #[schema(minimum = 0, maximum = 100)]
    pub priority3_share: Option<i16>,
}

impl QuotaLimits {
    /// The settings to store, `default_ceiling` standing in for a ceiling
    /// left out; every limit checked.
    pub fn settings(&self, default_ceiling: i64) -> Result<QuotaSettings, String> {
        let ceiling = self.hourly_ceiling.unwrap_or(default_ceiling);
        validate_limits(ceiling, self.rate, self.burst)?;
        if self
            .max_in_flight
            .is_some_and(|n| !(1..=10_000).contains(&n))
        {
            return Err("`max_in_flight` must be between 1 and 10000".into());
        }
        let share_ok = |s: Option<i16>| s.is_none_or(|p| (0..=100).contains(&p));
        if !share_ok(self.priority2_share) || !share_ok(self.priority3_share) {
            return Err("`priority2_share` and `priority3_share` are percentages (0-100)".into());
        }
        Ok(QuotaSettings {
            hourly_ceiling: ceiling,
            rate: self.rate,
            burst: self.burst,
            adaptive: self.adaptive,
            max_in_flight: self.max_in_flight,
            priority2_share: self.priority2_share,
            priority3_share: self.priority3_share,
        })
    }
}

/// A quota's settings as `PUT /v1/quotas/{name}` replaces them: the declared
/// limits, checked, with the ceiling resolved.
#[derive(Clone, Debug, Default)]
pub struct QuotaSettings {
    pub hourly_ceiling: i64,
    pub rate: Option<f64>,
    pub burst: Option<f64>,
    pub adaptive: Option<bool>,
    pub max_in_flight: Option<i32>,
    pub priority2_share: Option<i16>,
    pub priority3_share: Option<i16>,
}

#[derive(Clone, Debug, Serialize, ToSchema)]
pub struct FlowRow {
    pub name: String,
    pub quota: String,
    #[schema(value_type = Mode)]
    pub mode: String,
    pub priority: i16,
    /// Enforce mode: share (1-100) of over-ceiling decisions deferred; `null` = 100.
    pub enforce_percent: Option<i16>,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
}

impl FlowRow {
    /// The share (1-100) of over-ceiling decisions deferred: `None` unless
    /// the flow is in enforce mode (a percent kept from before a flip to
    /// observe or count means nothing there).
    pub fn enforced_percent(&self) -> Option<i16> {
        (self.mode == Mode::Enforce.as_str()).then(|| self.enforce_percent.unwrap_or(100))
    }
}

/// A change to the catalog, as `PUT /v1/flows/{name}` and the CLI express it.
#[derive(Clone, Debug, Default)]
pub struct FlowChange {
    pub quota: String,
    pub mode: Option<Mode>,
    pub priority: Option<i16>,
    pub enforce_percent: Option<i16>,
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
    /// Opens a transaction whose catalog changes the audit trigger attributes
    /// to `actor` (e.g. `api:admin`, `cli:alice`).
    async fn as_actor(&self, actor: &str) -> Result<Transaction<'static, Postgres>, sqlx::Error> {
        let mut tx = self.pool().begin().await?;
        sqlx::query_file_scalar!("sql/declare_actor.sql", actor)
            .fetch_one(&mut *tx)
            .await?;
        Ok(tx)
    }

    /// Creates or replaces a quota's settings; returns it as listed.
    pub async fn put_quota(
        &self,
        actor: &str,
        name: &str,
        settings: &QuotaSettings,
    ) -> Result<QuotaRow, sqlx::Error> {
        let s = settings;
        let mut tx = self.as_actor(actor).await?;
        sqlx::query_file!(
            "sql/put_quota.sql",
            name,
            s.hourly_ceiling,
            s.rate,
            s.burst,
            s.adaptive,
            s.max_in_flight,
            s.priority2_share,
            s.priority3_share
        )
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        self.quotas(Some(name))
            .await?
            .pop()
            .ok_or(sqlx::Error::RowNotFound)
    }

    /// Creates a quota or changes only its ceiling.
    pub async fn set_quota_ceiling(
        &self,
        actor: &str,
        name: &str,
        hourly_ceiling: i64,
    ) -> Result<(), sqlx::Error> {
        let mut tx = self.as_actor(actor).await?;
        sqlx::query_file!("sql/set_quota_ceiling.sql", name, hourly_ceiling)
            .fetch_one(&mut *tx)
            .await?;
        tx.commit().await
    }

    pub async fn list_quotas(&self) -> Result<Vec<QuotaRow>, sqlx::Error> {
        self.quotas(None).await
    }

    async fn quotas(&self, name: Option<&str>) -> Result<Vec<QuotaRow>, sqlx::Error> {
        sqlx::query_file_as!(QuotaRow, "sql/list_quotas.sql", name)
            .fetch_all(self.pool())
            .await
    }

    /// Creates or updates a flow; a quota it names that does not exist yet is
    /// created with `default_ceiling`.
    pub async fn put_flow(
        &self,
        actor: &str,
        name: &str,
        change: &FlowChange,
        default_ceiling: i64,
    ) -> Result<FlowRow, sqlx::Error> {
        let mut tx = self.as_actor(actor).await?;
        sqlx::query_file!("sql/ensure_quota.sql", change.quota, default_ceiling)
            .execute(&mut *tx)
            .await?;
        let row = sqlx::query_file_as!(
            FlowRow,
            "sql/put_flow.sql",
            name,
            change.quota,
            change.mode.map(|m| m.as_str()),
            change.priority,
            change.enforce_percent
        )
        .fetch_one(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(row)
    }

    /// Flips an existing flow's mode; `None` when there is no such flow.
    pub async fn set_flow_mode(
        &self,
        actor: &str,
        name: &str,
        mode: Mode,
        enforce_percent: Option<i16>,
    ) -> Result<Option<FlowRow>, sqlx::Error> {
        let mut tx = self.as_actor(actor).await?;
        let row = sqlx::query_file_as!(
            FlowRow,
            "sql/set_flow_mode.sql",
            name,
            mode.as_str(),
            enforce_percent
        )
        .fetch_optional(&mut *tx)
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

#[derive(Clone, Debug)]
pub struct ObserveTally {
    pub flow: String,
    pub quota: String,
    pub window_start: DateTime<Utc>,
    pub decisions: i64,
    pub would_defer: i64,
    pub would_defer_with_deadline: i64,
    pub window_count: i64,
}

#[derive(Clone, Debug, Serialize, ToSchema)]
pub struct UsageRow {
    pub quota: String,
    pub window_start: DateTime<Utc>,
    pub count: i64,
    pub hourly_ceiling: i64,
    pub percent_used: Option<f64>,
    pub slots_left: i64,
    pub seconds_left: i32,
    pub effective_rate: Option<f64>,
    pub effective_burst: Option<f64>,
}

impl Store {
    /// Tallies of flows still in observe mode, per hour of the last `hours`.
    pub async fn observe_tallies(
        &self,
        quota: Option<&str>,
        hours: i32,
    ) -> Result<Vec<ObserveTally>, sqlx::Error> {
        sqlx::query_file_as!(ObserveTally, "sql/report_observe.sql", quota, hours)
            .fetch_all(self.pool())
            .await
    }

    pub async fn current_usage(&self) -> Result<Vec<UsageRow>, sqlx::Error> {
        sqlx::query_file_as!(UsageRow, "sql/current_usage.sql")
            .fetch_all(self.pool())
            .await
    }
}
