//! The catalog's administration and what operators read (design.md §4, §6):
//! quotas, flows and route classes changed and listed, recent windows, the
//! observe-mode report, the gauges of a scrape and readiness. Every store
//! call goes through the shell (`crate::shell`): within the store timeout,
//! counted under its operation, an outage a 503.
//!
//! A change is audited under its actor (`api:admin` for the admin API) and
//! reloads this replica's catalog at once, so that its own next answer
//! already obeys it; every other replica reloads on the catalog trigger's
//! notification.

use std::future::Future;
use std::time::Duration;

use crate::catalog::Catalog;
use crate::domain::admission::{RouteClassPatch, RouteClassSettings};
use crate::domain::catalog::{FlowPatch, FlowSettings, QuotaPatch, QuotaSettings};
use crate::domain::{FlowName, QuotaName};
use crate::metrics::{Metrics, PoolReading, WindowUsage};
use crate::report::{self, Report, WhatIf};
use crate::shell::{Operation, Shell};
use crate::store::{
    CatalogError, FlowRow, QuotaRow, RouteClassRow, Store, StoreError, WhenMissing, WindowRow,
};

/// Who the audit trail names for changes made through the admin API.
pub(crate) const ADMIN_ACTOR: &str = "api:admin";

#[derive(Clone)]
pub struct Administration {
    store: Store,
    catalog: Catalog,
    metrics: Metrics,
    shell: Shell,
    /// A quota created without a ceiling of its own gets this.
    default_ceiling: i64,
    /// How long windows and tallies are kept, for the report to say; 0: forever.
    history_retention: Duration,
}

impl Administration {
    pub(crate) fn new(
        store: Store,
        catalog: Catalog,
        metrics: Metrics,
        shell: Shell,
        default_ceiling: i64,
        history_retention: Duration,
    ) -> Self {
        Self {
            store,
            catalog,
            metrics,
            shell,
            default_ceiling,
            history_retention,
        }
    }

    pub(crate) fn default_ceiling(&self) -> i64 {
        self.default_ceiling
    }

    /// Runs a change, then reloads this replica's catalog.
    async fn change<T: crate::shell::Answer>(
        &self,
        change: impl Future<Output = Result<T, CatalogError>>,
    ) -> Result<T, CatalogError> {
        let changed = self.shell.run_as(Operation::ChangeCatalog, change).await?;
        let reloaded = self.catalog.refresh(&self.store);
        self.shell.run(Operation::ChangeCatalog, reloaded).await?;
        Ok(changed)
    }

    async fn read<T: crate::shell::Answer>(
        &self,
        read: impl Future<Output = Result<T, sqlx::Error>>,
    ) -> Result<T, StoreError> {
        self.shell.run(Operation::ReadCatalog, read).await
    }

    pub async fn quota(&self, name: &QuotaName) -> Result<Option<QuotaRow>, StoreError> {
        self.read(self.store.quota(name)).await
    }

    pub async fn list_quotas(&self) -> Result<Vec<QuotaRow>, StoreError> {
        self.read(self.store.list_quotas()).await
    }

    pub async fn put_quota(
        &self,
        name: &QuotaName,
        settings: &QuotaSettings,
    ) -> Result<QuotaRow, CatalogError> {
        let put = async {
            let row = self.store.put_quota(ADMIN_ACTOR, name, settings).await?;
            Ok(row)
        };
        self.change(put).await
    }

    /// A quota that does not exist is [`CatalogError::NotFound`]: `PUT` creates.
    pub(crate) async fn patch_quota(
        &self,
        name: &QuotaName,
        patch: QuotaPatch,
    ) -> Result<QuotaRow, CatalogError> {
        let patched = self.store.patch_quota(
            ADMIN_ACTOR,
            name,
            patch,
            WhenMissing::NotFound,
            self.default_ceiling,
        );
        self.change(patched).await
    }

    pub(crate) async fn delete_quota(&self, name: &QuotaName) -> Result<(), CatalogError> {
        self.change(self.store.delete_quota(ADMIN_ACTOR, name))
            .await
    }

    pub async fn flow(&self, name: &FlowName) -> Result<Option<FlowRow>, StoreError> {
        self.read(self.store.flow(name)).await
    }

    pub async fn list_flows(&self) -> Result<Vec<FlowRow>, StoreError> {
        self.read(self.store.list_flows()).await
    }

    /// `create_quota`: a missing quota is created with the default ceiling
    /// rather than refused.
    pub async fn put_flow(
        &self,
        name: &FlowName,
        settings: &FlowSettings,
        create_quota: bool,
    ) -> Result<FlowRow, CatalogError> {
        let create = create_quota.then_some(self.default_ceiling);
        let put = self.store.put_flow(ADMIN_ACTOR, name, settings, create);
        self.change(put).await
    }

    /// A flow that does not exist is [`CatalogError::NotFound`]: `PUT` creates.
    pub(crate) async fn patch_flow(
        &self,
        name: &FlowName,
        patch: FlowPatch,
        create_quota: bool,
    ) -> Result<FlowRow, CatalogError> {
        let create = create_quota.then_some(self.default_ceiling);
        let patched =
            self.store
                .patch_flow(ADMIN_ACTOR, name, patch, WhenMissing::NotFound, create);
        self.change(patched).await
    }

    pub(crate) async fn delete_flow(&self, name: &FlowName) -> Result<(), CatalogError> {
        self.change(self.store.delete_flow(ADMIN_ACTOR, name)).await
    }

    pub async fn route_class(&self, name: &str) -> Result<Option<RouteClassRow>, StoreError> {
        self.read(self.store.route_class(name)).await
    }

    pub(crate) async fn list_route_classes(&self) -> Result<Vec<RouteClassRow>, StoreError> {
        self.read(self.store.list_route_classes()).await
    }

    pub async fn put_route_class(
        &self,
        name: &str,
        settings: &RouteClassSettings,
    ) -> Result<RouteClassRow, CatalogError> {
        let put = async {
            let row = self
                .store
                .put_route_class(ADMIN_ACTOR, name, settings)
                .await?;
            Ok(row)
        };
        self.change(put).await
    }

    pub async fn patch_route_class(
        &self,
        name: &str,
        patch: RouteClassPatch,
    ) -> Result<RouteClassRow, CatalogError> {
        self.change(self.store.patch_route_class(ADMIN_ACTOR, name, patch))
            .await
    }

    pub(crate) async fn delete_route_class(&self, name: &str) -> Result<(), CatalogError> {
        self.change(self.store.delete_route_class(ADMIN_ACTOR, name))
            .await
    }

    /// The last `hours` windows (of `quota`, or of every quota), newest first.
    pub(crate) async fn recent_windows(
        &self,
        quota: Option<&QuotaName>,
        hours: i32,
    ) -> Result<Vec<WindowRow>, StoreError> {
        let read = self
            .store
            .recent_windows(quota.map(QuotaName::as_str), hours);
        self.shell.run(Operation::ReadHistory, read).await
    }

    /// The observe-mode report over the last `since_hours` (design.md §6);
    /// the inner `Err` is a what-if for a window no reported quota has.
    pub(crate) async fn observe_report(
        &self,
        quota: Option<&QuotaName>,
        since_hours: i32,
        what_if: &WhatIf,
    ) -> Result<Result<Report, String>, StoreError> {
        let report = report::observe_report(
            &self.store,
            quota.map(QuotaName::as_str),
            since_hours,
            what_if,
            self.history_retention,
        );
        self.shell.run(Operation::ReadHistory, report).await
    }

    /// What the dashboard shows: the current windows, the last 24 windows
    /// and the flows, each read through the shell.
    pub async fn dashboard(
        &self,
    ) -> Result<(Vec<crate::store::UsageRow>, Vec<WindowRow>, Vec<FlowRow>), StoreError> {
        let shell = self.shell.one_budget();
        let usage = shell
            .run(Operation::ReadHistory, self.store.current_usage())
            .await?;
        let windows = shell
            .run(Operation::ReadHistory, self.store.recent_windows(None, 24))
            .await?;
        let flows = shell
            .run(Operation::ReadCatalog, self.store.list_flows())
            .await?;
        Ok((usage, windows, flows))
    }

    /// Sets the gauges that describe state rather than events, just before
    /// a scrape: the catalog's flows and route classes, the current windows
    /// (none without a fresh reading: no number beats a stale one) and the
    /// pool.
    pub(crate) async fn gauge_state(&self) {
        let snapshot = self.catalog.snapshot();
        let flows: Vec<_> = snapshot
            .as_ref()
            .map(|s| s.flows().cloned().collect())
            .unwrap_or_default();
        if let Some(snapshot) = &snapshot {
            self.metrics
                .register_route_classes(snapshot.route_classes());
        }
        let usage = self
            .shell
            .run(Operation::ReadHistory, self.store.current_usage())
            .await
            .ok()
            .map(|rows| {
                rows.into_iter()
                    .map(|row| WindowUsage {
                        quota: row.quota,
                        period: row.period,
                        count: row.count,
                        ceiling: row.ceiling,
                        effective_rate: row.effective_rate,
                        effective_burst: row.effective_burst,
                    })
                    .collect::<Vec<_>>()
            });
        let pool = self.store.pool();
        let pool = PoolReading {
            open: pool.size(),
            idle: pool.num_idle(),
            max: pool.max_connections(),
        };
        self.metrics.set_state(&flows, usage.as_deref(), pool);
        let catalog = &self.catalog;
        self.metrics
            .set_catalog_age(catalog.age(), catalog.stale_after());
    }

    /// Ready: the store answers within the timeout with every migration of
    /// this build applied (`store`), and the catalog is loaded (`catalog`).
    pub async fn readiness(&self) -> (bool, bool) {
        let ready = async { Ok::<_, StoreError>(self.store.is_ready().await) };
        let store = self.shell.run(Operation::Readiness, ready).await;
        (store.unwrap_or(false), self.catalog.is_loaded())
    }
}
