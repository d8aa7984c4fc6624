//! Admission (design.md §11): route classes as the admin API and the config
//! file write them, the one admission statement, and pruning.

use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::Serialize;
use utoipa::ToSchema;

use super::{CatalogError, Store, StoreTransaction};
use crate::domain::admission::{Admission, Refusal, RouteClassPatch, RouteClassSettings};

/// A route class as the admin API shows it.
#[derive(Clone, Debug, Serialize, ToSchema)]
pub struct RouteClassRow {
    pub name: String,
    pub burst: f64,
    pub rate: f64,
    pub capacity: i64,
    pub window_seconds: i32,
    pub tenant_share: f64,
    pub capacity_error_budget: f64,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
}

impl Store {
    /// Creates a route class or replaces its settings (`PUT`).
    pub async fn put_route_class(
        &self,
        actor: &str,
        name: &str,
        s: &RouteClassSettings,
    ) -> Result<RouteClassRow, sqlx::Error> {
        let mut tx = self.as_actor(actor).await?;
        let row = write_route_class(&mut tx, name, s).await?;
        tx.commit().await?;
        Ok(row)
    }

    /// Changes only what `patch` names (`PATCH`); the class must exist.
    pub async fn patch_route_class(
        &self,
        actor: &str,
        name: &str,
        patch: RouteClassPatch,
    ) -> Result<RouteClassRow, CatalogError> {
        let mut tx = self.as_actor(actor).await?;
        let current = sqlx::query_file_as!(RouteClassSettings, "sql/lock_route_class.sql", name)
            .fetch_optional(&mut tx)
            .await?
            .ok_or_else(|| {
                CatalogError::NotFound(format!(
                    "no route class `{name}`; to create it, PUT all its settings"
                ))
            })?;
        let settings = patch.applied_to(current).map_err(CatalogError::Invalid)?;
        let row = write_route_class(&mut tx, name, &settings).await?;
        tx.commit().await?;
        Ok(row)
    }

    /// Deletes a route class and its admission counts.
    pub(crate) async fn delete_route_class(
        &self,
        actor: &str,
        name: &str,
    ) -> Result<(), CatalogError> {
        let mut tx = self.as_actor(actor).await?;
        let deleted = sqlx::query_file!("sql/delete_route_class.sql", name)
            .execute(&mut tx)
            .await?;
        if deleted.rows_affected() == 0 {
            return Err(CatalogError::NotFound(format!("no route class `{name}`")));
        }
        tx.commit().await?;
        Ok(())
    }

    pub async fn route_class(&self, name: &str) -> Result<Option<RouteClassRow>, sqlx::Error> {
        sqlx::query_file_as!(RouteClassRow, "sql/list_route_classes.sql", Some(name))
            .fetch_optional(self.pool())
            .await
    }

    pub(crate) async fn list_route_classes(&self) -> Result<Vec<RouteClassRow>, sqlx::Error> {
        sqlx::query_file_as!(RouteClassRow, "sql/list_route_classes.sql", None::<String>)
            .fetch_all(self.pool())
            .await
    }

    /// Seeds a route class the config file declares, unless the table has it
    /// already (run-time changes win). Whether it was inserted.
    pub async fn seed_route_class(
        &self,
        name: &str,
        s: &RouteClassSettings,
    ) -> Result<bool, sqlx::Error> {
        let inserted = sqlx::query_file!(
            "sql/seed_route_class.sql",
            name,
            s.burst,
            s.rate,
            s.capacity,
            s.window_seconds,
            s.tenant_share,
            s.capacity_error_budget
        )
        .execute(self.pool())
        .await?;
        Ok(inserted.rows_affected() == 1)
    }

    /// Admissions of `route_class` with `settings` for a group of callers:
    /// caller i is bucket `keys[i]` of tenant group `tenants[i]`, decided in
    /// order, each all or nothing, in one statement: one [`Admission`] per
    /// caller, in order.
    pub async fn admit(
        &self,
        keys: &[Vec<u8>],
        tenants: &[String],
        route_class: &str,
        settings: &RouteClassSettings,
    ) -> Result<Vec<Admission>, sqlx::Error> {
        let rows = sqlx::query_file!(
            "sql/admit.sql",
            keys,
            tenants,
            route_class,
            settings.burst,
            settings.rate,
            settings.capacity,
            settings.tenant_allowance(),
            settings.window_seconds
        )
        .fetch_all(self.pool())
        .await?;
        if rows.len() != keys.len() {
            let said = format!("admit_callers answered {} of {}", rows.len(), keys.len());
            return Err(sqlx::Error::Protocol(said));
        }
        rows.into_iter()
            .map(|row| {
                let refused_by = match row.refused_by.as_deref() {
                    None => None,
                    Some(refused_by) => Some(Refusal::from_store(refused_by).ok_or_else(|| {
                        sqlx::Error::Protocol(format!("admit_callers refused by `{refused_by}`"))
                    })?),
                };
                Ok(Admission {
                    refused_by,
                    tokens: row.tokens,
                    db_now: row.db_now,
                    window_end: row.window_end,
                })
            })
            .collect()
    }

    /// Callers' buckets full again for longer than `grace`, `batch` at a time.
    pub async fn prune_admit_buckets(
        &self,
        grace: Duration,
        batch: i64,
    ) -> Result<u64, sqlx::Error> {
        let pruned = sqlx::query_file!("sql/admit_bucket_prune.sql", grace.as_secs_f64(), batch)
            .execute(self.pool())
            .await?;
        Ok(pruned.rows_affected())
    }

    /// Admission counts of windows ended longer than `retention` ago.
    pub async fn prune_admit_windows(
        &self,
        retention: Duration,
        batch: i64,
    ) -> Result<u64, sqlx::Error> {
        let pruned =
            sqlx::query_file_scalar!("sql/admit_window_prune.sql", retention.as_secs_f64(), batch)
                .fetch_one(self.pool())
                .await?;
        Ok(pruned as u64)
    }
}

/// Writes a route class whose settings are checked (`PUT`, or a `PATCH`
/// merged with the stored class).
async fn write_route_class(
    tx: &mut StoreTransaction,
    name: &str,
    s: &RouteClassSettings,
) -> Result<RouteClassRow, sqlx::Error> {
    sqlx::query_file_as!(
        RouteClassRow,
        "sql/put_route_class.sql",
        name,
        s.burst,
        s.rate,
        s.capacity,
        s.window_seconds,
        s.tenant_share,
        s.capacity_error_budget
    )
    .fetch_one(&mut *tx)
    .await
}
