//! The README is executable: every fenced `sh` and `sql` block of README.md
//! runs, in document order, against one live replica (a real
//! `quota-arbiter serve` process) on a fresh database, so an example cannot
//! drift from the behaviour unnoticed.
//!
//! **sh blocks** (also tagged `bash` or `shell`) run with `bash` under
//! `set -euo pipefail`, each in a process of its own (only the database and the
//! replica carry over from one block to the next), in the repository root, with
//! - `localhost:8080` rewritten to the replica's address, and the README's
//!   placeholder admin token `change-me` to the replica's token;
//! - `TOKEN` and `QUOTA_ADMIN_TOKEN` set to that token, `DATABASE_URL` and
//!   `PGHOST`/`PGPORT`/`PGUSER`/`PGDATABASE` (for `psql -c`) naming the test
//!   database, and the built `quota-arbiter` first on `PATH` (CLI examples run);
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

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use figment::Jail;
use quota_arbiter::config::Config;
use serde_json::Value;
use sqlx::PgPool;

use crate::helpers::{database_url, postgres_host_port, Replica, ADMIN_TOKEN};

/// Where the README's examples expect the service.
const README_ADDRESS: &str = "localhost:8080";
/// The admin token the README's examples configure and send.
const README_TOKEN: &str = "change-me";
const DEFAULT_LIMIT: Duration = Duration::from_secs(10);
/// What the examples call besides the built binary.
const TOOLS: &str = "bash curl jq psql timeout date";
const START_MARK: &str = "@@readme-output-start-";
const END_MARK: &str = "@@readme-output-end-";

#[sqlx::test]
async fn every_readme_example_runs_as_written(pool: PgPool) {
    require_tools().await;
    let readme = std::fs::read_to_string(repository_root().join("README.md")).unwrap();
    let blocks = parse_readme(&readme).unwrap_or_else(|problem| panic!("README.md: {problem}"));
    let url = database_url(&pool, &postgres_host_port()).await;
    let replica = Replica::spawn(&url).await;
    let shell = ShellEnv::new(&url, &replica.base);

    let (mut ran, mut outputs_checked) = (0, 0);
    for block in &blocks {
        let (Some(language), None, false) = (
            &block.language,
            &block.annotations.skip,
            block.annotations.output,
        ) else {
            continue;
        };
        let started = Instant::now();
        let result = match language {
            Language::Sh => run_sh(block, &shell).await,
            Language::Sql => run_sql(block, &pool).await.map(|()| 0),
        };
        match result {
            Ok(checked) => {
                ran += 1;
                outputs_checked += checked;
                println!(
                    "README line {}: ```{} ok in {:.1?}, {checked} output(s) checked",
                    block.fence_line,
                    block.info,
                    started.elapsed()
                );
            }
            Err(failure) => panic!(
                "README.md line {} (```{} block) fails:\n{failure}\n\nFix the example, or \
                 annotate the block as described at the top of tests/it/readme.rs.",
                block.fence_line, block.info
            ),
        }
    }
    assert!(
        ran > 0 && outputs_checked > 0,
        "the README ran {ran} blocks and checked {outputs_checked} outputs: the parser lost them"
    );
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
        assert_eq!(config.flows["invoice"].quota, "ppf");
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
        let binary = Path::new(env!("CARGO_BIN_EXE_quota-arbiter"));
        let path = std::env::join_paths(
            std::iter::once(binary.parent().unwrap().to_path_buf()).chain(std::env::split_paths(
                &std::env::var_os("PATH").unwrap_or_default(),
            )),
        )
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
            "README lines"
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
                "line {line}: the output differs from the README at {difference}\nprinted: {got}"
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
                None => Some(format!("{path}: missing (the README shows {value})")),
                Some(got) => mismatch(value, got, &path),
            }
        }),
        (Value::Array(shown), Value::Array(got)) if shown.len() == got.len() => shown
            .iter()
            .zip(got)
            .enumerate()
            .find_map(|(n, (shown, got))| mismatch(shown, got, &format!("{path}[{n}]"))),
        _ if shown == got => None,
        _ => Some(format!("{path}: the README shows {shown}, got {got}")),
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
        Some(r#"$.decisions[1].outcome: the README shows "granted", got "deferred""#)
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
