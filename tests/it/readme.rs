//! The README is executable: every fenced `sh` and `sql` block of README.md
//! runs, in document order, against one live replica (a real
//! `quota-arbiter serve` process) on a fresh database, so an example cannot
//! drift from the behaviour unnoticed. So is the book: every chapter that
//! `docs/SUMMARY.md` lists runs the same way, each against a fresh database
//! and a replica of its own (a chapter without a runnable block starts
//! nothing), all chapters at once. What is said below of the README holds for
//! every chapter; a failure names the file and its line.
//!
//! The same module checks the links of the README, `client/README.md`,
//! `CHANGELOG.md` and the chapters: a relative link points at a file or
//! directory that exists, and a `#fragment` into a Markdown file is the anchor
//! of one of its headings (see [`anchor_of`]).
//!
//! **sh blocks** (also tagged `bash` or `shell`) run with `bash` under
//! `set -euo pipefail`, each in a process of its own (only the database and the
//! replica carry over from one block to the next), in the repository root, with
//! - `localhost:8080` rewritten to the replica's address, and the README's
//!   placeholder admin token `change-me` to the replica's token;
//! - `TOKEN` and `QUOTA_ADMIN_TOKEN` set to that token, `DATABASE_URL` and
//!   `PGHOST`/`PGPORT`/`PGUSER`/`PGDATABASE` (for `psql -c`) naming the test
//!   database, and the built `quota-arbiter` and `quota-arbiter-client` first
//!   on `PATH` (CLI examples run);
//! - `curl` run as `curl --fail-with-body --show-error`, so a refused request
//!   fails the block and its problem+json shows in the failure;
//! - a time limit of 10 s unless annotated.
//!
//! A block fails when it exits non-zero or runs out of time. Its lines keep their
//! README line numbers in the script, so bash's `line N` is README line N.
//!
//! **Expected output.** A run of `#` comment lines right after a command line,
//! starting with `{` or `[`, is what that command prints:
//!
//! ```text
//! curl -s localhost:8080/v1/reserve -H 'content-type: application/json' -d '{"flow": "invoice"}'
//! # {"outcome": "granted", "window_start": "...", ...}
//! ```
//!
//! The command is the lines above the comment, back to the previous blank or
//! comment line. What it prints must be one JSON value, and the comment's JSON
//! must match it: each key shown is there with a matching value (keys not shown
//! are not checked), an array has the length shown and matches element by
//! element, a value written `"..."` matches anything, and a bare `...` (standing
//! for keys not shown) is ignored. Anything else must be equal.
//!
//! **sql blocks** run statement by statement on the test database (split at `;`
//! outside quotes and `--` comments; dollar-quoted bodies are not understood);
//! each statement must succeed.
//!
//! **Annotations.** HTML comments right before a block (blank lines between are
//! fine) change how it runs; they stack:
//! - `<!-- readme: skip: why -->` — not run; the reason is required;
//! - `<!-- readme: output -->` — sample output, not commands: not run;
//! - `<!-- readme: setup: bash -->` — bash run first in the block's shell, for what
//!   the example assumes (a function like `emit`, some state); it may span lines,
//!   must not contain `-->`, and gets the same rewrites as the block;
//! - `<!-- readme: timeout 30s -->` — another time limit.
//!
//! An unknown annotation, or one that is not right before an sh or sql block,
//! fails the test. A block without annotation runs, so a new example is tested
//! by default. Other fenced blocks (rust, toml, plain) are not run; the two
//! configuration files the README points at are loaded by a test of their own.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use figment::Jail;
use quota_arbiter::config::Config;
use serde_json::Value;
use sqlx::postgres::PgPoolOptions;
use sqlx::PgPool;

use crate::helpers::{database_url, postgres_host_port, url_of_database, Replica, ADMIN_TOKEN};

/// Where the README's examples expect the service.
const README_ADDRESS: &str = "localhost:8080";
/// The admin token the README's examples configure and send.
const README_TOKEN: &str = "change-me";
const DEFAULT_LIMIT: Duration = Duration::from_secs(10);
/// What the examples call besides the built binary.
const TOOLS: &str = "bash curl jq psql timeout date";
const START_MARK: &str = "@@readme-output-start-";
const END_MARK: &str = "@@readme-output-end-";

#[sqlx::test(migrator = "quota_arbiter::store::FRESH_MIGRATOR")]
async fn every_readme_example_runs_as_written(pool: PgPool) {
    require_tools().await;
    let readme = std::fs::read_to_string(repository_root().join("README.md")).unwrap();
    let blocks = parse_readme(&readme).unwrap_or_else(|problem| panic!("README.md: {problem}"));
    let url = database_url(&pool, &postgres_host_port()).await;
    let replica = Replica::spawn(&url).await;
    let shell = ShellEnv::new(&url, &replica.base);

    let (ran, outputs_checked) = run_blocks("README.md", &blocks, &shell, &pool)
        .await
        .unwrap_or_else(|failure| panic!("{failure}"));
    assert!(
        ran > 0 && outputs_checked > 0,
        "the README ran {ran} blocks and checked {outputs_checked} outputs: the parser lost them"
    );
}

/// Chapters run at once: each holds a database, a replica and their
/// connections, and PostgreSQL's `max_connections` (100 by default) is
/// shared with every other test of this binary running meanwhile.
const CHAPTERS_AT_ONCE: usize = 2;
/// A chapter's replica keeps to a few connections, for the same reason.
const CHAPTER_REPLICA_CONNECTIONS: &str = "4";

/// Every chapter of the book, each against a database and a replica of its
/// own, [`CHAPTERS_AT_ONCE`] at a time; every failing chapter is reported.
#[sqlx::test(migrator = "quota_arbiter::store::FRESH_MIGRATOR")]
async fn every_book_example_runs_as_written(pool: PgPool) {
    require_tools().await;
    // Short names: PostgreSQL truncates identifiers past 63 bytes, and the
    // test's own database name is that long already.
    let prefix = format!("qa_book_{}", std::process::id());
    let mut chapters = tokio::task::JoinSet::new();
    let turns = std::sync::Arc::new(tokio::sync::Semaphore::new(CHAPTERS_AT_ONCE));
    let mut runnable = 0;
    for (n, chapter) in book_chapters().into_iter().enumerate() {
        let name = format!("docs/{chapter}");
        let text = std::fs::read_to_string(repository_root().join(&name))
            .unwrap_or_else(|error| panic!("{name}, listed in docs/SUMMARY.md: {error}"));
        let blocks = parse_readme(&text).unwrap_or_else(|problem| panic!("{name}: {problem}"));
        if !blocks.iter().any(Block::runs) {
            continue;
        }
        runnable += 1;
        let (database, admin) = (format!("{prefix}_book{n}"), pool.clone());
        let turns = turns.clone();
        chapters.spawn(async move {
            let _turn = turns
                .acquire_owned()
                .await
                .expect("the semaphore stays open");
            let result = run_chapter(&name, &blocks, &database, &admin).await;
            (name, result)
        });
    }
    let mut failures = Vec::new();
    let (mut ran, mut outputs_checked) = (0, 0);
    while let Some(joined) = chapters.join_next().await {
        match joined.expect("a chapter's task ends") {
            (_, Ok((blocks, outputs))) => {
                ran += blocks;
                outputs_checked += outputs;
            }
            (_, Err(failure)) => failures.push(failure),
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {runnable} chapters fail:\n\n{}",
        failures.len(),
        failures.join("\n\n")
    );
    assert!(
        runnable > 0 && ran > 0 && outputs_checked > 0,
        "the book ran {ran} blocks of {runnable} chapters and checked {outputs_checked} outputs: \
         the parser lost them"
    );
}

/// The chapters `docs/SUMMARY.md` lists, as paths under `docs/`, in its order.
fn book_chapters() -> Vec<String> {
    let summary = std::fs::read_to_string(repository_root().join("docs/SUMMARY.md")).unwrap();
    let mut chapters = Vec::new();
    for line in summary.lines() {
        for link in markdown_links(line) {
            if link.ends_with(".md") && !chapters.contains(&link) {
                chapters.push(link);
            }
        }
    }
    assert!(!chapters.is_empty(), "docs/SUMMARY.md lists no chapter");
    chapters
}

/// One chapter: a database made and migrated for it, a replica on it, its
/// blocks in order; the database goes when the chapter is done, failed or not.
async fn run_chapter(
    name: &str,
    blocks: &[Block],
    database: &str,
    admin: &PgPool,
) -> Result<(usize, usize), String> {
    let setup = |problem: String| format!("{name}: {problem}");
    let _dropped = ScratchDatabase::create(admin, database)
        .await
        .map_err(setup)?;
    let url = url_of_database(database, &postgres_host_port());
    let pool = PgPoolOptions::new()
        .max_connections(4)
        .connect(&url)
        .await
        .map_err(|error| setup(format!("connecting to {database}: {error}")))?;
    quota_arbiter::store::migrate(&pool)
        .await
        .map_err(|error| setup(format!("migrating {database}: {error}")))?;
    let replica = Replica::spawn_with(
        &url,
        &[("QUOTA_MAX_CONNECTIONS", CHAPTER_REPLICA_CONNECTIONS)],
    )
    .await;
    wait_until_ready(&replica.base).await.map_err(setup)?;
    let shell = ShellEnv::new(&url, &replica.base);
    let result = run_blocks(name, blocks, &shell, &pool).await;
    pool.close().await;
    result
}

/// A database of the test's own beside the one `#[sqlx::test]` made, dropped
/// (with whoever is still connected) when this goes out of scope.
struct ScratchDatabase {
    name: String,
    admin_url: String,
}

impl ScratchDatabase {
    async fn create(admin: &PgPool, name: &str) -> Result<Self, String> {
        let dropped = Self {
            name: name.into(),
            admin_url: database_url(admin, &postgres_host_port()).await,
        };
        // One left behind by a run that was killed, under a reused process id.
        for statement in [
            format!(r#"DROP DATABASE IF EXISTS "{name}" WITH (FORCE)"#),
            format!(r#"CREATE DATABASE "{name}""#),
        ] {
            sqlx::raw_sql(&statement)
                .execute(admin)
                .await
                .map_err(|error| format!("{statement}: {error}"))?;
        }
        Ok(dropped)
    }
}

impl Drop for ScratchDatabase {
    fn drop(&mut self) {
        let dropped = std::process::Command::new("psql")
            .arg(&self.admin_url)
            .arg("-qXc")
            .arg(format!(
                r#"DROP DATABASE IF EXISTS "{}" WITH (FORCE)"#,
                self.name
            ))
            .stdout(Stdio::null())
            .status();
        if !dropped.is_ok_and(|status| status.success()) {
            eprintln!("could not drop the scratch database {}", self.name);
        }
    }
}

/// The replica listens before it has read its catalog: the examples start once
/// it is ready.
async fn wait_until_ready(base: &str) -> Result<(), String> {
    let client = reqwest::Client::new();
    let until = Instant::now() + Duration::from_secs(20);
    loop {
        let ready = client.get(format!("{base}/readyz")).send().await;
        if ready.is_ok_and(|answer| answer.status() == 200) {
            return Ok(());
        }
        if Instant::now() > until {
            return Err("the replica was not ready within 20 s".into());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Runs the blocks of `document` in order; how many ran and how many shown
/// outputs were checked, or the first failure, naming the document and line.
async fn run_blocks(
    document: &str,
    blocks: &[Block],
    shell: &ShellEnv,
    pool: &PgPool,
) -> Result<(usize, usize), String> {
    let (mut ran, mut outputs_checked) = (0, 0);
    for block in blocks.iter().filter(|block| block.runs()) {
        let started = Instant::now();
        let result = match block.language {
            Some(Language::Sh) => run_sh(block, shell).await,
            Some(Language::Sql) => run_sql(block, pool).await.map(|()| 0),
            None => unreachable!("only sh and sql blocks run"),
        };
        match result {
            Ok(checked) => {
                ran += 1;
                outputs_checked += checked;
                println!(
                    "{document} line {}: ```{} ok in {:.1?}, {checked} output(s) checked",
                    block.fence_line,
                    block.info,
                    started.elapsed()
                );
            }
            Err(failure) => {
                return Err(format!(
                    "{document} line {} (```{} block) fails:\n{failure}\n\nFix the example, or \
                     annotate the block as described at the top of tests/it/readme.rs.",
                    block.fence_line, block.info
                ))
            }
        }
    }
    Ok((ran, outputs_checked))
}

/// The files the README points at for configuration load as they are.
#[test]
// figment's Jail closures return figment::Error, which is large by design.
#[allow(clippy::result_large_err)]
fn the_example_configuration_files_load() {
    let root = repository_root();
    Jail::expect_with(|jail| {
        jail.set_env(
            "QUOTA_CONFIG",
            root.join("quota-arbiter.example.toml").display(),
        );
        let config = Config::load().expect("quota-arbiter.example.toml loads");
        assert_eq!(config.quotas["ppf"].hourly_ceiling, Some(1000));
        assert_eq!(config.flows["invoice"].quota.as_deref(), Some("ppf"));
        Ok(())
    });
    let env_example = std::fs::read_to_string(root.join(".env.example")).unwrap();
    Jail::expect_with(|jail| {
        let mut set = 0;
        for line in env_example.lines() {
            let Some((key, value)) = line.split_once('=') else {
                continue;
            };
            // Other tests of this binary read DATABASE_URL while this one runs.
            if line.starts_with('#') || key == "DATABASE_URL" {
                continue;
            }
            jail.set_env(key, value);
            set += 1;
        }
        assert!(set > 0, ".env.example sets variables");
        Config::load().expect(".env.example loads");
        Ok(())
    });
}

fn repository_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

async fn require_tools() {
    let found = tokio::process::Command::new("bash")
        .arg("-c")
        .arg(format!(
            "for tool in {TOOLS}; do command -v $tool >/dev/null || echo $tool; done"
        ))
        .output()
        .await
        .expect("bash runs the README's examples");
    let missing = String::from_utf8_lossy(&found.stdout);
    assert!(
        missing.trim().is_empty(),
        "the README's examples need {TOOLS}; missing: {}",
        missing.split_whitespace().collect::<Vec<_>>().join(" ")
    );
}

#[derive(Debug, PartialEq)]
enum Language {
    Sh,
    Sql,
}

#[derive(Debug, Default)]
struct Annotations {
    skip: Option<String>,
    output: bool,
    setup: Option<String>,
    limit: Option<Duration>,
}

impl Annotations {
    fn is_empty(&self) -> bool {
        self.skip.is_none() && !self.output && self.setup.is_none() && self.limit.is_none()
    }

    fn add(&mut self, directive: &str) -> Result<(), String> {
        if directive == "output" {
            self.output = true;
        } else if let Some(reason) = directive.strip_prefix("skip:") {
            if reason.trim().is_empty() {
                return Err("`skip:` needs a reason".into());
            }
            self.skip = Some(reason.trim().into());
        } else if let Some(setup) = directive.strip_prefix("setup:") {
            if self.setup.replace(setup.trim().into()).is_some() {
                return Err("one `setup:` per block".into());
            }
        } else if let Some(limit) = directive.strip_prefix("timeout ") {
            let limit = humantime::parse_duration(limit.trim())
                .map_err(|error| format!("`{directive}`: {error}"))?;
            self.limit = Some(limit);
        } else {
            return Err(format!(
                "unknown annotation `{directive}` (known: `skip: why`, `output`, \
                 `setup: bash`, `timeout 30s`)"
            ));
        }
        Ok(())
    }
}

/// A fenced block of the README.
struct Block {
    /// README line of the opening fence; the body starts on the next line.
    fence_line: usize,
    info: String,
    /// `None`: a block that is not run.
    language: Option<Language>,
    body: Vec<String>,
    annotations: Annotations,
}

impl Block {
    /// Whether the block runs: an sh or sql block neither skipped nor output.
    fn runs(&self) -> bool {
        self.language.is_some() && self.annotations.skip.is_none() && !self.annotations.output
    }

    /// The README line of body line `index`.
    fn line_of(&self, index: usize) -> usize {
        self.fence_line + 1 + index
    }
}

fn parse_readme(text: &str) -> Result<Vec<Block>, String> {
    let lines: Vec<&str> = text.lines().collect();
    let mut blocks = Vec::new();
    let mut pending = Annotations::default();
    let mut pending_line = 0;
    let mut at = 0;
    while at < lines.len() {
        let line = lines[at].trim_start();
        if let Some(rest) = line.strip_prefix("<!-- readme:") {
            let start = at;
            let mut comment = rest.to_string();
            while !comment.contains("-->") {
                at += 1;
                let next = lines
                    .get(at)
                    .ok_or(format!("line {}: annotation without `-->`", start + 1))?;
                comment.push('\n');
                comment.push_str(next);
            }
            let (directive, after) = comment.split_once("-->").unwrap();
            if !after.trim().is_empty() {
                return Err(format!("line {}: text after the annotation", start + 1));
            }
            pending
                .add(directive.trim())
                .map_err(|problem| format!("line {}: {problem}", start + 1))?;
            if pending_line == 0 {
                pending_line = start + 1;
            }
        } else if let Some(info) = line.strip_prefix("```") {
            let fence_line = at + 1;
            let mut body = Vec::new();
            loop {
                at += 1;
                let next = lines
                    .get(at)
                    .ok_or(format!("line {fence_line}: block never closed"))?;
                if next.trim() == "```" {
                    break;
                }
                body.push(next.to_string());
            }
            let info = info.trim().to_string();
            let language = match info.split_whitespace().next() {
                Some("sh" | "bash" | "shell") => Some(Language::Sh),
                Some("sql") => Some(Language::Sql),
                _ => None,
            };
            if language.is_none() && !pending.is_empty() {
                return Err(format!(
                    "line {pending_line}: annotations apply to sh and sql blocks, \
                     the block at line {fence_line} is ```{info}"
                ));
            }
            blocks.push(Block {
                fence_line,
                info,
                language,
                body,
                annotations: std::mem::take(&mut pending),
            });
            pending_line = 0;
        } else if !line.is_empty() && !pending.is_empty() {
            return Err(format!(
                "line {pending_line}: an annotation must come right before a fenced block \
                 (line {} is in between)",
                at + 1
            ));
        }
        at += 1;
    }
    if !pending.is_empty() {
        return Err(format!("line {pending_line}: annotation without a block"));
    }
    Ok(blocks)
}

/// An output the README shows right after a command of an sh block.
#[derive(Debug, PartialEq)]
struct ExpectedOutput {
    /// Body index of the command's first line.
    command: usize,
    /// Body index of the first comment line that shows the output.
    comment: usize,
    json: String,
}

fn is_comment(line: &str) -> bool {
    line.trim_start().starts_with('#')
}

fn is_command(line: &str) -> bool {
    !line.trim().is_empty() && !is_comment(line)
}

fn comment_text(line: &str) -> &str {
    let text = line.trim_start().trim_start_matches('#');
    text.strip_prefix(' ').unwrap_or(text)
}

fn expected_outputs(body: &[String]) -> Vec<ExpectedOutput> {
    let mut found = Vec::new();
    let mut at = 1;
    while at < body.len() {
        let shows_json = comment_text(&body[at]).trim_start().starts_with(['{', '[']);
        if !(is_comment(&body[at]) && is_command(&body[at - 1]) && shows_json) {
            at += 1;
            continue;
        }
        let mut command = at - 1;
        while command > 0 && is_command(&body[command - 1]) {
            command -= 1;
        }
        let comment = at;
        while at < body.len() && is_comment(&body[at]) {
            at += 1;
        }
        let json = body[comment..at]
            .iter()
            .map(|line| comment_text(line))
            .collect::<Vec<_>>()
            .join("\n");
        found.push(ExpectedOutput {
            command,
            comment,
            json,
        });
    }
    found
}

/// What the sh blocks run with.
struct ShellEnv {
    address: String,
    vars: Vec<(String, String)>,
}

impl ShellEnv {
    fn new(database_url: &str, replica_base: &str) -> Self {
        let url = reqwest::Url::parse(database_url).expect("a database URL");
        // The service binary and, built beside it as the package's example
        // (examples/quota-arbiter-client.rs), the worker client's command.
        let binaries = Path::new(env!("CARGO_BIN_EXE_quota-arbiter"))
            .parent()
            .unwrap();
        let client = binaries.join("examples");
        assert!(
            client.join("quota-arbiter-client").is_file(),
            "cargo test builds the example quota-arbiter-client into {}",
            client.display()
        );
        let path = std::env::join_paths([binaries.to_path_buf(), client].into_iter().chain(
            std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default()),
        ))
        .unwrap();
        let mut vars = vec![
            ("PATH".into(), path.to_string_lossy().into_owned()),
            ("TOKEN".into(), ADMIN_TOKEN.into()),
            ("QUOTA_ADMIN_TOKEN".into(), ADMIN_TOKEN.into()),
            ("DATABASE_URL".into(), database_url.into()),
            (
                "PGHOST".into(),
                url.host_str().unwrap_or("localhost").into(),
            ),
            ("PGPORT".into(), url.port().unwrap_or(5432).to_string()),
            ("PGUSER".into(), url.username().into()),
            (
                "PGDATABASE".into(),
                url.path().trim_start_matches('/').into(),
            ),
        ];
        if let Some(password) = url.password() {
            vars.push(("PGPASSWORD".into(), password.into()));
        }
        // The CLI records its OS user in the audit trail.
        for inherited in ["HOME", "USER", "LOGNAME"] {
            if let Ok(value) = std::env::var(inherited) {
                vars.push((inherited.into(), value));
            }
        }
        Self {
            address: replica_base.trim_start_matches("http://").into(),
            vars,
        }
    }

    fn rewrite(&self, line: &str) -> String {
        line.replace(README_ADDRESS, &self.address)
            .replace(README_TOKEN, ADMIN_TOKEN)
    }
}

/// Runs an sh block; answers how many shown outputs it checked.
async fn run_sh(block: &Block, shell: &ShellEnv) -> Result<usize, String> {
    let outputs = expected_outputs(&block.body);
    let mut body: Vec<String> = block.body.iter().map(|line| shell.rewrite(line)).collect();
    // Marks on the lines themselves, so no line moves.
    for (n, output) in outputs.iter().enumerate() {
        body[output.command] = format!(
            "printf '\\n%s\\n' '{START_MARK}{n}'; {}",
            body[output.command]
        );
        body[output.comment] =
            format!("printf '\\n%s\\n' '{END_MARK}{n}' {}", body[output.comment]);
    }
    let mut head = vec![
        r#"set -euo pipefail; curl() { command curl --fail-with-body --show-error "$@"; }"#
            .to_string(),
    ];
    if let Some(setup) = &block.annotations.setup {
        head.extend(setup.lines().map(|line| shell.rewrite(line)));
    }
    // Blank lines up to the block's first README line, when the head fits.
    let aligned = head.len() < block.line_of(0);
    let padding = block.line_of(0).saturating_sub(head.len() + 1);
    let script_lines: Vec<String> = head
        .into_iter()
        .chain(std::iter::repeat_n(String::new(), padding))
        .chain(body)
        .collect();
    let script = script_lines.join("\n");

    let limit = block.annotations.limit.unwrap_or(DEFAULT_LIMIT);
    let run = tokio::process::Command::new("timeout")
        // The whole process group goes, children included.
        .arg("--kill-after=2s")
        .arg(format!("{}s", limit.as_secs_f64()))
        .args(["bash", "-c", &script])
        .current_dir(repository_root())
        .env_clear()
        .envs(shell.vars.iter().map(|(key, value)| (key, value)))
        .stdin(Stdio::null())
        .kill_on_drop(true)
        .output();
    let output = tokio::time::timeout(limit + Duration::from_secs(10), run)
        .await
        .map_err(|_| format!("still running {limit:?} past its time limit"))?
        .map_err(|error| format!("bash could not start: {error}"))?;
    let stdout = String::from_utf8_lossy(&output.stdout);
    let report = |problem: String| {
        let listing: String = script_lines
            .iter()
            .enumerate()
            .filter(|(_, line)| !line.is_empty())
            .map(|(n, line)| format!("{:>5} | {line}\n", n + 1))
            .collect();
        let numbering = if aligned {
            "the document's lines"
        } else {
            "script lines"
        };
        format!(
            "{problem}\n--- script as run ({numbering}) ---\n{listing}\
             --- stdout ---\n{stdout}\n--- stderr ---\n{}",
            String::from_utf8_lossy(&output.stderr)
        )
    };
    match output.status.code() {
        Some(0) => {}
        Some(124 | 137) => {
            return Err(report(format!(
                "ran out of its {limit:?} time limit (`<!-- readme: timeout 30s -->` gives it \
                 longer)"
            )))
        }
        Some(code) => return Err(report(format!("exited with status {code}"))),
        None => return Err(report("killed by a signal".into())),
    }
    for (n, expected) in outputs.iter().enumerate() {
        let line = block.line_of(expected.comment);
        let printed = between(
            &stdout,
            &format!("{START_MARK}{n}"),
            &format!("{END_MARK}{n}"),
        )
        .ok_or_else(|| report(format!("the command before line {line} did not finish")))?;
        let want = shown_json(&expected.json).map_err(|problem| {
            report(format!(
                "line {line}: the output shown is not JSON: {problem}"
            ))
        })?;
        let got: Value = serde_json::from_str(printed.trim()).map_err(|problem| {
            report(format!(
                "line {line}: the command printed no single JSON value ({problem}):\n{printed}"
            ))
        })?;
        if let Some(difference) = mismatch(&want, &got, "$") {
            return Err(report(format!(
                "line {line}: the output differs from the example at {difference}\nprinted: {got}"
            )));
        }
    }
    Ok(outputs.len())
}

fn between<'a>(text: &'a str, start: &str, end: &str) -> Option<&'a str> {
    let from = text.find(&format!("\n{start}\n"))? + start.len() + 2;
    let to = from + text[from..].find(&format!("\n{end}\n"))?;
    Some(&text[from..to])
}

/// The JSON an output comment shows, bare `...` left out.
fn shown_json(text: &str) -> Result<Value, serde_json::Error> {
    let bytes = text.as_bytes();
    let mut kept: Vec<u8> = Vec::with_capacity(bytes.len());
    let (mut at, mut in_string) = (0, false);
    while at < bytes.len() {
        let byte = bytes[at];
        if in_string {
            kept.push(byte);
            if byte == b'\\' && at + 1 < bytes.len() {
                kept.push(bytes[at + 1]);
                at += 1;
            } else if byte == b'"' {
                in_string = false;
            }
            at += 1;
        } else if bytes[at..].starts_with(b"...") {
            at += 3;
            while at < bytes.len() && bytes[at].is_ascii_whitespace() {
                at += 1;
            }
            if bytes.get(at) == Some(&b',') {
                // `..., "next": 1`: the comma went with the ellipsis.
                at += 1;
            } else {
                // `"last": 1, ...}`: so does the comma before it.
                while kept.last().is_some_and(u8::is_ascii_whitespace) {
                    kept.pop();
                }
                if kept.last() == Some(&b',') {
                    kept.pop();
                }
            }
        } else {
            in_string = byte == b'"';
            kept.push(byte);
            at += 1;
        }
    }
    serde_json::from_slice(&kept)
}

/// Where `got` differs from what the README shows, as a JSON path and both values.
fn mismatch(shown: &Value, got: &Value, path: &str) -> Option<String> {
    match (shown, got) {
        (Value::String(anything), _) if anything == "..." => None,
        (Value::Object(shown), Value::Object(got)) => shown.iter().find_map(|(key, value)| {
            let path = format!("{path}.{key}");
            match got.get(key) {
                None => Some(format!("{path}: missing (the example shows {value})")),
                Some(got) => mismatch(value, got, &path),
            }
        }),
        (Value::Array(shown), Value::Array(got)) if shown.len() == got.len() => shown
            .iter()
            .zip(got)
            .enumerate()
            .find_map(|(n, (shown, got))| mismatch(shown, got, &format!("{path}[{n}]"))),
        _ if shown == got => None,
        _ => Some(format!("{path}: the example shows {shown}, got {got}")),
    }
}

/// The statements of an sql block with the README line each starts on.
fn sql_statements(block: &Block) -> Vec<(usize, String)> {
    let mut statements = Vec::new();
    let mut current = String::new();
    let mut start = 0;
    for (index, line) in block.body.iter().enumerate() {
        let mut quote: Option<char> = None;
        let mut chars = line.chars().peekable();
        while let Some(c) = chars.next() {
            match quote {
                Some(open) if c == open => quote = None,
                Some(_) => {}
                None if c == '-' && chars.peek() == Some(&'-') => break,
                None if c == ';' => {
                    if !current.trim().is_empty() {
                        statements.push((start, current.trim().to_string()));
                    }
                    current.clear();
                    continue;
                }
                None if c == '\'' || c == '"' => quote = Some(c),
                None => {}
            }
            if current.trim().is_empty() && !c.is_whitespace() {
                start = block.line_of(index);
            }
            current.push(c);
        }
        current.push('\n');
    }
    if !current.trim().is_empty() {
        statements.push((start, current.trim().to_string()));
    }
    statements
}

async fn run_sql(block: &Block, pool: &PgPool) -> Result<(), String> {
    let statements = sql_statements(block);
    if statements.is_empty() {
        return Err("no statement in the block".into());
    }
    for (line, statement) in statements {
        sqlx::raw_sql(&statement)
            .execute(pool)
            .await
            .map_err(|error| format!("line {line}: {statement}\n{error}"))?;
    }
    Ok(())
}

/// The documents whose links are checked beside the book's chapters; one
/// that does not exist (yet) is left out.
const LINKED_DOCUMENTS: &[&str] = &["README.md", "client/README.md", "CHANGELOG.md"];

#[test]
fn every_relative_link_resolves() {
    let root = repository_root();
    let mut documents: Vec<PathBuf> = LINKED_DOCUMENTS
        .iter()
        .map(|document| root.join(document))
        .filter(|document| document.exists())
        .collect();
    documents.push(root.join("docs/SUMMARY.md"));
    documents.extend(
        book_chapters()
            .iter()
            .map(|chapter| root.join("docs").join(chapter)),
    );
    let shown = |path: &Path| {
        path.strip_prefix(&root)
            .unwrap_or(path)
            .display()
            .to_string()
    };

    let mut anchors: BTreeMap<PathBuf, BTreeSet<String>> = BTreeMap::new();
    let (mut broken, mut checked) = (Vec::new(), 0);
    for document in &documents {
        let Ok(text) = std::fs::read_to_string(document) else {
            broken.push(format!(
                "{}: listed in docs/SUMMARY.md, missing",
                shown(document)
            ));
            continue;
        };
        for (line, target) in links_of(&text) {
            if is_external(&target) {
                continue;
            }
            checked += 1;
            let (path, fragment) = match target.split_once('#') {
                Some((path, fragment)) => (path, Some(fragment)),
                None => (target.as_str(), None),
            };
            let path = percent_decoded(path.split('?').next().unwrap_or(""));
            let file = if path.is_empty() {
                document.clone()
            } else if let Some(from_root) = path.strip_prefix('/') {
                root.join(from_root)
            } else {
                document.parent().unwrap().join(&path)
            };
            let at = format!("{}:{line}: ({target})", shown(document));
            if !file.exists() {
                broken.push(format!("{at}: no file {}", shown(&file)));
                continue;
            }
            let Some(fragment) = fragment.filter(|f| !f.is_empty()) else {
                continue;
            };
            if file.extension().is_some_and(|ext| ext == "md") {
                let file = file.canonicalize().unwrap();
                let known = anchors.entry(file.clone()).or_insert_with(|| {
                    anchors_of(&std::fs::read_to_string(&file).unwrap_or_default())
                });
                if !known.contains(fragment) {
                    broken.push(format!(
                        "{at}: no heading of {} has the anchor #{fragment}",
                        shown(&file)
                    ));
                }
            }
        }
    }
    assert!(
        broken.is_empty(),
        "{} broken links (an anchor is a heading's text in lowercase, spaces as `-`, \
         other punctuation dropped):\n{}",
        broken.len(),
        broken.join("\n")
    );
    assert!(checked > 0, "no relative link found: the parser lost them");
}

fn is_external(target: &str) -> bool {
    target.contains("://") || target.starts_with("mailto:")
}

fn percent_decoded(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut decoded = Vec::with_capacity(bytes.len());
    let mut at = 0;
    while at < bytes.len() {
        let hex = bytes
            .get(at + 1..at + 3)
            .and_then(|hex| u8::from_str_radix(std::str::from_utf8(hex).ok()?, 16).ok());
        match (bytes[at], hex) {
            (b'%', Some(byte)) => {
                decoded.push(byte);
                at += 3;
            }
            (byte, _) => {
                decoded.push(byte);
                at += 1;
            }
        }
    }
    String::from_utf8_lossy(&decoded).into_owned()
}

/// The lines of `text` outside fenced code blocks and HTML comments, with
/// their line numbers.
fn prose_lines(text: &str) -> Vec<(usize, &str)> {
    let mut lines = Vec::new();
    let (mut fence, mut in_comment): (Option<&str>, bool) = (None, false);
    for (n, line) in text.lines().enumerate() {
        let trimmed = line.trim_start();
        if let Some(open) = fence {
            if trimmed.starts_with(open) && trimmed.trim_start_matches(open).trim().is_empty() {
                fence = None;
            }
            continue;
        }
        if in_comment {
            in_comment = !line.contains("-->");
            continue;
        }
        if trimmed.starts_with("```") || trimmed.starts_with("~~~") {
            fence = Some(&trimmed[..3]);
            continue;
        }
        if let Some((_, after)) = line.split_once("<!--") {
            in_comment = !after.contains("-->");
            if trimmed.starts_with("<!--") {
                continue;
            }
        }
        lines.push((n + 1, line));
    }
    lines
}

/// `line` without its inline code spans.
fn without_code_spans(line: &str) -> String {
    let mut kept = String::with_capacity(line.len());
    let mut rest = line;
    while let Some(start) = rest.find('`') {
        let ticks = rest[start..].chars().take_while(|&c| c == '`').count();
        let fence = "`".repeat(ticks);
        let after = &rest[start + ticks..];
        match after.find(&fence) {
            Some(end) => {
                kept.push_str(&rest[..start]);
                rest = &after[end + ticks..];
            }
            None => {
                kept.push_str(&rest[..start + ticks]);
                rest = after;
            }
        }
    }
    kept.push_str(rest);
    kept
}

/// The targets of the inline links and images of one line of prose, and of a
/// reference definition (`[name]: target`).
fn markdown_links(line: &str) -> Vec<String> {
    let line = without_code_spans(line);
    let mut targets = Vec::new();
    let definition = line.trim_start();
    if definition.starts_with('[') && !definition.starts_with("[^") {
        if let Some((_, target)) = definition.split_once("]:") {
            if let Some(target) = target.split_whitespace().next() {
                targets.push(target.trim_matches(['<', '>']).to_string());
            }
            return targets;
        }
    }
    let mut rest = line.as_str();
    while let Some(at) = rest.find("](") {
        rest = &rest[at + 2..];
        let target = if let Some(inside) = rest.strip_prefix('<') {
            inside.split('>').next().unwrap_or("")
        } else {
            let mut depth = 0;
            let end = rest
                .char_indices()
                .find(|&(_, c)| match c {
                    '(' => {
                        depth += 1;
                        false
                    }
                    ')' if depth == 0 => true,
                    ')' => {
                        depth -= 1;
                        false
                    }
                    c => c.is_whitespace(),
                })
                .map_or(rest.len(), |(end, _)| end);
            &rest[..end]
        };
        if !target.is_empty() {
            targets.push(target.to_string());
        }
    }
    targets
}

fn links_of(text: &str) -> Vec<(usize, String)> {
    prose_lines(text)
        .into_iter()
        .flat_map(|(n, line)| markdown_links(line).into_iter().map(move |link| (n, link)))
        .collect()
}

/// The anchor of every heading of a Markdown document, as mdBook and GitHub
/// write them: the heading's text (code, links and emphasis reduced to their
/// words) in lowercase, whitespace as `-`, punctuation but `-` and `_`
/// dropped; a repeated anchor gets `-1`, `-2`, ….
fn anchors_of(text: &str) -> BTreeSet<String> {
    let mut anchors = BTreeSet::new();
    for (_, line) in prose_lines(text) {
        let hashes = line.chars().take_while(|&c| c == '#').count();
        if !(1..=6).contains(&hashes) || !line[hashes..].starts_with(' ') {
            continue;
        }
        let base = anchor_of(line[hashes..].trim().trim_end_matches('#').trim());
        let mut anchor = base.clone();
        let mut n = 0;
        while !anchors.insert(anchor.clone()) {
            n += 1;
            anchor = format!("{base}-{n}");
        }
    }
    anchors
}

fn anchor_of(heading: &str) -> String {
    // A link's text stays, its target goes.
    let mut words = String::new();
    let mut rest = heading;
    while let Some(at) = rest.find("](") {
        words.push_str(&rest[..at]);
        rest = rest[at..].split_once(')').map_or("", |(_, after)| after);
    }
    words.push_str(rest);
    words
        .chars()
        .filter_map(|c| match c {
            c if c.is_alphanumeric() || c == '-' || c == '_' => {
                Some(c.to_lowercase().next().unwrap())
            }
            c if c.is_whitespace() => Some('-'),
            _ => None,
        })
        .collect()
}

#[test]
fn links_and_anchors_are_read_as_mdbook_and_github_write_them() {
    assert_eq!(
        markdown_links(
            "See [the guide](guide/x.md#a-b), ![img](p.png \"title\") and `[no](code.md)`."
        ),
        ["guide/x.md#a-b", "p.png"]
    );
    assert_eq!(markdown_links("[ref]: ../src/lib.rs"), ["../src/lib.rs"]);
    assert_eq!(markdown_links("[a](<with space.md>)"), ["with space.md"]);
    let text = "# Title\n```sh\n# not a heading\n```\n## `POST /v1/reserve`\n\
                ### GET /v1/work/{id}\n## 1. The problem\n## Title\n\
                <!-- readme: setup:\n# not a heading\n-->\n## [Linked](x.md) *words*\n";
    let anchors: Vec<String> = anchors_of(text).into_iter().collect();
    assert_eq!(
        anchors,
        [
            "1-the-problem",
            "get-v1workid",
            "linked-words",
            "post-v1reserve",
            "title",
            "title-1"
        ]
    );
    assert_eq!(percent_decoded("a%20b.md"), "a b.md");
}

#[test]
fn output_comments_are_found_after_their_command() {
    let body: Vec<String> = [
        "TOKEN=x",
        "# a note, not output",
        "curl -s a \\",
        "     -d '{}'",
        "# {\"outcome\": \"granted\",",
        "#  \"flow\": \"invoice\"}",
        "",
        "# [1, 2]",
        "echo done",
    ]
    .map(String::from)
    .to_vec();
    assert_eq!(
        expected_outputs(&body),
        vec![ExpectedOutput {
            command: 2,
            comment: 4,
            json: "{\"outcome\": \"granted\",\n \"flow\": \"invoice\"}".into(),
        }]
    );
}

#[test]
fn shown_output_matches_by_subset_with_ellipses() {
    let got = serde_json::json!({"decisions": [
        {"ref": "a", "outcome": "granted", "retry_at": null},
        {"ref": "b", "outcome": "deferred", "retry_at": "2026-11-30T15:00:00Z"}]});
    let shown = shown_json(
        r#"{"decisions": [{"ref": "a", ...}, {..., "outcome": "deferred", "retry_at": "..."}]}"#,
    )
    .unwrap();
    assert_eq!(mismatch(&shown, &got, "$"), None);
    let wrong =
        shown_json(r#"{"decisions": [{"ref": "a"}, {"outcome": "granted", ...}]}"#).unwrap();
    assert_eq!(
        mismatch(&wrong, &got, "$").as_deref(),
        Some(r#"$.decisions[1].outcome: the example shows "granted", got "deferred""#)
    );
    let shorter = shown_json(r#"{"decisions": [{"ref": "a"}]}"#).unwrap();
    assert!(
        mismatch(&shorter, &got, "$").is_some(),
        "arrays keep their length"
    );
    let literal = shown_json(r#"{"note": "... is text here"}"#).unwrap();
    assert_eq!(literal["note"], "... is text here");
}

#[test]
fn annotations_must_be_known_and_placed_before_a_block() {
    let readme = "<!-- readme: skip: serves forever -->\n\n```sh\nserve\n```\n\
                  <!-- readme: setup:\nemit() { true; }\n-->\n<!-- readme: timeout 2s -->\n```bash\nemit\n```\n\
                  ```rust\nloop {}\n```\n";
    let blocks = parse_readme(readme).unwrap();
    assert_eq!(blocks.len(), 3);
    assert_eq!(
        blocks[0].annotations.skip.as_deref(),
        Some("serves forever")
    );
    assert_eq!(blocks[1].fence_line, 10);
    assert_eq!(
        blocks[1].annotations.setup.as_deref(),
        Some("emit() { true; }")
    );
    assert_eq!(blocks[1].annotations.limit, Some(Duration::from_secs(2)));
    assert_eq!(blocks[2].language, None);
    for broken in [
        "<!-- readme: skipp: typo -->\n```sh\ntrue\n```\n",
        "<!-- readme: skip: -->\n```sh\ntrue\n```\n",
        "<!-- readme: output -->\nsome prose\n```sh\ntrue\n```\n",
        "<!-- readme: output -->\n```rust\nfn main() {}\n```\n",
        "<!-- readme: output -->\n",
    ] {
        assert!(parse_readme(broken).is_err(), "{broken}");
    }
}

#[test]
fn sql_blocks_split_into_statements_outside_quotes_and_comments() {
    let block = Block {
        fence_line: 10,
        info: "sql".into(),
        language: Some(Language::Sql),
        body: [
            "SELECT 1; -- one; not two",
            "SELECT ';' AS semicolon,",
            "       2 AS \"a;b\";",
            "SELECT 3",
        ]
        .map(String::from)
        .to_vec(),
        annotations: Annotations::default(),
    };
    assert_eq!(
        sql_statements(&block),
        vec![
            (11, "SELECT 1".to_string()),
            (
                12,
                "SELECT ';' AS semicolon,\n       2 AS \"a;b\"".to_string()
            ),
            (14, "SELECT 3".to_string()),
        ]
    );
}
