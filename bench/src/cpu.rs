//! CPU time an arm cost the service process, the database and the client,
//! and how idle the machine stayed, read from /proc while the arm runs.
//! Database: the PostgreSQL backends connected to the bench's database (their
//! process title names it), autovacuum included; the server's shared
//! background processes (WAL writer, checkpointer) are not counted. Only
//! meaningful when PostgreSQL runs on this machine; without a backend in
//! sight the figure is left out. Client: this process, and pgbench while it
//! drives a baseline. Idle: the share of every core's time nobody used
//! (/proc/stat), which says whether an arm was bound by the cores or by
//! waiting.

use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::drive::Arm;

/// How often /proc is read. A backend that exits (pgbench's, at the end of
/// its run) loses at most this much of its CPU time from the count.
const SAMPLE_EVERY: Duration = Duration::from_millis(250);

/// CPU seconds spent while a meter ran.
#[derive(Clone, Copy, Debug, Default)]
pub struct CpuSpent {
    pub service_seconds: Option<f64>,
    pub database_seconds: Option<f64>,
    pub client_seconds: Option<f64>,
    /// Share of the machine's core time left idle (0 to 1).
    pub idle_share: Option<f64>,
}

/// Runs one arm while counting the CPU time it costs.
pub async fn metered(
    service: Option<u32>,
    database: &str,
    arm: impl Future<Output = anyhow::Result<Arm>>,
) -> anyhow::Result<Arm> {
    let meter = Meter::start(service, database);
    let arm = arm.await;
    let cpu = meter.stop().await?;
    Ok(Arm { cpu, ..arm? })
}

pub struct Meter {
    stop: Arc<AtomicBool>,
    sampler: tokio::task::JoinHandle<CpuSpent>,
}

impl Meter {
    /// Starts counting the CPU time of `service` (a pid) and of the backends
    /// of `database`.
    pub fn start(service: Option<u32>, database: &str) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let (stopped, database) = (stop.clone(), database.to_string());
        let sampler = tokio::task::spawn_blocking(move || {
            let ticks_per_second = ticks_per_second();
            let mut first = HashMap::new();
            let mut last = HashMap::new();
            let mut initial = true;
            let cores_before = core_ticks();
            loop {
                let finishing = stopped.load(Ordering::Relaxed);
                for (pid, ticks, role) in sample(service, &database) {
                    // A process that appears later started during the arm.
                    first.entry(pid).or_insert(if initial { ticks } else { 0 });
                    last.insert(pid, (ticks, role));
                }
                initial = false;
                if finishing {
                    break;
                }
                std::thread::sleep(SAMPLE_EVERY);
            }
            // Seconds spent by the processes of `role`; `None` if none was seen.
            let spent = |role: Role| {
                let of_role = last.iter().filter(|(_, (_, r))| *r == role);
                let ticks: Vec<u64> = of_role.map(|(pid, (t, _))| t - first[pid]).collect();
                (!ticks.is_empty()).then(|| ticks.iter().sum::<u64>() as f64 / ticks_per_second)
            };
            CpuSpent {
                service_seconds: spent(Role::Service),
                database_seconds: spent(Role::Database),
                client_seconds: spent(Role::Client),
                idle_share: cores_before
                    .zip(core_ticks())
                    .and_then(|(a, b)| idle_share(a, b)),
            }
        });
        Self { stop, sampler }
    }

    pub async fn stop(self) -> anyhow::Result<CpuSpent> {
        self.stop.store(true, Ordering::Relaxed);
        Ok(self.sampler.await?)
    }
}

/// What a sampled process is to the arm.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Role {
    Service,
    Database,
    Client,
}

/// utime + stime of `service`, of every backend of `database` and of the
/// clients (this process, pgbench), in ticks.
fn sample(service: Option<u32>, database: &str) -> Vec<(u32, u64, Role)> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    let marker = format!(" {database} ");
    let bench = std::process::id();
    entries
        .filter_map(|entry| entry.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter_map(|pid| {
            let role = if Some(pid) == service {
                Role::Service
            } else if pid == bench || is_pgbench(pid) {
                Role::Client
            } else if std::fs::read(format!("/proc/{pid}/cmdline"))
                .is_ok_and(|title| is_backend_of(&String::from_utf8_lossy(&title), &marker))
            {
                Role::Database
            } else {
                return None;
            };
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
            Some((pid, cpu_ticks(&stat)?, role))
        })
        .collect()
}

fn is_pgbench(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/comm")).is_ok_and(|comm| comm.trim() == "pgbench")
}

/// The machine's core time so far, in ticks: (idle, total), from the first
/// line of /proc/stat (`cpu user nice system idle iowait irq softirq steal`).
fn core_ticks() -> Option<(u64, u64)> {
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    parse_core_ticks(stat.lines().next()?)
}

fn parse_core_ticks(line: &str) -> Option<(u64, u64)> {
    let mut fields = line.split_whitespace();
    if fields.next()? != "cpu" {
        return None;
    }
    // Guest time is already inside user time: count the first eight only.
    let ticks: Vec<u64> = fields
        .take(8)
        .map(|f| f.parse().ok())
        .collect::<Option<_>>()?;
    let idle = ticks.get(3)? + ticks.get(4)?;
    Some((idle, ticks.iter().sum()))
}

/// The share of the core time between two readings that stayed idle.
fn idle_share(before: (u64, u64), after: (u64, u64)) -> Option<f64> {
    let total = after.1.checked_sub(before.1).filter(|t| *t > 0)?;
    let idle = after.0.checked_sub(before.0)?;
    Some(idle as f64 / total as f64)
}

/// A PostgreSQL backend's title (its /proc cmdline, NUL-padded):
/// `postgres: [<cluster>: ]<user> <database> <host> <activity>`.
fn is_backend_of(title: &str, marker: &str) -> bool {
    let title = format!("{} ", title.replace('\0', " "));
    title.starts_with("postgres: ") && title.contains(marker)
}

/// utime + stime of a /proc/<pid>/stat line (fields 14 and 15; the command
/// name in parentheses may contain spaces, so count from its closing one).
fn cpu_ticks(stat: &str) -> Option<u64> {
    let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
    let utime: u64 = fields.get(11)?.parse().ok()?;
    let stime: u64 = fields.get(12)?.parse().ok()?;
    Some(utime + stime)
}

/// The kernel's clock ticks per second (`getconf CLK_TCK`; 100 on Linux).
fn ticks_per_second() -> f64 {
    std::process::Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|out| String::from_utf8_lossy(&out.stdout).trim().parse().ok())
        .unwrap_or(100.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_time_is_user_plus_system() {
        let stat =
            "4242 (postgres: x (y)) S 1 4242 4242 0 -1 4194560 1290 0 0 0 37 12 0 0 20 0 1 0 \
                    99 0 0";
        assert_eq!(cpu_ticks(stat), Some(49));
        assert_eq!(cpu_ticks("4242 (short) S 1"), None);
    }

    #[test]
    fn idle_time_is_idle_plus_iowait_of_every_core() {
        let before = parse_core_ticks("cpu  100 0 50 800 50 0 0 0 7 0").unwrap();
        let after = parse_core_ticks("cpu  250 0 100 850 50 0 0 0 9 0").unwrap();
        assert_eq!(before, (850, 1000));
        assert_eq!(idle_share(before, after), Some(0.2));
        assert_eq!(parse_core_ticks("cpu0 1 2 3 4 5 6 7 8"), None);
        assert_eq!(idle_share(after, after), None, "no time passed");
    }

    #[test]
    fn only_backends_of_the_database_count() {
        let marker = " qa_bench ";
        let backend = "postgres: 15/main: postgres qa_bench 127.0.0.1(51234) idle\0\0";
        assert!(is_backend_of(backend, marker));
        let vacuum = "postgres: autovacuum worker qa_bench\0\0\0";
        assert!(is_backend_of(vacuum, marker));
        let other = "postgres: postgres qa_bench_other 127.0.0.1(51234) idle";
        assert!(!is_backend_of(other, marker));
        assert!(!is_backend_of("postgres: 15/main: walwriter \0\0", marker));
        assert!(!is_backend_of("psql qa_bench ", marker));
    }
}
