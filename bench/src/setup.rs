//! The quotas and flows of one run, written through the service's own
//! catalog code before the service starts (so it loads them at once). Every
//! name starts with the run's tag: runs never share a row.

use quota_arbiter::domain::admission::RouteClassSettings;
use quota_arbiter::domain::catalog::{
    Fallback, FlowSettings, Mode, QuotaSettings, DEFAULT_PRIORITY,
};
use quota_arbiter::domain::QuotaName;
use quota_arbiter::store::Store;

const ACTOR: &str = "bench";

/// Catalog writes in flight at once while declaring many quotas.
const WRITERS: usize = 8;

/// A ceiling no run can reach: throughput arms measure decisions that find
/// room, not refusals.
pub const UNREACHABLE_CEILING: i64 = 1 << 50;

/// A quota of this name with `settings`, and with `mode` a flow of the same
/// name that spends it (none for a quota only pgbench uses).
pub async fn declare(
    store: &Store,
    name: &str,
    settings: &QuotaSettings,
    mode: Option<Mode>,
) -> anyhow::Result<()> {
    store.put_quota(ACTOR, name, settings).await?;
    if let Some(mode) = mode {
        declare_spending(store, name, &[name], mode).await?;
    }
    Ok(())
}

/// A flow of this name in `mode` that spends every one of `quotas` in each
/// call.
pub async fn declare_spending(
    store: &Store,
    name: &str,
    quotas: &[&str],
    mode: Mode,
) -> anyhow::Result<()> {
    let mut quotas = quotas
        .iter()
        .map(|q| QuotaName::parse(*q).map_err(anyhow::Error::msg))
        .collect::<anyhow::Result<Vec<_>>>()?;
    anyhow::ensure!(!quotas.is_empty(), "a flow spends a quota");
    let quota = quotas.remove(0);
    let flow = FlowSettings {
        quota,
        further_quotas: quotas,
        mode,
        priority: DEFAULT_PRIORITY,
        enforce_percent: None,
        fallback: Fallback::Off,
    };
    store.put_flow(ACTOR, name, &flow, None).await?;
    Ok(())
}

/// [`declare`] for `{prefix}1` … `{prefix}{count}`, a few at a time.
pub async fn declare_many(
    store: &Store,
    prefix: &str,
    count: usize,
    settings: &QuotaSettings,
    mode: Option<Mode>,
) -> anyhow::Result<()> {
    let writers: Vec<_> = (0..WRITERS)
        .map(|writer| {
            let (store, prefix, settings) = (store.clone(), prefix.to_string(), settings.clone());
            tokio::spawn(async move {
                for n in (1..=count).skip(writer).step_by(WRITERS) {
                    declare(&store, &format!("{prefix}{n}"), &settings, mode).await?;
                }
                anyhow::Ok(())
            })
        })
        .collect();
    for writer in writers {
        writer.await??;
    }
    Ok(())
}

/// A route class no arm's callers can exhaust: buckets and capacity far
/// beyond what a run asks, every tenant allowed all of it.
pub async fn declare_route_class(store: &Store, name: &str) -> anyhow::Result<()> {
    let never_refusing = RouteClassSettings {
        burst: 1e9,
        rate: 1e6,
        capacity: UNREACHABLE_CEILING,
        window_seconds: 3600,
        tenant_share: 1.0,
        capacity_error_budget: 0.01,
    };
    store.put_route_class(ACTOR, name, &never_refusing).await?;
    Ok(())
}
