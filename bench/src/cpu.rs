//! CPU time an arm cost the service process and the database, read from
//! /proc while the arm runs. Database: the PostgreSQL backends connected to
//! the bench's database (their process title names it), autovacuum included;
//! the server's shared background processes (WAL writer, checkpointer) are
//! not counted. Only meaningful when PostgreSQL runs on this machine; without
//! a backend in sight the figure is left out.

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
            loop {
                let finishing = stopped.load(Ordering::Relaxed);
                for (pid, ticks) in sample(service, &database) {
                    // A process that appears later started during the arm.
                    first.entry(pid).or_insert(if initial { ticks } else { 0 });
                    last.insert(pid, ticks);
                }
                initial = false;
                if finishing {
                    break;
                }
                std::thread::sleep(SAMPLE_EVERY);
            }
            let spent = |pids: &mut dyn Iterator<Item = &u32>| {
                let ticks: u64 = pids.map(|pid| last[pid] - first[pid]).sum();
                ticks as f64 / ticks_per_second
            };
            let is_service = |pid: &&u32| Some(**pid) == service;
            let database_pids: Vec<&u32> = last.keys().filter(|pid| !is_service(pid)).collect();
            CpuSpent {
                service_seconds: service
                    .filter(|pid| last.contains_key(pid))
                    .map(|pid| spent(&mut std::iter::once(&pid))),
                database_seconds: (!database_pids.is_empty())
                    .then(|| spent(&mut database_pids.into_iter())),
            }
        });
        Self { stop, sampler }
    }

    pub async fn stop(self) -> anyhow::Result<CpuSpent> {
        self.stop.store(true, Ordering::Relaxed);
        Ok(self.sampler.await?)
    }
}

/// utime + stime of `service` and of every backend of `database`, in ticks.
fn sample(service: Option<u32>, database: &str) -> Vec<(u32, u64)> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    let marker = format!(" {database} ");
    entries
        .filter_map(|entry| entry.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            Some(*pid) == service
                || std::fs::read(format!("/proc/{pid}/cmdline"))
                    .is_ok_and(|title| is_backend_of(&String::from_utf8_lossy(&title), &marker))
        })
        .filter_map(|pid| {
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
            Some((pid, cpu_ticks(&stat)?))
        })
        .collect()
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
