//! The catalog as a decision reads it: quotas, flows and route classes, in one
//! read (`crate::catalog::Catalog` keeps the replica's copy).

use crate::domain::admission::{RouteClass, RouteClassSettings};
use crate::domain::catalog::{Cadence, FlowRule, QuotaRule, Snapshot};

use super::Store;
use crate::domain::window::{Period, WindowRule};

/// A quota's windows as a statement writes them: parallel arrays of their
/// periods, ceilings and zones ([`windows_of_row`] reads them back).
pub(super) fn window_columns(
    windows: &[WindowRule],
) -> (Vec<String>, Vec<i64>, Vec<Option<String>>) {
    let periods = windows.iter().map(|w| w.period.to_string()).collect();
    let ceilings = windows.iter().map(|w| w.ceiling).collect();
    let zones = windows.iter().map(|w| w.zone.clone()).collect();
    (periods, ceilings, zones)
}

/// A quota's windows as the tables hold them (parallel arrays), shortest
/// first. The table's CHECK admits only periods this build parses.
pub(super) fn windows_of_row(
    periods: Vec<String>,
    ceilings: Vec<i64>,
    zones: Vec<Option<String>>,
) -> Vec<WindowRule> {
    let mut windows: Vec<WindowRule> = periods
        .iter()
        .zip(ceilings)
        .zip(zones)
        .filter_map(|((period, ceiling), zone)| {
            Some(WindowRule {
                period: Period::parse(period).ok()?,
                ceiling,
                zone,
            })
        })
        .collect();
    windows.sort_by_key(|w| w.period);
    windows
}

impl Store {
    /// Reads the tables in one transaction so the snapshot is consistent.
    /// Every replica does so every 2 s: the reads take what a decision uses
    /// and nothing more (`sql/catalog_quotas.sql`).
    pub(crate) async fn load_catalog(&self) -> Result<Snapshot, sqlx::Error> {
        let mut tx = self.pool().begin().await?;
        let quotas = sqlx::query_file!("sql/catalog_quotas.sql")
            .fetch_all(&mut tx)
            .await?;
        let flows = sqlx::query_file!("sql/catalog_flows.sql")
            .fetch_all(&mut tx)
            .await?;
        let route_classes = sqlx::query_file!("sql/list_route_classes.sql", None::<String>)
            .fetch_all(&mut tx)
            .await?;
        tx.commit().await?;
        let quotas = quotas
            .into_iter()
            .map(|q| QuotaRule {
                cadence: q.rate.zip(q.burst).map(|(rate, burst)| Cadence {
                    rate,
                    burst,
                    adaptive: q.adaptive,
                }),
                name: q.name,
                windows: windows_of_row(q.periods, q.ceilings, q.zones),
                max_in_flight: q.max_in_flight,
                priority2_share: q.priority2_share,
                priority3_share: q.priority3_share,
            })
            .collect();
        let flows = flows
            .into_iter()
            .filter_map(|f| {
                // The table's CHECK keeps modes valid; a value this build
                // does not know is skipped rather than guessed at.
                Some(FlowRule {
                    mode: f.mode.parse().ok()?,
                    name: f.name,
                    quota: f.quota,
                    further_quotas: f.further_quotas,
                    priority: f.priority,
                    enforce_percent: f.enforce_percent.unwrap_or(100),
                })
            })
            .collect();
        let route_classes = route_classes
            .into_iter()
            .map(|r| RouteClass {
                name: r.name,
                settings: RouteClassSettings {
                    burst: r.burst,
                    rate: r.rate,
                    capacity: r.capacity,
                    window_seconds: r.window_seconds,
                    tenant_share: r.tenant_share,
                    capacity_error_budget: r.capacity_error_budget,
                },
            })
            .collect();
        Ok(Snapshot::new(quotas, flows, route_classes))
    }
}
