//! The fault suite on a highly available store: Patroni managing three
//! PostgreSQL nodes with etcd, HAProxy routing to the leader by Patroni's
//! health check (`.ci/failover` starts them and says where). The replicas
//! know only the router. The leader's postmaster is SIGKILLed while grants
//! flow, then again with the standbys held a second behind; then, the
//! budget's window full, the leader is switched over by hand. Each time the
//! cluster is whole again (the old leader back as a standby) before the next.
//!
//! With `synchronous_mode` every guarantee must hold across all three: no
//! answered grant lost, no window over its ceiling, every replica deciding
//! again within 15 s of the new leader accepting writes, none restarted.
//! With asynchronous replication the loss is measured, not judged.
//!
//! The tests run only when `QUOTA_FAILOVER_URL` (the router) and
//! `QUOTA_FAILOVER_PATRONI` (the nodes' REST APIs, comma-separated) are set;
//! otherwise they say why and pass.

use std::io::Write;
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use serde_json::{json, Value};
use sqlx::{Connection, PgConnection, Row};

use crate::cluster::{Cluster, Database, Load};
use crate::history::{self, Answer, Call, Counted, Fault, Kind};
use crate::{REPLICAS, SETTLE};
use quota_arbiter::domain::decision::Outcome;

/// How long a probe may take: a write waiting for a synchronous standby
/// that is not there yet is not "accepting writes".
const PROBE: Duration = Duration::from_secs(2);
/// How long Patroni may take to elect a leader, or to bring the old one back
/// as a standby (pg_rewind or a new base backup).
const CONVERGE: Duration = Duration::from_secs(90);
/// The budget's ceiling while grants must flow through a fault.
const UNLIMITED: i64 = 1_000_000_000;
/// Grants left in the window when its ceiling is lowered to fill it.
const FILL: i64 = 500;
/// How long after the new leader takes writes a replica may take to decide.
const RECOVERY: Duration = Duration::from_secs(15);

#[tokio::test]
#[ignore = "needs the Patroni cluster of .ci/failover, whose leader it kills: run alone"]
async fn replicas_keep_every_guarantee_through_patroni_failovers_and_a_switchover() {
    let Some(patroni) = Patroni::from_env() else {
        return;
    };
    patroni.replication(Replication::Synchronous).await;
    let database = prepare(&patroni).await;
    let cluster = Cluster::start(&database.url, REPLICAS).await;
    let load = Load::start(&cluster);
    tokio::time::sleep(SETTLE).await;

    // (1) Grants flowing: one the new leader lacked would be under-counted.
    let mut crash = patroni.crash_leader(&database.url, false).await;
    crash.whole = Some(patroni.whole(Replication::Synchronous).await.1);
    tokio::time::sleep(SETTLE).await;
    // (1b) The same with the standbys a second behind: what asynchronous
    // replication loses (see below) must not be answered as granted.
    let mut behind = patroni.crash_leader(&database.url, true).await;
    behind.whole = Some(patroni.whole(Replication::Synchronous).await.1);
    tokio::time::sleep(SETTLE).await;
    // (2) The window full: a count the new leader lacked would be granted
    // again, over the ceiling.
    let full = fill_window(&database, &load).await;
    let mut switchover = patroni.switchover(&database.url).await;
    switchover.whole = Some(patroni.whole(Replication::Synchronous).await.1);
    tokio::time::sleep(SETTLE).await;

    let failovers = [crash, behind, switchover];
    let measured = stop(database, cluster, load, &failovers, full).await;
    measured.report("synchronous", &failovers);
    let violations = &measured.violations;
    assert!(
        violations.is_empty(),
        "{} violations, the first ones:\n{}",
        violations.len(),
        violations[..violations.len().min(20)].join("\n")
    );
}

/// Asynchronous replication, measured: the standbys are held behind (their
/// WAL senders stopped) for a second of load before the leader's postmaster
/// is SIGKILLed, as a slow network would hold them. Prints the grants
/// answered but lost and the over-grant they cause; fails only if the
/// cluster or the replicas do not come back.
#[tokio::test]
#[ignore = "needs the Patroni cluster of .ci/failover, whose leader it kills: run alone"]
async fn patroni_asynchronous_failover_loss_is_measured() {
    let Some(patroni) = Patroni::from_env() else {
        return;
    };
    patroni.replication(Replication::Asynchronous).await;
    let database = prepare(&patroni).await;
    let cluster = Cluster::start(&database.url, REPLICAS).await;
    let load = Load::start(&cluster);
    tokio::time::sleep(SETTLE).await;
    // Grants flowing while the standbys are held behind.
    let mut crash = patroni.crash_leader(&database.url, true).await;
    crash.whole = Some(patroni.whole(Replication::Asynchronous).await.1);
    tokio::time::sleep(SETTLE).await;
    // Then the window filled to FILL past the grants answered: every grant
    // the new leader lost is granted again, over that ceiling.
    let full = fill_window(&database, &load).await;
    tokio::time::sleep(SETTLE).await;

    let failovers = [crash];
    let measured = stop(database, cluster, load, &failovers, full).await;
    measured.report("asynchronous", &failovers);
    let violations = &measured.violations;
    eprintln!(
        "failover (asynchronous): {} violations{}{}",
        violations.len(),
        if violations.is_empty() {
            ""
        } else {
            ", the first ones:\n"
        },
        violations[..violations.len().min(10)].join("\n")
    );
    patroni.replication(Replication::Synchronous).await;
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Replication {
    Synchronous,
    Asynchronous,
}

/// A member of the Patroni cluster, as `GET /cluster` lists it.
#[derive(Clone, Debug)]
struct Member {
    name: String,
    role: String,
    state: String,
    /// Its REST API, e.g. `http://127.0.0.1:8011`.
    api: String,
    host: String,
    port: i32,
}

impl Member {
    fn of(value: &Value) -> Self {
        let text = |key: &str| value[key].as_str().unwrap_or_default().to_string();
        let api = text("api_url");
        Self {
            name: text("name"),
            role: text("role"),
            state: text("state"),
            api: api.strip_suffix("/patroni").unwrap_or(&api).to_string(),
            host: text("host"),
            port: value["port"].as_i64().unwrap_or_default() as i32,
        }
    }

    fn running(&self) -> bool {
        matches!(self.state.as_str(), "running" | "streaming")
    }
}

/// A leader change, and when each of its steps happened.
#[derive(Clone, Debug)]
struct Failover {
    name: &'static str,
    from: String,
    to: String,
    /// When the fault began (the standbys held, or the leader killed).
    began: Instant,
    /// The leader killed, or the switchover asked for.
    injected: Instant,
    /// The new leader committed a write through the router.
    writes: Instant,
    /// Three members running again, the old leader a standby.
    whole: Option<Instant>,
}

impl Failover {
    fn fault(&self) -> Fault {
        Fault {
            name: self.name,
            store_back: self.writes,
        }
    }
}

/// The cluster `.ci/failover` describes.
struct Patroni {
    /// The router, e.g. `postgres://postgres@127.0.0.1:5440/postgres`.
    url: String,
    apis: Vec<String>,
    http: reqwest::Client,
}

impl Patroni {
    fn from_env() -> Option<Self> {
        let url = std::env::var("QUOTA_FAILOVER_URL").ok();
        let apis = std::env::var("QUOTA_FAILOVER_PATRONI").ok();
        let (Some(url), Some(apis)) = (url, apis) else {
            // Past libtest's capture: the skip shows in every run.
            let _ = writeln!(
                std::io::stderr(),
                "skipped: QUOTA_FAILOVER_URL (the router to the Patroni leader) and \
                 QUOTA_FAILOVER_PATRONI (the nodes' REST APIs) are not both set; \
                 .ci/failover starts such a cluster and runs this test"
            );
            return None;
        };
        let apis = apis
            .split(',')
            .map(|api| api.trim().trim_end_matches('/').to_string())
            .filter(|api| !api.is_empty())
            .collect();
        let http = reqwest::Client::builder()
            .timeout(Duration::from_secs(60))
            .build()
            .unwrap();
        Some(Self { url, apis, http })
    }

    /// The members, from the first REST API that answers.
    async fn members(&self) -> Option<Vec<Member>> {
        for api in &self.apis {
            let Ok(response) = self.http.get(format!("{api}/cluster")).send().await else {
                continue;
            };
            let Ok(body) = response.json::<Value>().await else {
                continue;
            };
            if let Some(members) = body["members"].as_array() {
                return Some(members.iter().map(Member::of).collect());
            }
        }
        None
    }

    async fn leader(&self) -> Option<Member> {
        let members = self.members().await?;
        let mut leaders = members
            .into_iter()
            .filter(|m| m.role == "leader" && m.running());
        match (leaders.next(), leaders.next()) {
            (Some(leader), None) => Some(leader),
            _ => None,
        }
    }

    /// Sets `synchronous_mode` in the DCS and waits until the cluster has
    /// taken it up.
    async fn replication(&self, mode: Replication) {
        let body = json!({"synchronous_mode": mode == Replication::Synchronous});
        let mut patched = false;
        for api in &self.apis {
            let sent = self
                .http
                .patch(format!("{api}/config"))
                .json(&body)
                .send()
                .await;
            if sent.is_ok_and(|r| r.status().is_success()) {
                patched = true;
                break;
            }
        }
        assert!(patched, "no Patroni REST API took PATCH /config {body}");
        self.whole(mode).await;
    }

    /// Waits until three members run, one of them the leader, the router
    /// leads to it, and its `synchronous_standby_names` says `mode`. The
    /// leader, and when.
    async fn whole(&self, mode: Replication) -> (Member, Instant) {
        let until = Instant::now() + CONVERGE;
        loop {
            let last = match self.whole_now(mode).await {
                Ok(leader) => return (leader, Instant::now()),
                Err(why) => why,
            };
            assert!(
                Instant::now() < until,
                "the Patroni cluster whole within {CONVERGE:?}: {last}"
            );
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }

    async fn whole_now(&self, mode: Replication) -> Result<Member, String> {
        let members = self.members().await.ok_or("no REST API answers")?;
        let running = members.iter().filter(|m| m.running()).count();
        if running != members.len() || members.len() != self.apis.len() {
            return Err(format!("members {members:?}"));
        }
        let leader = self.leader().await.ok_or("no leader")?;
        let sync = members.iter().any(|m| m.role == "sync_standby");
        if sync != (mode == Replication::Synchronous) {
            return Err(format!("members {members:?}, {mode:?} wanted"));
        }
        let row = on_fresh_connection(
            &self.url,
            "SELECT inet_server_port(), pg_is_in_recovery(), \
             current_setting('synchronous_standby_names')",
        )
        .await?;
        let (port, recovery, names): (i32, bool, String) = (row.get(0), row.get(1), row.get(2));
        if port != leader.port || recovery {
            return Err(format!(
                "the router leads to {port} (in recovery: {recovery})"
            ));
        }
        if names.is_empty() == (mode == Replication::Synchronous) {
            return Err(format!(
                "synchronous_standby_names = '{names}' on the leader"
            ));
        }
        Ok(leader)
    }

    /// (1) SIGKILLs the leader's postmaster; with `hold_standbys`, first
    /// stops its WAL senders (SIGSTOP) for a second of load, so that the
    /// standbys fall behind. Returns once the new leader committed a write
    /// through the router.
    async fn crash_leader(&self, database_url: &str, hold_standbys: bool) -> Failover {
        let leader = self.leader().await.expect("a leader");
        let direct = self.direct_url(&leader);
        let data_directory: String = on_fresh_connection(&direct, "SHOW data_directory")
            .await
            .expect("the leader answers")
            .get(0);
        let pid_file = format!("{data_directory}/postmaster.pid");
        let postmaster = std::fs::read_to_string(&pid_file)
            .unwrap_or_else(|e| panic!("{pid_file}: {e} (the test runs where the nodes do)"));
        let postmaster = postmaster.lines().next().unwrap().trim().to_string();
        let mut senders = Vec::new();
        let began = Instant::now();
        if hold_standbys {
            let mut connection = PgConnection::connect(&direct).await.unwrap();
            senders = sqlx::query("SELECT pid FROM pg_stat_replication")
                .fetch_all(&mut connection)
                .await
                .unwrap()
                .iter()
                .map(|row| row.get::<i32, _>(0).to_string())
                .collect();
            assert!(!senders.is_empty(), "the leader has WAL senders to stop");
            assert!(
                signal("STOP", &senders),
                "SIGSTOP to the WAL senders {senders:?}"
            );
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
        let injected = Instant::now();
        assert!(
            signal("KILL", std::slice::from_ref(&postmaster)),
            "SIGKILL to the leader's postmaster {postmaster}"
        );
        if !senders.is_empty() {
            // Stopped, they would not notice their postmaster is gone.
            signal("KILL", &senders);
        }
        let (writes, to) = writes_again(database_url, leader.port).await;
        Failover {
            name: if hold_standbys {
                "SIGKILL of the leader's postmaster, standbys held behind"
            } else {
                "SIGKILL of the leader's postmaster"
            },
            from: leader.name,
            to,
            began,
            injected,
            writes,
            whole: None,
        }
    }

    /// (2) A planned switchover (`POST /switchover` to the leader's API).
    async fn switchover(&self, database_url: &str) -> Failover {
        let leader = self.leader().await.expect("a leader");
        let injected = Instant::now();
        let answer = self
            .http
            .post(format!("{}/switchover", leader.api))
            .json(&json!({"leader": leader.name}))
            .send()
            .await
            .expect("Patroni answers POST /switchover");
        let status = answer.status();
        let text = answer.text().await.unwrap_or_default();
        assert!(status.is_success(), "POST /switchover: {status} {text}");
        let (writes, to) = writes_again(database_url, leader.port).await;
        Failover {
            name: "switchover",
            from: leader.name,
            to,
            began: injected,
            injected,
            writes,
            whole: None,
        }
    }

    /// The router's URL with the member's address instead.
    fn direct_url(&self, member: &Member) -> String {
        let mut url = reqwest::Url::parse(&self.url).expect("QUOTA_FAILOVER_URL is a URL");
        url.set_host(Some(&member.host)).unwrap();
        url.set_port(Some(member.port as u16)).unwrap();
        url.to_string()
    }
}

/// Whether `kill -SIGNAL` reached every one of `pids`.
fn signal(signal: &str, pids: &[String]) -> bool {
    std::process::Command::new("kill")
        .arg(format!("-{signal}"))
        .args(pids)
        .status()
        .expect("kill runs")
        .success()
}

/// A fresh database on the cluster (migrated through the router, so on the
/// leader) with the budget unlimited, so that grants flow through the
/// faults; and the table the write probes fill.
async fn prepare(patroni: &Patroni) -> Database {
    let database = Database::fresh_on(&patroni.url).await;
    set_budget_ceiling(&database, UNLIMITED).await;
    sqlx::query(
        "CREATE TABLE failover_probe (
             at timestamptz NOT NULL DEFAULT clock_timestamp(),
             port integer NOT NULL)",
    )
    .execute(&database.pool)
    .await
    .unwrap();
    database
}

async fn set_budget_ceiling(database: &Database, ceiling: i64) {
    sqlx::query("UPDATE quota SET hourly_ceiling = $1 WHERE name = $2")
        .bind(ceiling)
        .bind(Kind::Enforced.quota())
        .execute(&database.pool)
        .await
        .unwrap();
}

/// The budget's window once its ceiling was lowered to [`FILL`] above the
/// grants answered in it so far, and that ceiling.
#[derive(Clone, Copy, Debug)]
struct Full {
    window: DateTime<Utc>,
    ceiling: i64,
}

/// Lowers the budget's ceiling to [`FILL`] above the grants answered in its
/// current window (the replicas reload the catalog on its notification) and
/// waits until the store counts the window full.
async fn fill_window(database: &Database, load: &Load) -> Full {
    let (window, answered) = {
        let calls = load.recorder.lock().unwrap();
        let window = calls
            .iter()
            .filter_map(granted_in)
            .max()
            .expect("grants were answered");
        let answered = calls
            .iter()
            .filter(|c| granted_in(c) == Some(window))
            .count() as i64;
        (window, answered)
    };
    let ceiling = answered + FILL;
    set_budget_ceiling(database, ceiling).await;
    let until = Instant::now() + Duration::from_secs(60);
    loop {
        // That window, or the next if the hour turns meanwhile.
        let count: Option<i64> = sqlx::query_scalar(
            "SELECT max(count) FROM quota_window WHERE quota = $1 AND window_start >= $2",
        )
        .bind(Kind::Enforced.quota())
        .bind(window)
        .fetch_one(&database.pool)
        .await
        .unwrap();
        if count.is_some_and(|count| count >= ceiling) {
            return Full { window, ceiling };
        }
        assert!(
            Instant::now() < until,
            "the budget window full within 60 s of its ceiling lowered to {ceiling}: {count:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The window of an enforced grant.
fn granted_in(call: &Call) -> Option<DateTime<Utc>> {
    match call.answer {
        Answer::Decided {
            outcome: Outcome::Granted,
            window_start,
        } if call.kind == Kind::Enforced => window_start,
        _ => None,
    }
}

/// Waits until a write through the router commits on a node other than
/// `old_port`: when, and which member (by port) took it.
async fn writes_again(database_url: &str, old_port: i32) -> (Instant, String) {
    let until = Instant::now() + CONVERGE;
    loop {
        let probe = on_fresh_connection(
            database_url,
            "INSERT INTO failover_probe (port) VALUES (inet_server_port()) RETURNING port",
        )
        .await;
        let last = match probe {
            Ok(row) if row.get::<i32, _>(0) != old_port => {
                return (Instant::now(), format!("port {}", row.get::<i32, _>(0)));
            }
            Ok(_) => "still the old leader".to_string(),
            Err(why) => why,
        };
        assert!(
            Instant::now() < until,
            "a new leader accepting writes within {CONVERGE:?}: {last}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// One statement on a connection of its own, within [`PROBE`].
async fn on_fresh_connection(url: &str, sql: &str) -> Result<sqlx::postgres::PgRow, String> {
    let attempt = async {
        let mut connection = PgConnection::connect(url)
            .await
            .map_err(|e| e.to_string())?;
        let row = sqlx::query(sql)
            .fetch_one(&mut connection)
            .await
            .map_err(|e| e.to_string())?;
        let _ = connection.close().await;
        Ok(row)
    };
    tokio::time::timeout(PROBE, attempt)
        .await
        .unwrap_or_else(|_| Err(format!("no answer within {PROBE:?}")))
}

/// What the history shows once the load and the replicas have stopped.
struct Measured {
    calls: Vec<Call>,
    ran: Duration,
    counted: Counted,
    violations: Vec<String>,
    full: Full,
    /// Grants answered in the window filled, and in the later ones.
    granted_full: i64,
}

/// Stops the load and the replicas (SIGTERM: their counts written), checks
/// the history against the store, drops the database.
async fn stop(
    database: Database,
    mut cluster: Cluster,
    load: Load,
    failovers: &[Failover],
    full: Full,
) -> Measured {
    let started = load.started;
    let (calls, ran) = load.stop().await;
    let dead = cluster.dead();
    assert!(dead.is_empty(), "replicas {dead:?} died on their own");
    let size = cluster.size();
    // The causes of the 500s, which the answers do not carry.
    let failed_requests = cluster
        .log_lines()
        .into_iter()
        .enumerate()
        .flat_map(|(slot, lines)| {
            lines
                .into_iter()
                .filter(|line| line.contains("\"request failed\""))
                .map(move |line| format!("replica {slot}: {line}"))
        })
        .collect::<Vec<_>>();
    cluster.stop().await;
    let counted = database.counted().await;
    let faults: Vec<Fault> = failovers.iter().map(Failover::fault).collect();
    let checked = history::check(&calls, UNLIMITED, &faults, None, &counted, size).violations;
    let mut violations = Vec::new();
    // When the failures other than 503 came, against the faults' timeline.
    let since = |at: Instant| at.saturating_duration_since(started);
    for call in &calls {
        if let Answer::Failed { status, .. } = call.answer {
            if status != 503 {
                let during = failovers
                    .iter()
                    .rev()
                    .find(|f| f.began <= call.answered)
                    .filter(|f| call.answered <= f.writes + RECOVERY)
                    .map_or("no fault", |f| f.name);
                violations.push(format!(
                    "{status} from replica {} at +{:.3?} ({during}; faults: {})",
                    call.replica,
                    since(call.answered),
                    failovers
                        .iter()
                        .map(|f| format!(
                            "{} +{:.3?}..+{:.3?}",
                            f.name,
                            since(f.began),
                            since(f.writes)
                        ))
                        .collect::<Vec<_>>()
                        .join(", ")
                ));
            }
        }
    }
    violations.truncate(5);
    violations.extend(failed_requests.into_iter().take(5));
    violations.extend(checked);
    // The windows from the one filled on: under the lowered ceiling.
    let mut granted = std::collections::BTreeMap::<DateTime<Utc>, i64>::new();
    for window in calls.iter().filter_map(granted_in) {
        if window >= full.window {
            *granted.entry(window).or_default() += 1;
        }
    }
    for (window, n) in &granted {
        if *n > full.ceiling {
            violations.push(format!(
                "window {window}: {n} granted, ceiling {} (lowered to fill it)",
                full.ceiling
            ));
        }
    }
    database.drop_database().await;
    Measured {
        calls,
        ran,
        counted,
        violations,
        full,
        granted_full: granted.get(&full.window).copied().unwrap_or(0),
    }
}

impl Measured {
    /// The figures: per leader change, when writes and decisions resumed;
    /// answered against stored per quota.
    fn report(&self, mode: &str, failovers: &[Failover]) {
        for failover in failovers {
            let writes = failover.writes.duration_since(failover.injected);
            let deciding = (0..REPLICAS)
                .map(|replica| back_to_deciding(&self.calls, replica, failover.writes))
                .collect::<Option<Vec<_>>>()
                .and_then(|each| each.into_iter().max());
            let until = failover.writes + deciding.unwrap_or_default();
            let refused = self
                .calls
                .iter()
                .filter(|c| c.kind == Kind::Enforced && c.sent >= failover.began)
                .filter(|c| c.answered <= until)
                .filter(|c| matches!(c.answer, Answer::Failed { status: 503, .. }))
                .count();
            let whole = failover.whole.map_or("-".into(), |w| {
                format!("{:.1?}", w.duration_since(failover.injected))
            });
            let held = failover.injected.duration_since(failover.began);
            eprintln!(
                "failover ({mode}) {}: {} -> {}; the new leader committed a write {writes:.1?} \
                 after the fault, every replica decided again {} later; {refused} enforced \
                 calls answered 503 from the fault's start{} until then; the cluster whole \
                 again after {whole}",
                failover.name,
                failover.from,
                failover.to,
                deciding.map_or("never".into(), |d| format!("{d:.1?}")),
                if held > Duration::from_millis(1) {
                    format!(" (the standbys held {held:.1?} before the kill)")
                } else {
                    String::new()
                },
            );
        }
        let answered = |kind: Kind, outcome: Outcome| {
            self.calls
                .iter()
                .filter(|c| c.kind == kind)
                .filter(|c| matches!(c.answer, Answer::Decided { outcome: o, .. } if o == outcome))
                .count() as i64
        };
        let granted = answered(Kind::Enforced, Outcome::Granted);
        let bypassed = answered(Kind::Due, Outcome::Bypassed);
        let in_store = |kind: Kind| self.counted.get(kind.quota()).copied().unwrap_or(0);
        let Full { window, ceiling } = self.full;
        eprintln!(
            "failover ({mode}): {} requests in {:.1?}; budget: {granted} grants answered, {} in \
             the store ({}); deadline: {bypassed} bypasses answered, {} in the store ({}); \
             window {window} filled: {} granted, ceiling {ceiling} (over-grant {}); answers {}",
            self.calls.len(),
            self.ran,
            in_store(Kind::Enforced),
            gap(in_store(Kind::Enforced) - granted),
            in_store(Kind::Due),
            gap(in_store(Kind::Due) - bypassed),
            self.granted_full,
            (self.granted_full - ceiling).max(0),
            history::summary(&self.calls),
        );
    }
}

fn gap(stored_minus_answered: i64) -> String {
    match stored_minus_answered {
        0 => "none lost".into(),
        n if n > 0 => format!("none lost; {n} more counted, their callers answered 503"),
        n => format!("at least {} lost", -n),
    }
}

/// How long after `since` replica `replica` answered an enforced decision.
fn back_to_deciding(calls: &[Call], replica: usize, since: Instant) -> Option<Duration> {
    calls
        .iter()
        .filter(|c| c.replica == replica && c.kind == Kind::Enforced && c.sent >= since)
        .filter(|c| matches!(c.answer, Answer::Decided { .. }))
        .map(|c| c.answered.duration_since(since))
        .min()
}
