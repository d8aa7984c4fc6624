//! The fault suite: three real replicas on one fresh database under
//! concurrent load, every request and answer recorded, while the store is
//! broken in the ways production breaks it; then the history is checked
//! against every guarantee (design.md §3). `QUOTA_FAULT_SOAK=1` repeats the
//! faults for a longer run.
//!
//! The PostgreSQL restart cuts every other test's connections: it is
//! `#[ignore]`d and run alone (`cargo test --test faults -- --ignored`).
//! So are the Patroni failover tests (failover.rs), which skip unless
//! `.ci/failover` has started their cluster.

#[path = "../it/helpers.rs"]
#[allow(dead_code)]
mod helpers;

mod cluster;
mod failover;
mod history;

use std::time::{Duration, Instant};

use cluster::{fault, Cluster, Database, Load, CEILING};
use history::{Fault, Killed};

const REPLICAS: usize = 3;
/// Load before the first fault, between faults and after the last one.
const SETTLE: Duration = Duration::from_millis(2500);

fn soak() -> bool {
    std::env::var("QUOTA_FAULT_SOAK").is_ok_and(|v| v == "1")
}

#[tokio::test]
async fn replicas_keep_every_guarantee_through_backend_kills_a_held_row_and_a_sigkill() {
    let rounds = if soak() { 10 } else { 1 };
    let database = Database::fresh().await;
    let mut cluster = Cluster::start(&database.url, REPLICAS).await;
    let load = Load::start(&cluster);
    tokio::time::sleep(SETTLE).await;
    let (mut faults, mut killed) = (Vec::new(), None);
    for round in 0..rounds {
        for _ in 0..3 {
            let terminated = database.terminate_backends().await;
            assert!(terminated > 0, "the replicas had backends to terminate");
            faults.push(fault("pg_terminate_backend"));
            tokio::time::sleep(SETTLE).await;
        }
        database.hold_window(Duration::from_secs(3)).await;
        faults.push(fault("window row held for 3 s"));
        tokio::time::sleep(SETTLE).await;
        if round == 0 {
            killed = Some(cluster.kill_and_restart(1, &database.url).await);
            tokio::time::sleep(SETTLE).await;
        }
    }
    finish(database, cluster, load, &faults, killed).await;
}

#[tokio::test]
#[ignore = "restarts PostgreSQL, cutting every other test's connections: run alone"]
async fn replicas_keep_every_guarantee_through_a_postgresql_restart() {
    let rounds = if soak() { 5 } else { 1 };
    let database = Database::fresh().await;
    let cluster = Cluster::start(&database.url, REPLICAS).await;
    let load = Load::start(&cluster);
    tokio::time::sleep(SETTLE).await;
    let mut faults = Vec::new();
    for _ in 0..rounds {
        restart_postgres().await;
        faults.push(fault("PostgreSQL restart"));
        tokio::time::sleep(2 * SETTLE).await;
    }
    finish(database, cluster, load, &faults, None).await;
}

/// Stops the load and the replicas (SIGTERM: their counts written), then
/// checks the history against the store.
async fn finish(
    database: Database,
    mut cluster: Cluster,
    load: Load,
    faults: &[Fault],
    killed: Option<Killed>,
) {
    let (calls, ran) = load.stop().await;
    let dead = cluster.dead();
    assert!(dead.is_empty(), "replicas {dead:?} died on their own");
    let size = cluster.size();
    cluster.stop().await;
    let counted = database.counted().await;
    let verdict = history::check(&calls, CEILING, faults, killed, &counted, size);
    eprintln!(
        "fault suite: {} requests in {ran:.1?} ({:.0}/s), {} faults injected{}, \
         slowest return to deciding {:?}; most granted in a window {} of {CEILING}; \
         in the store {counted:?}; answers {}",
        calls.len(),
        calls.len() as f64 / ran.as_secs_f64(),
        faults.len(),
        if killed.is_some() { " + 1 SIGKILL" } else { "" },
        verdict.worst_recovery,
        history::most_granted(&calls),
        history::summary(&calls),
    );
    database.drop_database().await;
    assert!(
        verdict.violations.is_empty(),
        "{} violations, the first ones:\n{}",
        verdict.violations.len(),
        verdict.violations[..verdict.violations.len().min(20)].join("\n")
    );
}

/// (d) Restarts the Debian cluster and waits until it accepts connections.
async fn restart_postgres() {
    let version = std::fs::read_dir("/etc/postgresql")
        .expect("a Debian PostgreSQL cluster")
        .filter_map(|entry| entry.ok()?.file_name().into_string().ok())
        .max()
        .expect("a cluster version");
    let restarted = tokio::process::Command::new("pg_ctlcluster")
        .args(["--skip-systemctl-redirect", &version, "main", "restart"])
        .status()
        .await
        .expect("pg_ctlcluster runs");
    assert!(restarted.success(), "pg_ctlcluster restart: {restarted}");
    let host_port = helpers::postgres_host_port();
    let (host, port) = host_port.split_once(':').unwrap_or((&host_port, "5432"));
    let until = Instant::now() + Duration::from_secs(30);
    loop {
        let ready = tokio::process::Command::new("pg_isready")
            .args(["-q", "-h", host, "-p", port])
            .status()
            .await
            .expect("pg_isready runs");
        if ready.success() {
            return;
        }
        assert!(Instant::now() < until, "PostgreSQL ready again within 30 s");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
