//! The service behind a real PgBouncer in session pooling (design.md §13),
//! as many deployments run PostgreSQL: every path works, the listener's
//! flips included. (Transaction pooling is not supported: see
//! docs/operations/deployment.md.) Skipped, with a message, where PgBouncer
//! is not installed (`.ci/run` installs Debian's).

use std::path::PathBuf;
use std::time::Duration;

use quota_arbiter::domain::decision::Outcome;
use reqwest::Method;
use serde_json::json;
use sqlx::postgres::PgPoolOptions;
use sqlx::PgPool;

use crate::helpers::{database_name, eventually, find_on_path, TestApp};

/// A PgBouncer of its own, in front of the test PostgreSQL, in `mode`.
struct Bouncer {
    dir: PathBuf,
    port: u16,
}

impl Bouncer {
    fn start(pgbouncer: &PathBuf, mode: &str) -> Self {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let dir = std::env::temp_dir().join(format!("qa-pgbouncer-{port}"));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("users.txt"), "\"postgres\" \"\"\n").unwrap();
        let d = dir.display();
        let ini = format!(
            "[databases]\n* = host=127.0.0.1 port=5432\n[pgbouncer]\nlisten_addr = 127.0.0.1\n\
             listen_port = {port}\nauth_type = trust\nauth_file = {d}/users.txt\n\
             pool_mode = {mode}\nmax_client_conn = 200\ndefault_pool_size = 20\n\
             logfile = {d}/pgbouncer.log\npidfile = {d}/pgbouncer.pid\nunix_socket_dir =\n\
             ignore_startup_parameters = extra_float_digits,options\n"
        );
        std::fs::write(dir.join("pgbouncer.ini"), ini).unwrap();
        // PgBouncer refuses to run as root: as the postgres user where CI runs as root.
        let as_root = std::process::Command::new("id")
            .arg("-u")
            .output()
            .is_ok_and(|o| o.stdout.starts_with(b"0"));
        let mut command = if as_root {
            let _ = std::process::Command::new("chown")
                .args(["-R", "postgres"])
                .arg(&dir)
                .status();
            let mut runuser = std::process::Command::new("runuser");
            runuser.args(["-u", "postgres", "--"]).arg(pgbouncer);
            runuser
        } else {
            std::process::Command::new(pgbouncer)
        };
        let started = command
            .arg("-d")
            .arg(dir.join("pgbouncer.ini"))
            .status()
            .expect("pgbouncer runs");
        assert!(started.success(), "pgbouncer starts");
        Self { dir, port }
    }

    /// A pool of `connections` to `database` through this pooler.
    async fn pool(&self, database: &str, connections: u32) -> PgPool {
        let url = format!("postgres://postgres@127.0.0.1:{}/{database}", self.port);
        for _ in 0..50 {
            if let Ok(pool) = PgPoolOptions::new()
                .max_connections(connections)
                .connect(&url)
                .await
            {
                return pool;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        panic!("pgbouncer accepts connections on {url}");
    }
}

impl Drop for Bouncer {
    fn drop(&mut self) {
        if let Ok(pid) = std::fs::read_to_string(self.dir.join("pgbouncer.pid")) {
            let _ = std::process::Command::new("kill").arg(pid.trim()).status();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn pgbouncer() -> Option<PathBuf> {
    find_on_path(&["pgbouncer"]).or_else(|| {
        let sbin = PathBuf::from("/usr/sbin/pgbouncer");
        sbin.is_file().then_some(sbin)
    })
}

#[sqlx::test(migrator = "quota_arbiter::store::FRESH_MIGRATOR")]
async fn behind_pgbouncer_in_session_pooling_every_path_works(pool: PgPool) {
    let Some(pgbouncer) = pgbouncer() else {
        eprintln!("SKIPPED behind_pgbouncer: no pgbouncer (.ci/run installs Debian's)");
        return;
    };
    let database = database_name(&pool).await;

    // Session pooling: every path, the listener's flips included.
    let session = Bouncer::start(&pgbouncer, "session");
    let app = TestApp::spawn(session.pool(&database, 8).await).await;
    let ready = || async { app.get("/readyz").send().await.unwrap().status().as_u16() };
    assert_eq!(eventually(Duration::from_secs(5), 200, ready).await, 200);
    app.admin_json(
        Method::PUT,
        "/v1/quotas/ppf",
        Some(json!({"hourly_ceiling": 2})),
    )
    .await;
    app.admin_json(
        Method::PUT,
        "/v1/flows/invoice",
        Some(json!({"quota": "ppf", "mode": "enforce"})),
    )
    .await;
    let outcomes = [
        app.reserve(json!({"flow": "invoice"})).await.outcome,
        app.reserve(json!({"flow": "invoice"})).await.outcome,
        app.reserve(json!({"flow": "invoice"})).await.outcome,
    ];
    assert_eq!(
        outcomes,
        [Outcome::Granted, Outcome::Granted, Outcome::Deferred]
    );
    // A flip made in SQL, straight on the database: the listener hears it.
    sqlx::query("UPDATE flow SET mode = 'observe' WHERE name = 'invoice'")
        .execute(&pool)
        .await
        .unwrap();
    let observed = eventually(Duration::from_secs(3), true, || async {
        app.reserve(json!({"flow": "invoice"})).await.would_defer
    })
    .await;
    assert!(observed, "the flip to observe is obeyed");
    let enqueued = app
        .post("/v1/work")
        .json(&json!({"flow": "invoice", "ref": "w-1"}))
        .send()
        .await
        .unwrap();
    assert_eq!(enqueued.status(), 201);
    let claimed: serde_json::Value = app
        .post("/v1/work/claim")
        .json(&json!({"worker": "w"}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(claimed["outcome"], "claimed", "{claimed}");
}
