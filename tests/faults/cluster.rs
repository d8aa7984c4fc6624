//! Three real replicas on a database of their own, the callers that load
//! them, and the faults.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use chrono::Utc;
use serde_json::json;
use sqlx::postgres::PgPoolOptions;
use sqlx::PgPool;

use crate::helpers::{create_flow, lock_window, Replica};
use crate::history::{answer_of, Answer, Call, Counted, Fault, Killed, Kind, Recorder};

pub const CEILING: i64 = 1000;
const CALLERS: usize = 24;

/// A fresh database, migrated, with an enforced budget quota (`invoice`), an
/// enforced quota its deadline calls outrank (`payroll`, ceiling 10) and a
/// third spent by an observed and a count-mode flow.
pub struct Database {
    pub url: String,
    pub name: String,
    pub pool: PgPool,
    admin: PgPool,
}

impl Database {
    pub async fn fresh() -> Self {
        let base = std::env::var("DATABASE_URL").expect("DATABASE_URL is set for the tests");
        Self::fresh_on(&base).await
    }

    /// [`Database::fresh`] on the server of `base`, a URL with a database.
    pub async fn fresh_on(base: &str) -> Self {
        let admin = PgPoolOptions::new()
            .max_connections(2)
            .connect(base)
            .await
            .expect("the test PostgreSQL answers");
        let name = format!(
            "quota_arbiter_faults_{}_{}",
            std::process::id(),
            Utc::now().timestamp_micros()
        );
        sqlx::query(&format!(r#"CREATE DATABASE "{name}""#))
            .execute(&admin)
            .await
            .unwrap();
        let (prefix, _) = base.rsplit_once('/').expect("a URL with a database");
        let url = format!("{prefix}/{name}");
        let pool = PgPoolOptions::new()
            .max_connections(4)
            .connect(&url)
            .await
            .unwrap();
        quota_arbiter::store::migrate(&pool).await.unwrap();
        create_flow(&pool, Kind::Enforced.quota(), CEILING, "invoice", "enforce").await;
        create_flow(&pool, Kind::Due.quota(), 10, "payroll", "enforce").await;
        let feed = Kind::Observed.quota();
        create_flow(&pool, feed, 1_000_000, "status-report", "observe").await;
        create_flow(&pool, feed, 1_000_000, "page-view", "count").await;
        Self {
            url,
            name,
            pool,
            admin,
        }
    }

    /// (a) Terminates every backend of this database: the replicas' pools,
    /// listeners and flushes alike.
    pub async fn terminate_backends(&self) -> i64 {
        sqlx::query_scalar(
            "SELECT count(*) FILTER (WHERE pg_terminate_backend(pid))
             FROM pg_stat_activity WHERE datname = $1 AND pid <> pg_backend_pid()",
        )
        .bind(&self.name)
        .fetch_one(&self.admin)
        .await
        .unwrap()
    }

    /// (b) Holds the budget window row from another session for `hold`.
    pub async fn hold_window(&self, hold: Duration) {
        let held = lock_window(&self.pool, Kind::Enforced.quota()).await;
        tokio::time::sleep(hold).await;
        held.commit().await.unwrap();
    }

    /// Slots in the store, summed over windows, per quota.
    pub async fn counted(&self) -> Counted {
        let mut counted = Counted::new();
        for kind in Kind::ALL {
            let sum = sqlx::query_scalar(
                "SELECT coalesce(sum(count), 0)::bigint FROM quota_window WHERE quota = $1",
            )
            .bind(kind.quota())
            .fetch_one(&self.pool)
            .await
            .unwrap();
            counted.insert(kind.quota(), sum);
        }
        counted
    }

    pub async fn drop_database(self) {
        self.pool.close().await;
        sqlx::query(&format!(r#"DROP DATABASE "{}" WITH (FORCE)"#, self.name))
            .execute(&self.admin)
            .await
            .unwrap();
    }
}

/// The replicas, by slot; a slot's process is replaced after a SIGKILL.
pub struct Cluster {
    replicas: Vec<Replica>,
    /// Base URL and generation of each slot, as the callers see them.
    routes: Arc<Mutex<Vec<(String, u32)>>>,
}

impl Cluster {
    pub async fn start(url: &str, size: usize) -> Self {
        let mut replicas = Vec::new();
        for _ in 0..size {
            replicas.push(Replica::spawn(url).await);
        }
        let routes = replicas.iter().map(|r| (r.base.clone(), 0)).collect();
        Self {
            replicas,
            routes: Arc::new(Mutex::new(routes)),
        }
    }

    pub fn size(&self) -> usize {
        self.replicas.len()
    }

    /// (c) SIGKILLs the replica in `slot` and starts another in its place.
    pub async fn kill_and_restart(&mut self, slot: usize, url: &str) -> Killed {
        let at = Instant::now();
        self.replicas[slot].sigkill().await;
        let replacement = Replica::spawn(url).await;
        let restarted = Instant::now();
        {
            let mut routes = self.routes.lock().unwrap();
            let generation = routes[slot].1 + 1;
            routes[slot] = (replacement.base.clone(), generation);
        }
        self.replicas[slot] = replacement;
        Killed {
            replica: slot,
            at,
            restarted,
        }
    }

    /// What each replica has logged since it listened (JSON lines), by slot.
    pub fn log_lines(&self) -> Vec<Vec<String>> {
        self.replicas.iter().map(Replica::log_lines).collect()
    }

    /// Replicas that are not running any more (none should be).
    pub fn dead(&mut self) -> Vec<usize> {
        (0..self.replicas.len())
            .filter(|&i| !self.replicas[i].is_running())
            .collect()
    }

    /// SIGTERM to every replica; each must exit cleanly (its counts written).
    pub async fn stop(self) {
        for replica in &self.replicas {
            replica.terminate();
        }
        for mut replica in self.replicas {
            let status = replica.exited(Duration::from_secs(20)).await;
            assert!(
                status.success(),
                "a replica exits cleanly on SIGTERM: {status}"
            );
        }
    }
}

/// Callers asking round-robin over the flows and the replicas until stopped.
pub struct Load {
    stop: Arc<AtomicBool>,
    callers: Vec<tokio::task::JoinHandle<()>>,
    pub recorder: Recorder,
    pub started: Instant,
}

impl Load {
    pub fn start(cluster: &Cluster) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let recorder = Recorder::default();
        let next = Arc::new(AtomicUsize::new(0));
        let client = reqwest::Client::builder()
            .timeout(Duration::from_secs(10))
            .build()
            .unwrap();
        let callers = (0..CALLERS)
            .map(|_| {
                let (stop, recorder, next, client) =
                    (stop.clone(), recorder.clone(), next.clone(), client.clone());
                let routes = cluster.routes.clone();
                tokio::spawn(async move {
                    while !stop.load(Ordering::Relaxed) {
                        let i = next.fetch_add(1, Ordering::Relaxed);
                        let call = ask(&client, &routes, i).await;
                        let lost = matches!(call.answer, Answer::Lost(_));
                        recorder.lock().unwrap().push(call);
                        if lost {
                            // A replica gone: do not spin on refused connections.
                            tokio::time::sleep(Duration::from_millis(50)).await;
                        }
                    }
                })
            })
            .collect();
        Self {
            stop,
            callers,
            recorder,
            started: Instant::now(),
        }
    }

    /// Stops the callers; the history and how long it ran.
    pub async fn stop(self) -> (Vec<Call>, Duration) {
        self.stop.store(true, Ordering::Relaxed);
        for caller in self.callers {
            caller.await.unwrap();
        }
        let ran = self.started.elapsed();
        let calls = std::mem::take(&mut *self.recorder.lock().unwrap());
        (calls, ran)
    }
}

/// The `i`-th call: its flow and replica round-robin (coprime strides, so
/// every flow reaches every replica).
async fn ask(client: &reqwest::Client, routes: &Mutex<Vec<(String, u32)>>, i: usize) -> Call {
    let kind = Kind::ALL[i % Kind::ALL.len()];
    let (base, generation, replica) = {
        let routes = routes.lock().unwrap();
        let replica = (i / Kind::ALL.len()) % routes.len();
        let (base, generation) = routes[replica].clone();
        (base, generation, replica)
    };
    let body = match kind {
        Kind::Enforced => json!({"flow": "invoice"}),
        // Already past: due within the horizon by any clock.
        Kind::Due => json!({"flow": "payroll", "deadline": "2020-01-01T00:00:00Z"}),
        Kind::Observed => json!({"flow": "status-report"}),
        Kind::Counted => json!({"flow": "page-view"}),
    };
    let sent = Instant::now();
    let response = client
        .post(format!("{base}/v1/reserve"))
        .json(&body)
        .send()
        .await;
    let answer = answer_of(response).await;
    Call {
        kind,
        replica,
        generation,
        sent,
        answered: Instant::now(),
        answer,
    }
}

/// A fault with the instant the store was whole again.
pub fn fault(name: &'static str) -> Fault {
    Fault {
        name,
        store_back: Instant::now(),
    }
}
