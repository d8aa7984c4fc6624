//! Catalog administration and window inspection.

use chrono::{DateTime, Utc};
use serde::Serialize;
use utoipa::ToSchema;

use super::{Store, StoreError, StoreTransaction};
use crate::domain::catalog::{
    Fallback, FlowPatch, FlowPatchError, FlowSettings, Mode, QuotaPatch, QuotaSettings,
};
use crate::domain::window::{WindowRule, WindowSpec};
use crate::domain::QuotaName;

/// A quota as `sql/list_quotas.sql` reads it: its windows as parallel arrays.
struct QuotaRecord {
    name: String,
    rate: Option<f64>,
    burst: Option<f64>,
    adaptive: bool,
    max_in_flight: Option<i32>,
    priority2_share: Option<i16>,
    priority3_share: Option<i16>,
    effective_rate: Option<f64>,
    effective_burst: Option<f64>,
    created_at: DateTime<Utc>,
    updated_at: DateTime<Utc>,
    periods: Vec<String>,
    ceilings: Vec<i64>,
    zones: Vec<Option<String>>,
}

impl From<QuotaRecord> for QuotaRow {
    fn from(r: QuotaRecord) -> Self {
        let windows = super::catalog::windows_of_row(r.periods, r.ceilings, r.zones);
        QuotaRow {
            name: r.name,
            hourly_ceiling: crate::domain::window::hourly_ceiling(&windows),
            windows: windows.iter().map(WindowSpec::from).collect(),
            rate: r.rate,
            burst: r.burst,
            adaptive: r.adaptive,
            max_in_flight: r.max_in_flight,
            priority2_share: r.priority2_share,
            priority3_share: r.priority3_share,
            effective_rate: r.effective_rate,
            effective_burst: r.effective_burst,
            created_at: r.created_at,
            updated_at: r.updated_at,
        }
    }
}

#[derive(Clone, Debug, Serialize, ToSchema)]
pub struct QuotaRow {
    pub name: String,
    /// The `1h` window's ceiling; `null` when the quota has no hour.
    pub hourly_ceiling: Option<i64>,
    /// Every window, shortest first.
    pub windows: Vec<WindowSpec>,
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

#[derive(Clone, Debug, Serialize, ToSchema)]
pub struct FlowRow {
    pub name: String,
    /// The quota its answers name: the first of `quotas`.
    pub quota: String,
    /// Every quota it spends in each call, all or nothing (design.md §12).
    pub quotas: Vec<String>,
    #[schema(value_type = Mode)]
    pub mode: String,
    pub priority: i16,
    /// Enforce mode: share (1-100) of over-ceiling decisions deferred; `null` = 100.
    pub enforce_percent: Option<i16>,
    /// What a worker's client does when the arbiter is unreachable.
    #[schema(value_type = Fallback)]
    pub fallback: String,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
}

impl FlowRow {
    /// The share (1-100) of over-ceiling decisions deferred: `None` unless
    /// the flow is in enforce mode (a percent kept from before a flip to
    /// observe or count means nothing there).
    pub(crate) fn enforced_percent(&self) -> Option<i16> {
        (self.mode == Mode::Enforce.as_str()).then(|| self.enforce_percent.unwrap_or(100))
    }
}

#[derive(Clone, Debug, Serialize, ToSchema)]
pub struct WindowRow {
    pub quota: String,
    /// `1m`, `1h`, `1d`, `1mo` …; decisions are tallied per hour, so only
    /// a `1h` window carries tallies.
    pub period: String,
    pub window_start: DateTime<Utc>,
    pub count: i64,
    /// The quota's ceiling for the period (`null`: it no longer has one).
    pub ceiling: Option<i64>,
    /// The quota's `1h` window's ceiling (`null` without an hour).
    pub hourly_ceiling: Option<i64>,
    pub granted: i64,
    pub deferred: i64,
    pub would_defer: i64,
    pub bypassed: i64,
    pub unthrottled: i64,
}

/// What a patch does to a quota or flow that does not exist yet.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WhenMissing {
    /// The CLI's `quota` and `flow` commands declare it: a quota from the
    /// default ceiling, a flow when the patch names its quota.
    Create,
    /// The API's `PATCH` changes what exists: a missing object is a 404
    /// (`PUT` creates), so a typo'd name creates nothing.
    NotFound,
}

/// Why a change to the catalog was not made.
#[derive(Debug, thiserror::Error)]
pub enum CatalogError {
    /// The change itself is wrong (a bad value, a typo'd quota).
    #[error("{0}")]
    Invalid(String),
    #[error("{0}")]
    NotFound(String),
    /// The change conflicts with what depends on the object.
    #[error("{0}")]
    Conflict(String),
    #[error(transparent)]
    Store(#[from] StoreError),
}

impl From<sqlx::Error> for CatalogError {
    fn from(error: sqlx::Error) -> Self {
        CatalogError::Store(error.into())
    }
}

impl Store {
    /// Opens a transaction whose catalog changes the audit trigger attributes
    /// to `actor` (e.g. `api:admin`, `cli:alice`).
    pub(super) async fn as_actor(&self, actor: &str) -> Result<StoreTransaction, sqlx::Error> {
        let mut tx = self.pool().begin().await?;
        sqlx::query_file_scalar!("sql/declare_actor.sql", actor)
            .fetch_one(&mut tx)
            .await?;
        Ok(tx)
    }

    /// Creates a quota or replaces all its settings (`PUT`).
    pub async fn put_quota(
        &self,
        actor: &str,
        name: &str,
        settings: &QuotaSettings,
    ) -> Result<QuotaRow, CatalogError> {
        let mut tx = self.as_actor(actor).await?;
        write_quota(&mut tx, name, settings).await?;
        tx.commit().await?;
        Ok(self.quota(name).await?.ok_or(sqlx::Error::RowNotFound)?)
    }

    /// Changes only what `patch` names (`PATCH`, the CLI); a quota that does
    /// not exist yet is created from the default ceiling.
    pub(crate) async fn patch_quota(
        &self,
        actor: &str,
        name: &str,
        patch: QuotaPatch,
        when_missing: WhenMissing,
        default_ceiling: i64,
    ) -> Result<QuotaRow, CatalogError> {
        let mut tx = self.as_actor(actor).await?;
        let current = sqlx::query_file!("sql/lock_quota.sql", name)
            .fetch_optional(&mut tx)
            .await?
            .map(|row| QuotaSettings {
                windows: super::catalog::windows_of_row(row.periods, row.ceilings, row.zones),
                rate: row.rate,
                burst: row.burst,
                adaptive: row.adaptive,
                max_in_flight: row.max_in_flight,
                priority2_share: row.priority2_share,
                priority3_share: row.priority3_share,
            });
        if current.is_none() && when_missing == WhenMissing::NotFound {
            return Err(CatalogError::NotFound(format!(
                "no quota `{name}`; PUT creates it"
            )));
        }
        let settings = patch
            .applied_to(current, default_ceiling)
            .map_err(CatalogError::Invalid)?;
        write_quota(&mut tx, name, &settings).await?;
        tx.commit().await?;
        Ok(self.quota(name).await?.ok_or(sqlx::Error::RowNotFound)?)
    }

    /// Deletes a quota and its windows; 409 while a flow still spends it.
    pub(crate) async fn delete_quota(&self, actor: &str, name: &str) -> Result<(), CatalogError> {
        let mut tx = self.as_actor(actor).await?;
        let row = sqlx::query_file!("sql/delete_quota.sql", name)
            .fetch_one(&mut tx)
            .await?;
        if !row.flows.is_empty() {
            return Err(CatalogError::Conflict(format!(
                "quota `{name}` is still spent by flow(s) {}; delete or move them first",
                row.flows.join(", ")
            )));
        }
        if row.deleted == 0 {
            return Err(CatalogError::NotFound(format!("no quota `{name}`")));
        }
        tx.commit().await?;
        Ok(())
    }

    pub async fn list_quotas(&self) -> Result<Vec<QuotaRow>, sqlx::Error> {
        self.quotas(None).await
    }

    pub async fn quota(&self, name: &str) -> Result<Option<QuotaRow>, sqlx::Error> {
        Ok(self.quotas(Some(name)).await?.pop())
    }

    async fn quotas(&self, name: Option<&str>) -> Result<Vec<QuotaRow>, sqlx::Error> {
        let records = sqlx::query_file_as!(QuotaRecord, "sql/list_quotas.sql", name)
            .fetch_all(self.pool())
            .await?;
        Ok(records.into_iter().map(QuotaRow::from).collect())
    }

    /// Creates a flow or replaces all its settings (`PUT`).
    pub async fn put_flow(
        &self,
        actor: &str,
        name: &str,
        settings: &FlowSettings,
        create_quota: Option<i64>,
    ) -> Result<FlowRow, CatalogError> {
        let mut tx = self.as_actor(actor).await?;
        let row = write_flow(&mut tx, name, settings, create_quota).await?;
        tx.commit().await?;
        Ok(row)
    }

    /// Changes only what `patch` names (`PATCH`, the CLI). With
    /// `create_quota`, a quota the flow names that does not exist is created
    /// with that ceiling; without it, naming one is refused.
    pub(crate) async fn patch_flow(
        &self,
        actor: &str,
        name: &str,
        patch: FlowPatch,
        when_missing: WhenMissing,
        create_quota: Option<i64>,
    ) -> Result<FlowRow, CatalogError> {
        let mut tx = self.as_actor(actor).await?;
        let current = sqlx::query_file!("sql/lock_flow.sql", name)
            .fetch_optional(&mut tx)
            .await?
            .map(|row| FlowSettings {
                quota: QuotaName::of_row(row.quota),
                further_quotas: row
                    .further_quotas
                    .into_iter()
                    .map(QuotaName::of_row)
                    .collect(),
                // The table's CHECK admits only modes this build knows.
                mode: row.mode.parse().unwrap_or(Mode::Observe),
                priority: row.priority,
                enforce_percent: row.enforce_percent,
                // The table's CHECK admits only `off` and `local`.
                fallback: row.fallback.parse().unwrap_or_default(),
            });
        if current.is_none() && when_missing == WhenMissing::NotFound {
            return Err(CatalogError::NotFound(format!(
                "no flow `{name}`; PUT creates it"
            )));
        }
        let settings = patch.applied_to(current).map_err(|error| match error {
            FlowPatchError::NoSuchFlow => CatalogError::NotFound(format!(
                "no flow `{name}`; to create it, name its quota (`quota`, or --quota)"
            )),
            FlowPatchError::Invalid(why) => CatalogError::Invalid(why),
        })?;
        let row = write_flow(&mut tx, name, &settings, create_quota).await?;
        tx.commit().await?;
        Ok(row)
    }

    /// Deletes a flow; 409 while work items of it are not done.
    pub(crate) async fn delete_flow(&self, actor: &str, name: &str) -> Result<(), CatalogError> {
        let mut tx = self.as_actor(actor).await?;
        let row = sqlx::query_file!("sql/delete_flow.sql", name)
            .fetch_one(&mut tx)
            .await?;
        if row.open_work > 0 {
            return Err(CatalogError::Conflict(format!(
                "flow `{name}` has {} work item(s) not done yet",
                row.open_work
            )));
        }
        if row.deleted == 0 {
            return Err(CatalogError::NotFound(format!("no flow `{name}`")));
        }
        tx.commit().await?;
        Ok(())
    }

    pub async fn list_flows(&self) -> Result<Vec<FlowRow>, sqlx::Error> {
        sqlx::query_file_as!(FlowRow, "sql/list_flows.sql", None::<String>)
            .fetch_all(self.pool())
            .await
    }

    pub async fn flow(&self, name: &str) -> Result<Option<FlowRow>, sqlx::Error> {
        sqlx::query_file_as!(FlowRow, "sql/list_flows.sql", Some(name))
            .fetch_optional(self.pool())
            .await
    }

    /// Windows of the last `hours` hours, newest first.
    pub(crate) async fn recent_windows(
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
}

/// A window's count, as the observe report reads it (`sql/report_windows.sql`).
#[derive(Clone, Debug)]
pub struct CountedWindow {
    pub quota: String,
    pub period: String,
    pub window_start: DateTime<Utc>,
    pub ends_at: DateTime<Utc>,
    pub count: i64,
}

/// The decisions that spent a quota in an hour (`sql/report_spent_hours.sql`).
#[derive(Clone, Debug)]
pub struct SpentHour {
    pub quota: String,
    pub window_start: DateTime<Utc>,
    pub spent: i64,
}

#[derive(Clone, Debug, Serialize, ToSchema)]
pub struct UsageRow {
    pub quota: String,
    pub period: String,
    pub window_start: DateTime<Utc>,
    pub window_end: DateTime<Utc>,
    pub count: i64,
    pub ceiling: i64,
    pub percent_used: Option<f64>,
    pub slots_left: i64,
    pub seconds_left: i32,
    pub effective_rate: Option<f64>,
    pub effective_burst: Option<f64>,
}

impl Store {
    /// Tallies of flows still in observe mode, per hour of the last `hours`.
    pub(crate) async fn observe_tallies(
        &self,
        quota: Option<&str>,
        hours: i32,
    ) -> Result<Vec<ObserveTally>, sqlx::Error> {
        sqlx::query_file_as!(ObserveTally, "sql/report_observe.sql", quota, hours)
            .fetch_all(self.pool())
            .await
    }

    /// The windows of the quotas that flows still in observe mode spend
    /// (those of `quota`, or all) overlapping the last `hours`, with counts.
    pub(crate) async fn report_windows(
        &self,
        quota: Option<&str>,
        hours: i32,
    ) -> Result<Vec<CountedWindow>, sqlx::Error> {
        sqlx::query_file_as!(CountedWindow, "sql/report_windows.sql", quota, hours)
            .fetch_all(self.pool())
            .await
    }

    /// Per quota of `quotas` and hour from `from` on, the decisions that spent it.
    pub(crate) async fn report_spent_hours(
        &self,
        quotas: &[String],
        from: DateTime<Utc>,
    ) -> Result<Vec<SpentHour>, sqlx::Error> {
        sqlx::query_file_as!(SpentHour, "sql/report_spent_hours.sql", quotas, from)
            .fetch_all(self.pool())
            .await
    }

    pub(crate) async fn current_usage(&self) -> Result<Vec<UsageRow>, sqlx::Error> {
        sqlx::query_file_as!(UsageRow, "sql/current_usage.sql")
            .fetch_all(self.pool())
            .await
    }
}

/// Writes a quota whose settings are checked, its windows with it. A zone
/// PostgreSQL does not know is refused here: its zone names are the
/// service's (no second copy of the time-zone database in the binary).
async fn write_quota(
    tx: &mut StoreTransaction,
    name: &str,
    s: &QuotaSettings,
) -> Result<(), CatalogError> {
    if s.rate.is_some() || s.max_in_flight.is_some() {
        let flows = sqlx::query_file_scalar!("sql/flows_spending_with_others.sql", name)
            .fetch_all(&mut *tx)
            .await?;
        if !flows.is_empty() {
            return Err(CatalogError::Invalid(format!(
                "quota `{name}` is spent with other quotas in one call by flow(s) {}: \
                 such a quota has windows only (no `rate`, `burst` or `max_in_flight`)",
                flows.join(", ")
            )));
        }
    }
    let zones: Vec<String> = s.windows.iter().filter_map(|w| w.zone.clone()).collect();
    if !zones.is_empty() {
        let unknown = sqlx::query_file_scalar!("sql/unknown_zones.sql", &zones)
            .fetch_all(&mut *tx)
            .await?;
        if let Some(zone) = unknown.first() {
            return Err(CatalogError::Invalid(format!(
                "`zone` `{zone}` is not a time zone PostgreSQL knows (an IANA name such as America/Los_Angeles)"
            )));
        }
    }
    sqlx::query_file!(
        "sql/put_quota.sql",
        name,
        s.rate,
        s.burst,
        s.adaptive,
        s.max_in_flight,
        s.priority2_share,
        s.priority3_share
    )
    .execute(&mut *tx)
    .await?;
    write_windows(tx, name, &s.windows).await?;
    Ok(())
}

async fn write_windows(
    tx: &mut StoreTransaction,
    name: &str,
    windows: &[WindowRule],
) -> Result<(), sqlx::Error> {
    let (periods, ceilings, zones) = super::catalog::window_columns(windows);
    sqlx::query_file!(
        "sql/put_quota_windows.sql",
        name,
        &periods,
        &ceilings,
        &zones as &[Option<String>]
    )
    .execute(&mut *tx)
    .await?;
    Ok(())
}

/// Writes a flow whose settings are checked; its quota must exist, or is
/// created with the ceiling `create_quota` carries.
async fn write_flow(
    tx: &mut StoreTransaction,
    name: &str,
    settings: &FlowSettings,
    create_quota: Option<i64>,
) -> Result<FlowRow, CatalogError> {
    for quota in settings.quotas().map(QuotaName::as_str) {
        if let Some(ceiling) = create_quota {
            sqlx::query_file!("sql/ensure_quota.sql", quota, ceiling)
                .execute(&mut *tx)
                .await?;
        }
        let exists = sqlx::query_file_scalar!("sql/lock_quota_key.sql", quota)
            .fetch_optional(&mut *tx)
            .await?;
        if exists.is_none() {
            return Err(CatalogError::Invalid(format!(
                "no quota `{quota}`: create it first, or ask for it to be created \
                 (\"create_quota\": true, or --create-quota)"
            )));
        }
    }
    let further: Vec<String> = settings
        .further_quotas
        .iter()
        .map(|q| q.as_str().to_string())
        .collect();
    if !further.is_empty() {
        let every: Vec<String> = settings.quotas().map(|q| q.as_str().to_string()).collect();
        let paced = sqlx::query_file_scalar!("sql/paced_quotas_among.sql", &every)
            .fetch_all(&mut *tx)
            .await?;
        if !paced.is_empty() {
            return Err(CatalogError::Invalid(format!(
                "a flow that spends several quotas in one call is decided by their windows \
                 alone; quota(s) {} have a cadence or in-flight places",
                paced.join(", ")
            )));
        }
    }
    Ok(sqlx::query_file_as!(
        FlowRow,
        "sql/put_flow.sql",
        name,
        settings.quota.as_str(),
        settings.mode.as_str(),
        settings.priority,
        settings.enforce_percent,
        settings.fallback.as_str(),
        &further
    )
    .fetch_one(&mut *tx)
    .await?)
}
