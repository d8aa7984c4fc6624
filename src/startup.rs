//! Building and running the service: the listener (port 0 in tests), the
//! shared state and the background tasks that keep a replica in step with the
//! database.

use std::future::Future;
use std::net::SocketAddr;
use std::time::Duration;

use axum::serve::{Listener, ListenerExt, TapIo};
use sqlx::postgres::PgListener;
use sqlx::PgPool;
use tokio::net::{TcpListener, TcpStream};

use crate::administration::Administration;
use crate::admission::AdmissionDesk;
use crate::auth::KeyRing;
use crate::bypass::BypassDesk;
use crate::catalog::Catalog;
use crate::clock::DbClock;
use crate::config::Config;
use crate::domain::PoolMode;
use crate::durability::DurabilityWatch;
use crate::http::{self, AppState, Services};
use crate::metrics::Metrics;
use crate::reservations::Reservations;
use crate::shell::Shell;
use crate::store::{self, Store};
use crate::supervise::supervise;
use crate::tally::Ledger;
use crate::work_registry::WorkRegistry;

/// How often a replica re-reads the catalog and the database clock anyway: the
/// safety net under LISTEN/NOTIFY, should the listening connection drop.
const SYNC_EVERY: Duration = Duration::from_secs(2);
/// How often a replica that cannot listen (behind a transaction pooler with
/// no `direct_database_url`) re-reads the catalog and the key ring: a flip or
/// a revocation is obeyed within about a second all the same (design.md §13).
const POLL_EVERY: Duration = Duration::from_millis(500);
/// Connections to `direct_database_url`: the listener's and a migration's.
const DIRECT_CONNECTIONS: u32 = 2;
/// The channel the catalog trigger notifies on every quota or flow change.
const CATALOG_CHANNEL: &str = "quota_arbiter_catalog";
/// How often counts and tallies made off the hot path are written.
const FLUSH_EVERY: Duration = Duration::from_millis(250);
/// How often rows past their retention (done work, history) are pruned.
const PRUNE_EVERY: Duration = Duration::from_secs(60);
/// How soon a pruning pass that failed is tried again: this, doubling with
/// each failure in a row, up to [`PRUNE_EVERY`].
const PRUNE_RETRY: Duration = Duration::from_secs(2);
/// How long `build` waits for the store before serving anyway (not ready).
const STARTUP_WAIT: Duration = Duration::from_secs(3);
/// How long the record of which key took a lease is kept: far past the
/// lease's own 60 s at most, so a late report still finds its holder.
const LEASE_HOLDER_RETENTION: Duration = Duration::from_secs(3600);
/// How long a caller's admission bucket stays once it is full again (it then
/// reads like a missing one): a minute spares a caller that comes back soon
/// an insert, and keeps ten thousand idle callers from piling up.
const FULL_BUCKET_GRACE: Duration = Duration::from_secs(60);
/// How long admission counts are kept after their window ended: enough to
/// look at the last hour by hand; they decide nothing once it is over.
const ADMIT_WINDOW_RETENTION: Duration = Duration::from_secs(3600);
/// How long a graceful shutdown may spend writing the counts still in
/// memory (statements answered late included) before giving them up.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(10);

/// The service's listener: every connection it accepts sends what it is
/// given at once ([`send_at_once`]).
type HttpListener = TapIo<TcpListener, fn(&mut TcpStream)>;

/// Binds the service's listener.
async fn bind(addr: SocketAddr) -> std::io::Result<HttpListener> {
    let listener = TcpListener::bind(addr).await?;
    Ok(listener.tap_io(send_at_once as fn(&mut TcpStream)))
}

/// Turns Nagle's algorithm off on an accepted connection. With it on, a
/// small write that follows one the peer has not acknowledged yet (an event
/// of `GET /v1/stream` after the one before it; the tail of an answer
/// longer than a segment) waits for that acknowledgement, which a peer with
/// nothing to send back may delay by up to 40 ms.
fn send_at_once(stream: &mut TcpStream) {
    if let Err(error) = stream.set_nodelay(true) {
        tracing::debug!(%error, "TCP_NODELAY not set on an accepted connection");
    }
}

pub struct Application {
    listener: HttpListener,
    state: AppState,
    store: Store,
    ledger: Ledger,
    background: Vec<tokio::task::JoinHandle<()>>,
    /// The flusher, stopped between two flushes, never in one.
    flusher: (
        tokio::task::JoinHandle<()>,
        tokio::sync::watch::Sender<bool>,
    ),
    /// Told when the replica stops: the share streams end (they never would
    /// by themselves, and a graceful shutdown waits for every connection).
    stop_streams: tokio::sync::watch::Sender<bool>,
}

impl Application {
    /// Connects (lazily) to `database_url`, creating the database and applying
    /// migrations when the store is reachable, and binds the listener.
    pub async fn build(config: Config) -> anyhow::Result<Self> {
        let pool = store::connect_lazy(
            ("database_url", &config.database_url),
            config.database_pool_mode,
            config.max_connections,
            config.store_timeout,
        )?;
        Self::build_with_pool(config, pool).await
    }

    /// [`Application::build`] on `pool`, connected to `database_url` as
    /// `database_pool_mode` says.
    pub async fn build_with_pool(config: Config, pool: PgPool) -> anyhow::Result<Self> {
        let listener = bind(config.listen).await?;
        let store = Store::with_mode(pool, config.database_pool_mode);
        // What holds a session of its own (migrations, LISTEN): PostgreSQL
        // itself when named, else `database_url` if its sessions last.
        let sessions = match &config.direct_database_url {
            Some(url) => Some(store::connect_lazy(
                ("direct_database_url", url),
                PoolMode::Session,
                DIRECT_CONNECTIONS,
                config.store_timeout,
            )?),
            None => store.pool().sessions().cloned(),
        };
        if sessions.is_none() {
            tracing::info!(
                every = ?POLL_EVERY,
                "no session to listen on (transaction pooling, no direct_database_url): \
                 the catalog and the keys are polled"
            );
        }
        let keys = KeyRing::default();
        let durability = DurabilityWatch::default();
        let (catalog, ledger, clock, metrics) = (
            Catalog::new(config.catalog_stale_after),
            Ledger::default(),
            DbClock::default(),
            Metrics::new(),
        );
        let (stop_streams, stopping) = tokio::sync::watch::channel(false);
        // The one shell every product's store calls go through.
        let shell = Shell::new(
            metrics.clone(),
            clock.clone(),
            ledger.clone(),
            config.store_timeout,
        );
        let reservations = Reservations::new(
            store.clone(),
            catalog.clone(),
            ledger.clone(),
            clock.clone(),
            metrics.clone(),
            shell.clone(),
            config.settle_within,
        );
        let state = AppState::new(Services {
            work_registry: WorkRegistry::new(
                store.clone(),
                catalog.clone(),
                metrics.clone(),
                shell.clone(),
                reservations.clone(),
            ),
            admission: AdmissionDesk::new(store.clone(), shell.clone()),
            administration: Administration::new(
                store.clone(),
                catalog.clone(),
                metrics.clone(),
                shell,
                config.hourly_ceiling,
                config.history_retention,
            ),
            reservations,
            bypass: BypassDesk::new(
                catalog.clone(),
                ledger.clone(),
                clock.clone(),
                metrics.clone(),
                config.bypass_horizon,
            ),
            catalog: catalog.clone(),
            metrics,
            admin_token: config.admin_token.clone(),
            auth: config.auth,
            keys: keys.clone(),
            lease_duration: config.lease_duration,
            // Checked when the configuration was loaded.
            admit_client_ip_header: config
                .admit_client_ip_header
                .as_deref()
                .and_then(|name| axum::http::HeaderName::try_from(name).ok()),
            stopping,
            durability: durability.clone(),
        });
        let retentions = [
            (Pruned::DoneWork, config.work_retention),
            (Pruned::Windows, config.history_retention),
            (Pruned::Tallies, config.history_retention),
            (Pruned::AuditTrail, config.audit_retention),
            (Pruned::LeaseHolders, LEASE_HOLDER_RETENTION),
            (Pruned::Reservations, config.settle_within),
            (Pruned::FullBuckets, FULL_BUCKET_GRACE),
            (Pruned::AdmitWindows, ADMIT_WINDOW_RETENTION),
        ];
        // Every background task is supervised: a panic restarts it
        // (`crate::supervise`) rather than leaving this replica with a
        // catalog or a key ring that never changes again.
        let metrics = state.metrics.clone();
        let bootstrap = {
            let (store, catalog, keys) = (store.clone(), catalog.clone(), keys.clone());
            let durable = (durability.clone(), metrics.clone());
            let sessions = sessions.clone();
            supervise("bootstrap", metrics.clone(), move || {
                let mirrors = (catalog.clone(), keys.clone());
                let stores = (store.clone(), sessions.clone());
                bootstrap(config.clone(), stores, mirrors, durable.clone())
            })
        };
        // Serve at once when the store is there; otherwise start not ready and
        // let the bootstrap task keep trying.
        let bootstrap_done = tokio::time::timeout(STARTUP_WAIT, async {
            while !catalog.is_loaded() && !bootstrap.is_finished() {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
        .await;
        if bootstrap_done.is_err() {
            tracing::warn!("store not ready at start-up; serving (not ready) and retrying");
        }
        let sync = {
            let (store, catalog, keys) = (store.clone(), catalog.clone(), keys.clone());
            let (durability, watched) = (durability.clone(), metrics.clone());
            let every = if sessions.is_some() {
                SYNC_EVERY
            } else {
                POLL_EVERY
            };
            supervise("catalog_sync", metrics.clone(), move || {
                let durable = (durability.clone(), watched.clone());
                sync_loop(
                    (store.clone(), every),
                    catalog.clone(),
                    keys.clone(),
                    clock.clone(),
                    durable,
                )
            })
        };
        let listen = sessions.map(|sessions| {
            let (store, failures) = (store.clone(), metrics.clone());
            supervise("catalog_listen", metrics.clone(), move || {
                listen_loop(
                    (store.clone(), sessions.clone()),
                    catalog.clone(),
                    keys.clone(),
                    failures.clone(),
                )
            })
        });
        let prune = {
            let (store, failures) = (store.clone(), metrics.clone());
            supervise("prune", metrics.clone(), move || {
                prune_loop(store.clone(), retentions, failures.clone())
            })
        };
        let background = [bootstrap, sync, prune].into_iter().chain(listen).collect();
        let (stop_flushing, stopped) = tokio::sync::watch::channel(false);
        let flusher = {
            let (store, ledger, failures) = (store.clone(), ledger.clone(), metrics.clone());
            supervise("tally_flush", metrics, move || {
                flush_loop(
                    store.clone(),
                    ledger.clone(),
                    stopped.clone(),
                    failures.clone(),
                )
            })
        };
        Ok(Self {
            listener,
            state,
            store,
            ledger,
            background,
            flusher: (flusher, stop_flushing),
            stop_streams,
        })
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.listener
            .local_addr()
            .expect("a bound listener has an address")
    }

    pub fn port(&self) -> u16 {
        self.local_addr().port()
    }

    pub async fn run_until_stopped(self) -> std::io::Result<()> {
        self.run_until(shutdown_signal()).await
    }

    /// Serves until `stop` resolves, then writes what is still pending:
    /// in-flight requests finish first, then the flusher's own flush, then
    /// the counts still to come.
    pub async fn run_until(
        self,
        stop: impl Future<Output = ()> + Send + 'static,
    ) -> std::io::Result<()> {
        tracing::info!(addr = %self.local_addr(), "listening");
        // The peer's address is the anonymous admission class's fallback.
        let app = http::app(self.state).into_make_service_with_connect_info::<SocketAddr>();
        let stop_streams = self.stop_streams;
        let stop = async move {
            stop.await;
            let _ = stop_streams.send(true);
        };
        let served = axum::serve(self.listener, app)
            .with_graceful_shutdown(stop)
            .await;
        for task in &self.background {
            task.abort();
        }
        let (flusher, stop_flushing) = self.flusher;
        let _ = stop_flushing.send(true);
        let _ = flusher.await;
        self.ledger
            .flush_before_exit(self.store.pool(), SHUTDOWN_GRACE)
            .await;
        served
    }
}

/// Creates the database, migrates and seeds, retrying until the store answers.
async fn bootstrap(
    config: Config,
    (store, sessions): (Store, Option<PgPool>),
    (catalog, keys): (Catalog, KeyRing),
    (durability, metrics): (DurabilityWatch, Metrics),
) {
    let mut delay = Duration::from_millis(250);
    loop {
        let stores = (&store, sessions.as_ref());
        match bootstrap_once(&config, stores, &catalog, &keys, (&durability, &metrics)).await {
            Ok(()) => return tracing::info!("store ready: migrations applied, catalog loaded"),
            Err(error) => {
                tracing::warn!(error = %format!("{error:#}"), "store not ready; retrying")
            }
        }
        tokio::time::sleep(delay).await;
        delay = (delay * 2).min(Duration::from_secs(5));
    }
}

async fn bootstrap_once(
    config: &Config,
    (store, sessions): (&Store, Option<&PgPool>),
    catalog: &Catalog,
    keys: &KeyRing,
    (durability, metrics): (&DurabilityWatch, &Metrics),
) -> anyhow::Result<()> {
    if config.migrate_on_start {
        let (Some(sessions), Some((_, url))) = (sessions, config.session_url()) else {
            anyhow::bail!("migrate_on_start needs a session: set direct_database_url");
        };
        store::ensure_database(url).await?;
        store::migrate(sessions).await?;
    }
    store::seed_catalog(
        store.pool(),
        config.hourly_ceiling,
        &config.quotas,
        &config.flows,
    )
    .await?;
    for (name, class) in &config.route_classes {
        if !store.seed_route_class(name, class).await? {
            tracing::debug!(route_class = %name, "route class already in the table; the table wins");
        }
    }
    // Read before the catalog, whose load makes the replica ready: its
    // readiness says what a failover can lose from the first answer on.
    durability.note(store.durability().await?, metrics);
    keys.refresh(store).await?;
    catalog.refresh(store).await?;
    Ok(())
}

async fn sync_loop(
    (store, every): (Store, Duration),
    catalog: Catalog,
    keys: KeyRing,
    clock: DbClock,
    (durability, metrics): (DurabilityWatch, Metrics),
) {
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut healthy = true;
    loop {
        tick.tick().await;
        let synced = async {
            clock.note(store.read_clock().await?);
            keys.refresh(&store).await?;
            catalog.refresh(&store).await?;
            // What a failover can lose, read again within seconds of
            // every reconnection (design.md §13).
            durability.note(store.durability().await?, &metrics);
            Ok::<_, sqlx::Error>(())
        }
        .await;
        match (synced, healthy) {
            (Ok(_), false) => {
                tracing::info!("store reachable again");
                healthy = true;
            }
            (Err(error), true) => {
                tracing::warn!(%error, "cannot sync catalog and clock from the store");
                healthy = false;
            }
            _ => {}
        }
        if !healthy {
            metrics.record_background_failure("catalog_sync");
        }
    }
}

/// Reloads the catalog as soon as the database announces a change, so a flip
/// made anywhere (SQL, CLI, API) is obeyed within milliseconds; so is a key
/// created or revoked (the `api_key` trigger notifies on the same channel).
///
/// It listens on `sessions` (PostgreSQL itself, or a session pooler): a
/// transaction pooler would hand the notifications to whichever client holds
/// the server connection, or to none.
async fn listen_loop(
    (store, sessions): (Store, PgPool),
    catalog: Catalog,
    keys: KeyRing,
    metrics: Metrics,
) {
    loop {
        if let Err(error) = listen_once(&store, &sessions, &catalog, &keys).await {
            tracing::debug!(%error, "catalog listener lost; reconnecting");
            metrics.record_background_failure("catalog_listen");
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

async fn listen_once(
    store: &Store,
    sessions: &PgPool,
    catalog: &Catalog,
    keys: &KeyRing,
) -> Result<(), sqlx::Error> {
    let mut listener = PgListener::connect_with(sessions).await?;
    listener.listen(CATALOG_CHANNEL).await?;
    loop {
        // Also after (re)connecting: changes made meanwhile were not announced to us.
        keys.refresh(store).await?;
        catalog.refresh(store).await?;
        // `None`: the connection dropped. It is a failure like any other:
        // counted, and the loop listens again on a new connection.
        if listener.try_recv().await?.is_none() {
            return Err(sqlx::Error::Protocol(
                "the listener's connection was lost".into(),
            ));
        }
    }
}

async fn flush_loop(
    store: Store,
    ledger: Ledger,
    mut stop: tokio::sync::watch::Receiver<bool>,
    metrics: Metrics,
) {
    let mut tick = tokio::time::interval(FLUSH_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = stop.wait_for(|stop| *stop) => return,
        }
        if let Err(error) = ledger.flush(store.pool()).await {
            tracing::debug!(%error, "tallies not written yet; kept for the next flush");
            metrics.record_background_failure("tally_flush");
        }
    }
}

/// What the pruning task deletes once it is older than its retention.
#[derive(Clone, Copy, Debug)]
enum Pruned {
    DoneWork,
    Windows,
    Tallies,
    AuditTrail,
    LeaseHolders,
    /// Reservations an hour past their time to settle.
    Reservations,
    /// Callers' admission buckets full again for a while.
    FullBuckets,
    /// Admission counts of windows long over.
    AdmitWindows,
}

impl Pruned {
    async fn prune(
        self,
        store: &Store,
        retention: Duration,
        batch: i64,
    ) -> Result<u64, sqlx::Error> {
        match self {
            Pruned::DoneWork => store.prune_done_work(retention, batch).await,
            Pruned::Windows => store.prune_windows(retention, batch).await,
            Pruned::Tallies => store.prune_tallies(retention, batch).await,
            Pruned::AuditTrail => store.prune_audit(retention, batch).await,
            Pruned::LeaseHolders => store.prune_lease_holders(retention, batch).await,
            Pruned::Reservations => store.prune_reservations(retention, batch).await,
            Pruned::FullBuckets => store.prune_admit_buckets(retention, batch).await,
            Pruned::AdmitWindows => store.prune_admit_windows(retention, batch).await,
        }
    }
}

/// Keeps the work registry and the history from growing forever: rows older
/// than their retention (0: kept forever) go, a batch at a time so no
/// statement holds many locks. Every replica runs it; they skip each other's rows.
async fn prune_loop(
    store: Store,
    retentions: impl IntoIterator<Item = (Pruned, Duration)>,
    metrics: Metrics,
) {
    const BATCH: i64 = 5000;
    let steps: Vec<_> = retentions
        .into_iter()
        .filter(|(_, retention)| !retention.is_zero())
        .collect();
    if steps.is_empty() {
        return;
    }
    let mut wait = Duration::ZERO;
    loop {
        tokio::time::sleep(wait).await;
        let mut failed = false;
        for &(what, retention) in &steps {
            loop {
                match what.prune(&store, retention, BATCH).await {
                    Ok(0) => break,
                    Ok(pruned) => {
                        tracing::info!(pruned, ?what, "rows past their retention deleted");
                        if pruned < BATCH as u64 {
                            break;
                        }
                    }
                    Err(error) => {
                        tracing::debug!(%error, ?what, "rows past their retention not pruned; soon again");
                        metrics.record_background_failure("prune");
                        failed = true;
                        break;
                    }
                }
            }
        }
        wait = if failed {
            (wait * 2).clamp(PRUNE_RETRY, PRUNE_EVERY)
        } else {
            PRUNE_EVERY
        };
    }
}

async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut signal) => {
                signal.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let terminate = std::future::pending::<()>();
    tokio::select! {
        _ = ctrl_c => {},
        _ = terminate => {},
    }
    tracing::info!("shutting down");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn the_listener_sends_without_waiting_for_acknowledgements() {
        let mut listener = bind(SocketAddr::from(([127, 0, 0, 1], 0))).await.unwrap();
        let addr = listener.local_addr().unwrap();
        let client = TcpStream::connect(addr).await.unwrap();
        assert!(!client.nodelay().unwrap(), "a fresh socket has Nagle on");
        let (accepted, _) = listener.accept().await;
        assert!(accepted.nodelay().unwrap());
    }
}
