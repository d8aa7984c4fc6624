//! Baselines under `pgbench`: the statements the service runs, read from its
//! `sql/` directory, with their parameters bound as literals, at the same
//! concurrency, against the same database.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context;

use crate::cpu;
use crate::drive::Arm;

/// How to run pgbench for every baseline of a run.
pub struct Pgbench {
    pub program: PathBuf,
    pub database_url: String,
    /// The database's name, whose backends' CPU time is counted.
    pub database: String,
    pub concurrency: usize,
    pub duration: Duration,
}

impl Pgbench {
    /// Runs `script` (a pgbench script) for the run's duration; the rate
    /// pgbench reports, and percentiles from its per-transaction log.
    pub async fn run(&self, name: &str, script: &str) -> anyhow::Result<Arm> {
        let dir = std::env::temp_dir().join(format!(
            "quota-arbiter-bench-{}-{}",
            std::process::id(),
            name.chars()
                .filter(char::is_ascii_alphanumeric)
                .collect::<String>()
        ));
        tokio::fs::create_dir_all(&dir).await?;
        let measured = cpu::metered(None, &self.database, self.run_in(&dir, name, script)).await;
        let _ = tokio::fs::remove_dir_all(&dir).await;
        measured
    }

    async fn run_in(&self, dir: &Path, name: &str, script: &str) -> anyhow::Result<Arm> {
        tokio::fs::write(dir.join("script.sql"), script).await?;
        let clients = self.concurrency.to_string();
        let threads = self.concurrency.min(2).to_string();
        let seconds = self.duration.as_secs().max(1).to_string();
        let output = tokio::process::Command::new(&self.program)
            .current_dir(dir)
            .args(["-n", "-M", "prepared", "-c", &clients, "-j", &threads])
            .args(["-T", &seconds, "-l", "--log-prefix=transactions"])
            .args(["-f", "script.sql", &self.database_url])
            .output()
            .await
            .with_context(|| format!("running {}", self.program.display()))?;
        anyhow::ensure!(
            output.status.success(),
            "pgbench failed: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        let summary = String::from_utf8_lossy(&output.stdout);
        let per_second = tps(&summary).context("no tps in pgbench's output")?;
        let mut latencies = Vec::new();
        let mut logs = tokio::fs::read_dir(dir).await?;
        while let Some(entry) = logs.next_entry().await? {
            if entry
                .file_name()
                .to_string_lossy()
                .starts_with("transactions.")
            {
                let log = tokio::fs::read_to_string(entry.path()).await?;
                latencies.extend(transaction_latencies(&log));
            }
        }
        let answers = vec![("committed".to_string(), latencies.len())];
        Ok(Arm::measured(name, per_second, latencies, answers, false))
    }
}

/// `sql` without its comment lines, each `$n` replaced by `literals[n - 1]`
/// (casts written after the parameter stay), and sqlx's column overrides
/// (`AS "id!"`, `AS "id?"`) written as the plain names they override, which
/// pgbench's `\gset` can take as variables.
pub fn with_literals(sql: &str, literals: &[&str]) -> String {
    let sql: Vec<&str> = sql
        .lines()
        .filter(|line| !line.trim_start().starts_with("--"))
        .collect();
    let sql = plain_column_names(&sql.join("\n"));
    let mut bound = String::with_capacity(sql.len());
    let mut chars = sql.chars().peekable();
    while let Some(c) = chars.next() {
        let mut digits = String::new();
        while c == '$' && chars.peek().is_some_and(char::is_ascii_digit) {
            digits.extend(chars.next());
        }
        match digits.parse::<usize>() {
            Ok(n) if (1..=literals.len()).contains(&n) => bound.push_str(literals[n - 1]),
            _ => {
                bound.push(c);
                bound.push_str(&digits);
            }
        }
    }
    bound
}

/// `AS "name!"` and `AS "name?"` as `AS name`.
fn plain_column_names(sql: &str) -> String {
    let mut plain = String::with_capacity(sql.len());
    let mut rest = sql;
    while let Some(start) = rest.find("AS \"") {
        let (before, quoted) = rest.split_at(start + 3);
        plain.push_str(before);
        let name_end = quoted[1..].find('"').map(|i| i + 1);
        match name_end {
            Some(end) if quoted[1..end].ends_with(['!', '?']) => {
                plain.push_str(&quoted[1..end - 1]);
                rest = &quoted[end + 1..];
            }
            _ => {
                plain.push('"');
                rest = &quoted[1..];
            }
        }
    }
    plain.push_str(rest);
    plain
}

/// A SQL string literal: `O'Brien` becomes `'O''Brien'`.
pub fn text_literal(text: &str) -> String {
    format!("'{}'", text.replace('\'', "''"))
}

/// The `tps = …` figure of pgbench's summary.
fn tps(summary: &str) -> Option<f64> {
    summary
        .lines()
        .find_map(|line| line.trim().strip_prefix("tps = "))
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|n| n.parse().ok())
}

/// The latencies of pgbench's per-transaction log (`-l`): one line per
/// transaction, `client_id transaction_no time script_no time_epoch time_us`,
/// `time` in microseconds (a failed transaction logs `failed` there and is
/// left out).
fn transaction_latencies(log: &str) -> impl Iterator<Item = Duration> + '_ {
    log.lines()
        .filter_map(|line| line.split_whitespace().nth(2)?.parse().ok())
        .map(Duration::from_micros)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parameters_become_literals_and_comments_go() {
        let sql = "-- a comment\nSELECT $1::text, $2, $12, '$'\nLIMIT $2;";
        assert_eq!(
            with_literals(sql, &["'q'", "3"]),
            "SELECT 'q'::text, 3, $12, '$'\nLIMIT 3;"
        );
    }

    #[test]
    fn sqlx_column_overrides_become_plain_names() {
        let sql = r#"SELECT id AS "id!", ref AS reference, x AS "x?", 'AS "k"' AS "lane""#;
        assert_eq!(
            with_literals(sql, &[]),
            r#"SELECT id AS id, ref AS reference, x AS x, 'AS "k"' AS "lane""#
        );
    }

    #[test]
    fn text_literals_double_their_quotes() {
        assert_eq!(text_literal("bench-1"), "'bench-1'");
        assert_eq!(text_literal("O'Brien"), "'O''Brien'");
    }

    #[test]
    fn the_rate_is_read_from_the_summary() {
        let summary = "number of failed transactions: 0 (0.000%)\n\
                       latency average = 26.491 ms\n\
                       initial connection time = 61.123 ms\n\
                       tps = 2415.914238 (without initial connection time)\n";
        assert_eq!(tps(summary), Some(2415.914238));
        assert_eq!(tps("pgbench: error"), None);
    }

    #[test]
    fn latencies_come_from_the_transaction_log() {
        let log = "0 1 8412 0 1764480000 123456\n\
                   3 7 25004 0 1764480000 223456\n\
                   5 9 failed 0 1764480001 000001\n";
        let latencies: Vec<_> = transaction_latencies(log).collect();
        assert_eq!(
            latencies,
            [Duration::from_micros(8412), Duration::from_micros(25004)]
        );
    }
}
