//! Test harness: the app in-process on port 0, real server processes, a TCP
//! proxy that can cut the store away, and a way to move the database clock.

use std::net::SocketAddr;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use quota_arbiter::config::Config;
use quota_arbiter::domain::decision::Decision;
use quota_arbiter::domain::Secret;
use quota_arbiter::startup::Application;
use serde_json::{json, Value};
use sqlx::postgres::PgPoolOptions;
use sqlx::PgPool;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::oneshot;

pub const ADMIN_TOKEN: &str = "test-admin-token";

pub fn test_config() -> Config {
    Config {
        listen: SocketAddr::from(([127, 0, 0, 1], 0)),
        admin_token: Some(Secret(ADMIN_TOKEN.into())),
        // #[sqlx::test] has already created and migrated the database.
        migrate_on_start: false,
        ..Config::default()
    }
}

/// The app, in this process, serving on an ephemeral port.
pub struct TestApp {
    pub base: String,
    pub client: reqwest::Client,
    _stop: oneshot::Sender<()>,
}

impl TestApp {
    pub async fn spawn(pool: PgPool) -> Self {
        Self::spawn_with(pool, test_config()).await
    }

    pub async fn spawn_with(pool: PgPool, config: Config) -> Self {
        let app = Application::build_with_pool(config, pool)
            .await
            .expect("app builds");
        let base = format!("http://{}", app.local_addr());
        let (stop, stopped) = oneshot::channel::<()>();
        tokio::spawn(app.run_until(async {
            let _ = stopped.await;
        }));
        Self {
            base,
            client: reqwest::Client::new(),
            _stop: stop,
        }
    }

    pub async fn post_reserve(&self, body: Value) -> reqwest::Response {
        post_reserve(&self.client, &self.base, body).await
    }

    pub async fn post_batch(&self, body: Value) -> reqwest::Response {
        post_batch(&self.client, &self.base, body).await
    }

    pub async fn reserve(&self, body: Value) -> Decision {
        let response = self.post_reserve(body).await;
        assert_eq!(response.status(), 200, "reserve answers 200");
        response.json().await.expect("a decision")
    }

    /// `POST path` with a JSON body, expecting 200 and a JSON answer.
    pub async fn post_json(&self, path: &str, body: Value) -> Value {
        let response = self
            .post(path)
            .json(&body)
            .send()
            .await
            .expect("request sent");
        assert_eq!(response.status(), 200, "POST {path} {body}");
        response.json().await.expect("a JSON answer")
    }

    /// An admin call, expecting 200 and a JSON answer.
    pub async fn admin_json(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<Value>,
    ) -> Value {
        let mut request = self.admin(method.clone(), path);
        if let Some(body) = body {
            request = request.json(&body);
        }
        let response = request.send().await.expect("request sent");
        assert_eq!(response.status(), 200, "{method} {path}");
        response.json().await.expect("a JSON answer")
    }

    /// A call to `path` (from `/`) without a token: the worker and public routes.
    pub fn request(&self, method: reqwest::Method, path: &str) -> reqwest::RequestBuilder {
        self.client.request(method, format!("{}{path}", self.base))
    }

    pub fn get(&self, path: &str) -> reqwest::RequestBuilder {
        self.request(reqwest::Method::GET, path)
    }

    pub fn post(&self, path: &str) -> reqwest::RequestBuilder {
        self.request(reqwest::Method::POST, path)
    }

    pub fn admin(&self, method: reqwest::Method, path: &str) -> reqwest::RequestBuilder {
        self.request(method, path).bearer_auth(ADMIN_TOKEN)
    }
}

pub async fn post_reserve(client: &reqwest::Client, base: &str, body: Value) -> reqwest::Response {
    client
        .post(format!("{base}/v1/reserve"))
        .json(&body)
        .send()
        .await
        .expect("request sent")
}

pub async fn post_batch(client: &reqwest::Client, base: &str, body: Value) -> reqwest::Response {
    client
        .post(format!("{base}/v1/reserve/batch"))
        .json(&body)
        .send()
        .await
        .expect("request sent")
}

/// Each item's outcome of a batch answer, in order, after checking that an
/// `unavailable` item says when to ask again.
pub async fn batch_outcomes(answer: reqwest::Response) -> Vec<String> {
    let body: Value = answer.json().await.expect("a batch answer");
    let decisions = body["decisions"].as_array().expect("decisions");
    for decision in decisions {
        if decision["outcome"] == "unavailable" {
            assert_eq!(decision["retry_after_seconds"], 2, "{decision}");
        }
    }
    decisions
        .iter()
        .map(|d| d["outcome"].as_str().expect("an outcome").to_string())
        .collect()
}

/// The Prometheus text a server exposes at `/metrics`.
/// One caller per (quota, flow), all at once: each decision with the quota
/// it was asked of, in the order given.
pub async fn reserve_all_at_once(
    app: &Arc<TestApp>,
    asks: impl IntoIterator<Item = (&'static str, &'static str)>,
) -> Vec<(&'static str, Decision)> {
    let callers: Vec<_> = asks
        .into_iter()
        .map(|(quota, flow)| {
            let app = app.clone();
            tokio::spawn(async move { (quota, app.reserve(json!({"flow": flow})).await) })
        })
        .collect();
    let mut decided = Vec::new();
    for caller in callers {
        decided.push(caller.await.expect("the caller finished"));
    }
    decided
}

/// The value of the header `name`, checked to be given once at most.
pub fn header_once(response: &reqwest::Response, name: &str) -> Option<String> {
    let mut values = response.headers().get_all(name).iter();
    let value = values.next().map(|v| v.to_str().unwrap().to_string());
    assert!(values.next().is_none(), "{name} given once at most");
    value
}

pub async fn metrics_text(client: &reqwest::Client, base: &str) -> String {
    client
        .get(format!("{base}/metrics"))
        .send()
        .await
        .expect("request sent")
        .text()
        .await
        .expect("a text answer")
}

/// Creates a quota and a flow straight in the tables.
pub async fn create_flow(pool: &PgPool, quota: &str, ceiling: i64, flow: &str, mode: &str) {
    sqlx::query("INSERT INTO quota (name, hourly_ceiling) VALUES ($1, $2) ON CONFLICT (name) DO UPDATE SET hourly_ceiling = $2")
        .bind(quota)
        .bind(ceiling)
        .execute(pool)
        .await
        .unwrap();
    sqlx::query("INSERT INTO flow (name, quota, mode) VALUES ($1, $2, $3)")
        .bind(flow)
        .bind(quota)
        .bind(mode)
        .execute(pool)
        .await
        .unwrap();
}

/// Sets limits of `quota` straight in its row, e.g. `"rate = 4, burst = 5"`.
pub async fn set_limits(pool: &PgPool, quota: &str, settings: &str) {
    sqlx::query(&format!("UPDATE quota SET {settings} WHERE name = $1"))
        .bind(quota)
        .execute(pool)
        .await
        .unwrap();
}

/// `quota` with a priority-3 flow `sync` and a priority-1 flow `invoice`.
pub async fn sync_and_invoice(pool: &PgPool, quota: &str, ceiling: i64) {
    create_flow(pool, quota, ceiling, "sync", "enforce").await;
    create_flow(pool, quota, ceiling, "invoice", "enforce").await;
    sqlx::query("UPDATE flow SET priority = 3 WHERE name = 'sync'")
        .execute(pool)
        .await
        .unwrap();
    sqlx::query("UPDATE flow SET priority = 1 WHERE name = 'invoice'")
        .execute(pool)
        .await
        .unwrap();
}

/// How many hold times `flow`'s average lease duration has taken in: one
/// per lease freed by a report, a done or release, or an undone late grant.
pub async fn hold_time_samples(pool: &PgPool, flow: &str) -> i64 {
    sqlx::query_scalar("SELECT samples FROM flow_lease_duration WHERE flow = $1")
        .bind(flow)
        .fetch_one(pool)
        .await
        .unwrap()
}

/// Slots recorded in the current window of `quota` (0 when it has no row).
pub async fn current_count(pool: &PgPool, quota: &str) -> i64 {
    sqlx::query_scalar(
        "SELECT coalesce((SELECT count FROM quota_window
                          WHERE quota = $1 AND window_start = window_start_of(arbiter_now())), 0)",
    )
    .bind(quota)
    .fetch_one(pool)
    .await
    .unwrap()
}

/// Holds the current window row of `quota` (`SELECT … FOR UPDATE`) until
/// the transaction returned ends: every statement that spends it waits.
pub async fn lock_window(pool: &PgPool, quota: &str) -> sqlx::Transaction<'static, sqlx::Postgres> {
    let mut tx = pool.begin().await.unwrap();
    sqlx::query(
        "SELECT count FROM quota_window
         WHERE quota = $1 AND window_start = window_start_of(arbiter_now()) FOR UPDATE",
    )
    .bind(quota)
    .fetch_one(&mut *tx)
    .await
    .unwrap();
    tx
}

/// Polls `probe` until it returns `want` or `timeout` passes; returns the last value.
pub async fn eventually<T, F, Fut>(timeout: Duration, want: T, mut probe: F) -> T
where
    T: PartialEq + std::fmt::Debug,
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = T>,
{
    let until = tokio::time::Instant::now() + timeout;
    loop {
        let got = probe().await;
        if got == want || tokio::time::Instant::now() >= until {
            return got;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

pub async fn database_name(pool: &PgPool) -> String {
    sqlx::query_scalar("SELECT current_database()::text")
        .fetch_one(pool)
        .await
        .unwrap()
}

/// A URL for this test's database, for server processes and proxies.
pub async fn database_url(pool: &PgPool, host_port: &str) -> String {
    url_of_database(&database_name(pool).await, host_port)
}

/// The URL of database `name` on the test server, reached at `host_port`.
pub fn url_of_database(name: &str, host_port: &str) -> String {
    let base = std::env::var("DATABASE_URL").expect("DATABASE_URL is set for the tests");
    let (scheme, rest) = base.split_once("://").expect("a URL");
    let user = rest
        .rsplit_once('@')
        .map(|(user, _)| format!("{user}@"))
        .unwrap_or_default();
    format!("{scheme}://{user}{host_port}/{name}")
}

/// The host:port of the test PostgreSQL server.
pub fn postgres_host_port() -> String {
    let base = std::env::var("DATABASE_URL").expect("DATABASE_URL is set for the tests");
    let rest = base.split_once("://").unwrap().1;
    let host = rest.rsplit_once('@').map_or(rest, |(_, host)| host);
    host.split('/').next().unwrap().to_string()
}

/// The database's clock as every deciding statement reads it (`arbiter_now()`,
/// pinned or not).
pub async fn db_now(pool: &PgPool) -> chrono::DateTime<chrono::Utc> {
    sqlx::query_scalar("SELECT arbiter_now()")
        .fetch_one(pool)
        .await
        .unwrap()
}

/// Moves this database's clock so that `arbiter_now()` reads `minutes` past
/// the current UTC hour (time keeps running from there), and returns a pool
/// whose connections see it. The public API takes no clock from the caller.
pub async fn pin_clock(pool: &PgPool, minutes: i32) -> PgPool {
    pin_clock_at(pool, f64::from(minutes) * 60.0).await
}

/// [`pin_clock`] to `seconds` past the current UTC hour (3597.5: two and a
/// half seconds before the next one).
pub async fn pin_clock_at(pool: &PgPool, seconds: f64) -> PgPool {
    let offset: String = sqlx::query_scalar(
        "SELECT ((date_trunc('hour', now(), 'UTC') + make_interval(secs => $1)) - now())::text",
    )
    .bind(seconds)
    .fetch_one(pool)
    .await
    .unwrap();
    offset_clock(pool, &offset).await
}

/// Moves this database's clock to `at` (an RFC 3339 instant; time keeps
/// running from there), and returns a pool whose connections see it.
pub async fn pin_clock_to(pool: &PgPool, at: &str) -> PgPool {
    let offset: String = sqlx::query_scalar("SELECT ($1::timestamptz - now())::text")
        .bind(at)
        .fetch_one(pool)
        .await
        .unwrap();
    offset_clock(pool, &offset).await
}

/// Moves this database's clock by `offset` (an interval), for new
/// connections: a pool of them.
async fn offset_clock(pool: &PgPool, offset: &str) -> PgPool {
    let db = database_name(pool).await;
    sqlx::query(&format!(
        r#"ALTER DATABASE "{db}" SET quota_arbiter.clock_offset = '{offset}'"#
    ))
    .execute(pool)
    .await
    .unwrap();
    pool_of(pool, 16).await
}

/// A new pool of at most `connections` to this test's database, beside
/// `pool` (whose connections it neither shares nor sees).
pub async fn pool_of(pool: &PgPool, connections: u32) -> PgPool {
    PgPoolOptions::new()
        .max_connections(connections)
        .connect_with((*pool.connect_options()).clone())
        .await
        .unwrap()
}

/// Runs an operator command of the real binary against this test's database.
pub async fn cli(pool: &PgPool, args: &[&str]) -> std::process::Output {
    cli_with_env(pool, args, &[]).await
}

/// [`cli`] with extra environment variables.
pub async fn cli_with_env(
    pool: &PgPool,
    args: &[&str],
    env: &[(&str, &str)],
) -> std::process::Output {
    let url = database_url(pool, &postgres_host_port()).await;
    tokio::process::Command::new(env!("CARGO_BIN_EXE_quota-arbiter"))
        .args(args)
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("DATABASE_URL", url)
        .env("USER", "alice")
        .envs(env.iter().copied())
        .current_dir(std::env::temp_dir())
        .output()
        .await
        .expect("the binary runs")
}

/// A command's standard output; it must have succeeded.
pub fn stdout(output: &std::process::Output) -> String {
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// A real `quota-arbiter serve` process.
pub struct Replica {
    pub base: String,
    child: tokio::process::Child,
    /// Every line it has logged (JSON) since it listened.
    logs: Arc<Mutex<Vec<String>>>,
}

impl Replica {
    pub async fn spawn(database_url: &str) -> Self {
        Self::spawn_with(database_url, &[]).await
    }

    /// [`Replica::spawn`] with extra environment variables (`QUOTA_*` settings).
    pub async fn spawn_with(database_url: &str, env: &[(&str, &str)]) -> Self {
        let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_quota-arbiter"))
            .arg("serve")
            .current_dir(std::env::temp_dir())
            // A clean environment: config tests in this binary set QUOTA_* variables.
            .env_clear()
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            .env("DATABASE_URL", database_url)
            .env("QUOTA_LISTEN", "127.0.0.1:0")
            .env("QUOTA_LOG_FORMAT", "json")
            .env("QUOTA_ADMIN_TOKEN", ADMIN_TOKEN)
            .env("RUST_LOG", "info")
            .envs(env.iter().copied())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()
            .expect("the server binary starts");
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let addr = tokio::time::timeout(Duration::from_secs(20), async {
            while let Some(line) = lines.next_line().await.unwrap() {
                let Ok(event) = serde_json::from_str::<Value>(&line) else {
                    continue;
                };
                if event["message"] == "listening" {
                    return event["addr"].as_str().unwrap().to_string();
                }
            }
            panic!("server exited before listening");
        })
        .await
        .expect("server listens within 20 s");
        // Keep draining the log so the server never blocks on a full pipe.
        let logs = Arc::new(Mutex::new(Vec::new()));
        let kept = logs.clone();
        tokio::spawn(async move {
            while let Ok(Some(line)) = lines.next_line().await {
                kept.lock().unwrap().push(line);
            }
        });
        Self {
            base: format!("http://{addr}"),
            child,
            logs,
        }
    }

    /// The lines it has logged since it listened.
    pub fn log_lines(&self) -> Vec<String> {
        self.logs.lock().unwrap().clone()
    }

    /// SIGKILL: no graceful shutdown, nothing flushed.
    pub async fn kill(mut self) {
        self.sigkill().await;
    }

    /// [`Replica::kill`] in place, for a caller that starts another.
    pub async fn sigkill(&mut self) {
        self.child.kill().await.unwrap();
    }

    /// SIGTERM: the graceful shutdown. Returns at once; see [`Replica::exited`].
    pub fn terminate(&self) {
        let pid = self.child.id().expect("the server is running");
        let sent = std::process::Command::new("kill")
            .args(["-TERM", &pid.to_string()])
            .status()
            .expect("kill runs");
        assert!(sent.success(), "SIGTERM sent to {pid}");
    }

    /// Waits (up to `timeout`) for the process to exit; its status.
    pub async fn exited(&mut self, timeout: Duration) -> std::process::ExitStatus {
        tokio::time::timeout(timeout, self.child.wait())
            .await
            .expect("the server exits in time")
            .expect("the server's status")
    }

    /// Whether the process is still running (it did not die on its own).
    pub fn is_running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }
}

/// A TCP proxy in front of PostgreSQL that a test can cut (connections
/// dropped, new ones accepted and left hanging: a black hole) and restore.
pub struct StoreProxy {
    pub addr: SocketAddr,
    state: Arc<Mutex<ProxyState>>,
}

#[derive(Default)]
struct ProxyState {
    cut: bool,
    live: Vec<tokio::task::AbortHandle>,
}

impl StoreProxy {
    pub async fn start(upstream: String) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let state = Arc::new(Mutex::new(ProxyState::default()));
        let shared = state.clone();
        tokio::spawn(async move {
            loop {
                let Ok((mut inbound, _)) = listener.accept().await else {
                    return;
                };
                let upstream = upstream.clone();
                let cut = shared.lock().unwrap().cut;
                let task = tokio::spawn(async move {
                    if cut {
                        // Black hole: hold the socket open and never answer.
                        tokio::time::sleep(Duration::from_secs(3600)).await;
                        drop(inbound);
                        return;
                    }
                    if let Ok(mut outbound) = TcpStream::connect(&upstream).await {
                        let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
                    }
                });
                shared.lock().unwrap().live.push(task.abort_handle());
            }
        });
        Self { addr, state }
    }

    pub fn cut(&self) {
        let mut state = self.state.lock().unwrap();
        state.cut = true;
        for task in state.live.drain(..) {
            task.abort();
        }
    }

    pub fn restore(&self) {
        let mut state = self.state.lock().unwrap();
        state.cut = false;
        for task in state.live.drain(..) {
            task.abort();
        }
    }
}

/// The app on a pool that reaches the store through a proxy the test can cut.
pub async fn behind_a_proxy(pool: &PgPool) -> (StoreProxy, TestApp) {
    let proxy = StoreProxy::start(postgres_host_port()).await;
    let url = database_url(pool, &proxy.addr.to_string()).await;
    let config = test_config();
    let proxied = PgPoolOptions::new()
        .max_connections(8)
        .acquire_timeout(config.store_timeout)
        .connect_lazy(&url)
        .unwrap();
    (proxy, TestApp::spawn_with(proxied, config).await)
}

/// The slug of a problem document's `type` (`store-unavailable`, …).
pub fn problem_slug(problem: &Value) -> String {
    let kind = problem["type"].as_str().expect("a problem type");
    kind.rsplit('/').next().unwrap_or(kind).to_string()
}

/// The first of `names` found as a file on `PATH`: tools a test needs that CI
/// installs (Chromium, promtool) and a developer machine may lack.
pub fn find_on_path(names: &[&str]) -> Option<std::path::PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    let dirs: Vec<std::path::PathBuf> = std::env::split_paths(&path).collect();
    names
        .iter()
        .flat_map(|name| dirs.iter().map(move |dir| dir.join(name)))
        .find(|candidate| candidate.is_file())
}
