//! The service under measurement: a real `quota-arbiter serve` child process,
//! so that what it costs (its resident memory) is its own and not the load
//! generator's.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::Context;
use serde_json::Value;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

use crate::http;

/// How long the service may take to listen, and then to be ready.
const START_TIMEOUT: Duration = Duration::from_secs(30);

pub struct Service {
    pub base: String,
    child: Child,
}

/// The service's memory as the kernel counts it, in kB.
#[derive(Clone, Copy, Debug)]
pub struct ResidentMemory {
    pub now_kb: u64,
    pub peak_kb: u64,
}

/// The service binary: `explicit`, else `quota-arbiter` next to this binary
/// (`cargo build --release --workspace` puts both in target/release).
pub fn binary(explicit: Option<PathBuf>) -> anyhow::Result<PathBuf> {
    let path = match explicit {
        Some(path) => path,
        None => std::env::current_exe()?
            .parent()
            .context("this binary has no directory")?
            .join("quota-arbiter"),
    };
    anyhow::ensure!(
        path.is_file(),
        "no service binary at {} (build it with `cargo build --release --workspace`, or pass --server)",
        path.display()
    );
    Ok(path)
}

/// The service in a clean environment: its own defaults, the database, a port
/// of the kernel's choosing, JSON logs (from which the port is read).
fn command(binary: &Path, database_url: &str) -> Command {
    let mut command = Command::new(binary);
    command
        .current_dir(std::env::temp_dir())
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("DATABASE_URL", database_url)
        .env("QUOTA_LOG_FORMAT", "json");
    command
}

/// `quota-arbiter migrate`: creates the database if missing and applies the
/// migrations of the binary that will be measured.
pub async fn migrate(binary: &Path, database_url: &str) -> anyhow::Result<()> {
    let output = command(binary, database_url)
        .arg("migrate")
        .output()
        .await
        .with_context(|| format!("running {} migrate", binary.display()))?;
    anyhow::ensure!(
        output.status.success(),
        "{} migrate failed: {}",
        binary.display(),
        String::from_utf8_lossy(&output.stderr)
    );
    Ok(())
}

impl Service {
    /// Starts `quota-arbiter serve` and waits until it answers `/readyz`
    /// (store reachable, catalog loaded).
    pub async fn start(
        binary: &Path,
        database_url: &str,
        max_connections: Option<u32>,
    ) -> anyhow::Result<Self> {
        Self::start_with(binary, database_url, max_connections, &[]).await
    }

    /// [`Service::start`] with more settings (`QUOTA_*` variables).
    pub async fn start_with(
        binary: &Path,
        database_url: &str,
        max_connections: Option<u32>,
        settings: &[(&str, &str)],
    ) -> anyhow::Result<Self> {
        let mut command = command(binary, database_url);
        command.envs(settings.iter().copied());
        command
            .arg("serve")
            .env("QUOTA_LISTEN", "127.0.0.1:0")
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true);
        if let Some(connections) = max_connections {
            command.env("QUOTA_MAX_CONNECTIONS", connections.to_string());
        }
        let mut child = command
            .spawn()
            .with_context(|| format!("starting {} serve", binary.display()))?;
        let mut log = BufReader::new(child.stdout.take().context("no stdout")?).lines();
        let addr = tokio::time::timeout(START_TIMEOUT, async {
            while let Some(line) = log.next_line().await? {
                if let Ok(event) = serde_json::from_str::<Value>(&line) {
                    if event["message"] == "listening" {
                        return event["addr"]
                            .as_str()
                            .map(str::to_string)
                            .context("a listening line without an address");
                    }
                }
            }
            anyhow::bail!("the service exited before listening")
        })
        .await
        .context("the service did not listen in time")??;
        // Keep reading its log, so that it never blocks on a full pipe.
        tokio::spawn(async move { while let Ok(Some(_)) = log.next_line().await {} });
        let service = Self {
            base: format!("http://{addr}"),
            child,
        };
        service.ready().await?;
        Ok(service)
    }

    async fn ready(&self) -> anyhow::Result<()> {
        let client = http::Client::new(&self.base, 1)?;
        let started = Instant::now();
        loop {
            let answer = client.get(0, "/readyz", &[]).await;
            if answer.is_ok_and(|a| a.status == 200) {
                return Ok(());
            }
            anyhow::ensure!(
                started.elapsed() < START_TIMEOUT,
                "the service was not ready within {START_TIMEOUT:?}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    pub fn pid(&self) -> Option<u32> {
        self.child.id()
    }

    /// VmRSS and VmHWM of the service process, from /proc.
    pub fn resident_memory(&self) -> anyhow::Result<ResidentMemory> {
        let pid = self.child.id().context("the service has exited")?;
        let status = std::fs::read_to_string(format!("/proc/{pid}/status"))
            .context("reading the service's /proc/<pid>/status (Linux only)")?;
        Ok(ResidentMemory {
            now_kb: status_kb(&status, "VmRSS").context("no VmRSS")?,
            peak_kb: status_kb(&status, "VmHWM").context("no VmHWM")?,
        })
    }

    /// Stops the service (SIGKILL: nothing it would flush matters here).
    pub async fn stop(mut self) -> anyhow::Result<()> {
        self.child.kill().await?;
        Ok(())
    }
}

/// A `Key:   1234 kB` field of /proc/<pid>/status.
fn status_kb(status: &str, key: &str) -> Option<u64> {
    status.lines().find_map(|line| {
        let value = line.strip_prefix(key)?.strip_prefix(':')?;
        value.trim().strip_suffix("kB")?.trim().parse().ok()
    })
}

#[cfg(test)]
mod tests {
    use super::status_kb;

    #[test]
    fn memory_fields_are_read_in_kb() {
        let status =
            "Name:\tquota-arbiter\nVmHWM:\t   31240 kB\nVmRSS:\t   28812 kB\nThreads:\t3\n";
        assert_eq!(status_kb(status, "VmRSS"), Some(28812));
        assert_eq!(status_kb(status, "VmHWM"), Some(31240));
        assert_eq!(status_kb(status, "VmSwap"), None);
        assert_eq!(status_kb(status, "Threads"), None);
    }
}
