//! Baselines under `pgbench`: the statements the server runs, read from
//! `sql/`, with their parameters bound as literals, at the same concurrency.

use std::time::Duration;

use anyhow::Context;

use super::ArmResult;
use crate::config::Config;

/// `sql` without its comment lines, each `$n` replaced by `literals[n - 1]`
/// (casts written after the parameter stay).
pub(super) fn with_literals(sql: &str, literals: &[&str]) -> String {
    let sql: Vec<&str> = sql
        .lines()
        .filter(|line| !line.trim_start().starts_with("--"))
        .collect();
    let sql = sql.join("\n");
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

/// Runs `script` (a pgbench script) for `duration` with `concurrency` clients.
pub(super) async fn run(
    config: &Config,
    name: &str,
    script: &str,
    concurrency: usize,
    duration: Duration,
) -> anyhow::Result<ArmResult> {
    let file = std::env::temp_dir().join(format!(
        "quota-arbiter-bench-{}-{}.sql",
        std::process::id(),
        name.len()
    ));
    tokio::fs::write(&file, script).await?;
    let output = tokio::process::Command::new("pgbench")
        .args(["-n", "-M", "prepared", "-c", &concurrency.to_string()])
        .args([
            "-j",
            "2",
            "-T",
            &duration.as_secs().max(1).to_string(),
            "-f",
        ])
        .arg(&file)
        .arg(config.database_url.expose())
        .output()
        .await
        .context("running pgbench")?;
    let _ = tokio::fs::remove_file(&file).await;
    let stdout = String::from_utf8_lossy(&output.stdout);
    anyhow::ensure!(
        output.status.success(),
        "pgbench failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let field = |prefix: &str| {
        stdout
            .lines()
            .find_map(|l| l.trim().strip_prefix(prefix))
            .and_then(|rest| rest.split_whitespace().next())
            .and_then(|n| n.parse::<f64>().ok())
    };
    Ok(ArmResult {
        name: name.to_string(),
        per_second: field("tps = ").context("no tps in pgbench output")?,
        // pgbench reports the mean latency only; shown in the p50 column.
        p50_ms: field("latency average = "),
        p99_ms: None,
    })
}

#[cfg(test)]
mod tests {
    use super::with_literals;

    #[test]
    fn parameters_become_literals_and_comments_go() {
        let sql = "-- a comment\nSELECT $1::text, $2, $12, '$'\nLIMIT $2;";
        assert_eq!(
            with_literals(sql, &["'q'", "3"]),
            "SELECT 'q'::text, 3, $12, '$'\nLIMIT 3;"
        );
    }
}
