//! A PgBouncer of its own in front of a database: the bench's arm behind a
//! transaction pooler, and the pooler tests (tests/it/pgbouncer.rs includes
//! this file), which run it in both modes (docs/operations/deployment.md,
//! *Behind a connection pooler*).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::str::FromStr;
use std::time::{Duration, Instant};

use anyhow::Context;
use quota_arbiter::domain::PoolMode;
use sqlx::postgres::PgConnectOptions;

pub struct Pooler {
    dir: PathBuf,
    url: String,
}

/// `explicit`, else `pgbouncer` on `PATH` or in /usr/sbin (Debian's).
pub fn program(explicit: Option<PathBuf>) -> Option<PathBuf> {
    explicit.or_else(|| {
        let on_path = std::env::var_os("PATH").and_then(|path| {
            std::env::split_paths(&path)
                .map(|dir| dir.join("pgbouncer"))
                .find(|candidate| candidate.is_file())
        });
        on_path.or_else(|| {
            let sbin = PathBuf::from("/usr/sbin/pgbouncer");
            sbin.is_file().then_some(sbin)
        })
    })
}

impl Pooler {
    /// Starts PgBouncer on a free port in front of `database_url`'s server,
    /// in `mode` with `servers` server connections per database and user,
    /// the client's role trusted (the pooler is the caller's alone, on
    /// loopback); as the `postgres` user when run as root, which PgBouncer
    /// refuses.
    pub async fn start(
        program: &Path,
        database_url: &str,
        mode: PoolMode,
        servers: u32,
    ) -> anyhow::Result<Self> {
        let options = PgConnectOptions::from_str(database_url)?;
        let port = std::net::TcpListener::bind("127.0.0.1:0")?
            .local_addr()?
            .port();
        let dir = std::env::temp_dir().join(format!("quota-arbiter-pgbouncer-{port}"));
        std::fs::create_dir_all(&dir)?;
        let user = options.get_username();
        std::fs::write(dir.join("users.txt"), format!("\"{user}\" \"\"\n"))?;
        let (host, server_port, d) = (options.get_host(), options.get_port(), dir.display());
        let mode = match mode {
            PoolMode::Session => "session",
            PoolMode::Transaction => "transaction",
        };
        let ini = format!(
            "[databases]\n* = host={host} port={server_port}\n[pgbouncer]\n\
             listen_addr = 127.0.0.1\nlisten_port = {port}\nauth_type = trust\n\
             auth_file = {d}/users.txt\npool_mode = {mode}\nmax_client_conn = 500\n\
             default_pool_size = {servers}\nlogfile = {d}/pgbouncer.log\n\
             pidfile = {d}/pgbouncer.pid\nunix_socket_dir =\n\
             ignore_startup_parameters = extra_float_digits,options\n"
        );
        std::fs::write(dir.join("pgbouncer.ini"), ini)?;
        let as_root = Command::new("id")
            .arg("-u")
            .output()
            .is_ok_and(|o| o.stdout.starts_with(b"0"));
        let mut command = if as_root {
            Command::new("chown")
                .args(["-R", "postgres"])
                .arg(&dir)
                .status()?;
            let mut runuser = Command::new("runuser");
            runuser.args(["-u", "postgres", "--"]).arg(program);
            runuser
        } else {
            Command::new(program)
        };
        let started = command
            .arg("-d")
            .arg(dir.join("pgbouncer.ini"))
            .status()
            .with_context(|| format!("starting {}", program.display()))?;
        let database = options.get_database().unwrap_or(user);
        let pooler = Self {
            url: format!("postgres://{user}@127.0.0.1:{port}/{database}"),
            dir,
        };
        anyhow::ensure!(started.success(), "{} did not start", program.display());
        let since = Instant::now();
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            anyhow::ensure!(
                since.elapsed() < Duration::from_secs(10),
                "PgBouncer did not listen on {port}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Ok(pooler)
    }

    /// The database, through this pooler.
    pub fn url(&self) -> &str {
        &self.url
    }
}

impl Drop for Pooler {
    fn drop(&mut self) {
        if let Ok(pid) = std::fs::read_to_string(self.dir.join("pgbouncer.pid")) {
            let _ = Command::new("kill").arg(pid.trim()).status();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
