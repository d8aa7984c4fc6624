//! The reference chapters of the book are held to the code, so that they
//! cannot drift from it: the HTTP API page to the OpenAPI document the app
//! serves (and the role table), the command line page to the binary's own
//! `--help`, the configuration page to the keys the configuration knows.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;

use clap::CommandFactory;
use quota_arbiter::cli::Cli;
use quota_arbiter::config::{ignored_env_vars, Config};
use quota_arbiter::domain::catalog::FlowSeed;
use serde_json::Value;

fn chapter(path: &str) -> String {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("docs")
        .join(path);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// `docs/reference/http.md` has one `### METHOD /path` heading per operation
/// of the document the app serves, and no other; under each, a first line
/// `Role: …` names the least role its group declares for `keys` mode (the
/// operation's `x-required-role`).
#[test]
fn the_http_reference_has_a_heading_per_operation_with_its_role() {
    // The document the app serves (tests/it/openapi.rs holds the two equal).
    let spec = serde_json::to_value(quota_arbiter::http::openapi()).unwrap();
    let methods = [
        "get", "put", "post", "delete", "patch", "head", "options", "trace",
    ];
    let operations: BTreeSet<String> = spec["paths"]
        .as_object()
        .expect("paths")
        .iter()
        .flat_map(|(path, operations)| {
            let operations = operations.as_object().expect("operations");
            methods
                .iter()
                .filter(|method| operations.contains_key(**method))
                .map(move |method| format!("{} {path}", method.to_uppercase()))
        })
        .collect();

    let page = chapter("reference/http.md");
    let lines: Vec<&str> = page.lines().collect();
    let mut documented = BTreeSet::new();
    let mut problems = Vec::new();
    for (n, line) in lines.iter().enumerate() {
        let Some(operation) = line.strip_prefix("### ") else {
            continue;
        };
        if !documented.insert(operation.to_string()) {
            problems.push(format!("line {}: `{operation}` twice", n + 1));
        }
        let Some((method, path)) = operation.split_once(' ') else {
            problems.push(format!(
                "line {}: `### {operation}` is not `### METHOD /path`",
                n + 1
            ));
            continue;
        };
        let role = lines[n + 1..]
            .iter()
            .find(|line| !line.trim().is_empty())
            .and_then(|line| line.strip_prefix("Role: "));
        // The role the operation's group declares, as the document says it.
        let declared = spec["paths"][path][method.to_lowercase()]["x-required-role"].as_str();
        let expected = match declared {
            Some("none") => "none.".to_string(),
            Some(role) => format!("`{role}`."),
            None => "the x-required-role of a documented operation".into(),
        };
        if role != Some(expected.as_str()) {
            problems.push(format!(
                "line {}: under `### {operation}` the first line should be `Role: {expected}` \
                 (its group's role, x-required-role), not {role:?}",
                n + 1
            ));
        }
    }
    let missing: Vec<_> = operations.difference(&documented).collect();
    let stale: Vec<_> = documented.difference(&operations).collect();
    assert!(
        missing.is_empty() && stale.is_empty() && problems.is_empty(),
        "docs/reference/http.md against GET /openapi.json:\n\
         operations without a `### METHOD /path` heading: {missing:?}\n\
         headings of no operation: {stale:?}\n{}",
        problems.join("\n")
    );
}

/// Every command of the CLI, as the words that name it (`["keys", "create"]`),
/// the binary itself first; clap's own `help` subcommand left out.
fn commands(command: &clap::Command, path: Vec<String>, all: &mut Vec<Vec<String>>) {
    all.push(path.clone());
    for sub in command.get_subcommands() {
        if sub.get_name() == "help" {
            continue;
        }
        let mut path = path.clone();
        path.push(sub.get_name().to_string());
        commands(sub, path, all);
    }
}

/// What `<binary> <words> --help` prints, lines without trailing spaces.
fn help_of(binary: &std::path::Path, words: &[String]) -> String {
    let output = std::process::Command::new(binary)
        .args(words)
        .arg("--help")
        .env_clear()
        .output()
        .expect("the binary runs");
    assert!(output.status.success(), "{words:?} --help fails");
    normalized(&String::from_utf8_lossy(&output.stdout))
}

fn normalized(text: &str) -> String {
    text.trim_end()
        .lines()
        .map(str::trim_end)
        .collect::<Vec<_>>()
        .join("\n")
}

/// The help blocks of the page: each `## quota-arbiter …` (or
/// `## quota-arbiter-client …`) heading with the first ```text block after it.
fn help_blocks(page: &str) -> BTreeMap<String, String> {
    let mut blocks = BTreeMap::new();
    let mut lines = page.lines();
    while let Some(line) = lines.next() {
        let Some(name) = line.strip_prefix("## ") else {
            continue;
        };
        if !name.starts_with("quota-arbiter") {
            continue;
        }
        let body: Vec<&str> = lines
            .by_ref()
            .skip_while(|line| line.trim() != "```text")
            .skip(1)
            .take_while(|line| line.trim() != "```")
            .collect();
        blocks.insert(name.to_string(), normalized(&body.join("\n")));
    }
    blocks
}

/// `docs/reference/cli.md` holds every command's `--help` as its binary
/// prints it (trailing spaces aside), under `## <binary> <command>`: the
/// service's `quota-arbiter`, and the worker client's `quota-arbiter-client`
/// (built beside it as the package's example).
#[test]
fn the_command_line_reference_is_every_commands_help() {
    let service = PathBuf::from(env!("CARGO_BIN_EXE_quota-arbiter"));
    let client = service
        .parent()
        .unwrap()
        .join("examples/quota-arbiter-client");
    let programs = [
        ("quota-arbiter", Cli::command(), service.clone()),
        (
            "quota-arbiter-client",
            quota_arbiter_client::command::command(),
            client,
        ),
    ];
    let page = help_blocks(&chapter("reference/cli.md"));
    let mut wrong = Vec::new();
    let mut named = BTreeSet::new();
    for (program, command, binary) in &programs {
        let mut all = Vec::new();
        commands(command, Vec::new(), &mut all);
        for words in &all {
            let name = std::iter::once(*program)
                .chain(words.iter().map(String::as_str))
                .collect::<Vec<_>>()
                .join(" ");
            let help = help_of(binary, words);
            if page.get(&name) != Some(&help) {
                let why = if page.contains_key(&name) {
                    "differs"
                } else {
                    "is missing"
                };
                wrong.push(format!(
                    "`{name}` {why}; the section should read:\n\n## {name}\n\n```text\n{help}\n```\n"
                ));
            }
            named.insert(name);
        }
    }
    let stale: Vec<_> = page.keys().filter(|name| !named.contains(*name)).collect();
    assert!(
        wrong.is_empty() && stale.is_empty(),
        "docs/reference/cli.md against the binaries' --help:\n\n{}\nsections of no command: {stale:?}",
        wrong.join("\n")
    );
}

/// Each key the configuration knows (`quotas.NAME.rate` for the tables of
/// seeds), with its serialized default for the top-level ones.
fn configuration_keys() -> BTreeMap<String, Option<Value>> {
    let sample = Config {
        quotas: [("NAME".to_string(), Default::default())].into(),
        flows: [(
            "NAME".to_string(),
            FlowSeed {
                quota: Some("q".into()),
                quotas: None,
                mode: None,
                priority: None,
                fallback: None,
            },
        )]
        .into(),
        route_classes: [(
            "NAME".to_string(),
            quota_arbiter::domain::admission::RouteClassSettings {
                burst: 1.0,
                rate: 1.0,
                capacity: 1,
                window_seconds: 60,
                tenant_share: 1.0,
                capacity_error_budget: 0.01,
            },
        )]
        .into(),
        ..Config::default()
    };
    let Value::Object(keys) = serde_json::to_value(&sample).unwrap() else {
        panic!("a configuration serializes to an object");
    };
    let mut known = BTreeMap::new();
    for (key, value) in keys {
        match value {
            Value::Object(tables) => {
                for (name, table) in tables {
                    for field in table.as_object().expect("a seed is a table").keys() {
                        known.insert(format!("{key}.{name}.{field}"), None);
                    }
                }
            }
            default => {
                known.insert(key, Some(default));
            }
        }
    }
    known
}

/// A table row's cells, code spans' backticks dropped.
fn cells(row: &str) -> Vec<String> {
    row.trim()
        .trim_matches('|')
        .split('|')
        .map(|cell| cell.trim().trim_matches('`').to_string())
        .collect()
}

fn same_default(shown: &str, default: &Value) -> bool {
    match default {
        Value::Null => shown == "unset",
        Value::String(text) => {
            shown == text
                || matches!(
                    (humantime::parse_duration(shown), humantime::parse_duration(text)),
                    (Ok(a), Ok(b)) if a == b
                )
        }
        other => serde_json::from_str::<Value>(shown).is_ok_and(|shown| shown == *other),
    }
}

/// `docs/reference/configuration.md` has a row for every key the
/// configuration knows and for no other: its environment variable (the one
/// the code reads, or `—` for none) and, for top-level keys, its default.
#[test]
fn the_configuration_reference_names_every_key() {
    let known = configuration_keys();
    let page = chapter("reference/configuration.md");
    let mut rows = BTreeMap::new();
    let mut problems = Vec::new();
    for (n, line) in page.lines().enumerate() {
        if !line.starts_with("| `") {
            continue;
        }
        let cells = cells(line);
        if rows
            .insert(cells[0].clone(), (n + 1, cells.clone()))
            .is_some()
        {
            problems.push(format!("line {}: `{}` twice", n + 1, cells[0]));
        }
    }
    for (key, default) in &known {
        let Some((line, cells)) = rows.get(key) else {
            problems.push(format!("`{key}` has no row"));
            continue;
        };
        let variable = format!("QUOTA_{}", key.to_uppercase());
        // The database's URL is the one key read under a name of its own.
        let expected_env = if key == "database_url" {
            "DATABASE_URL".to_string()
        } else if !key.contains('.') && ignored_env_vars([variable.clone()]).is_empty() {
            variable
        } else {
            "—".to_string()
        };
        if cells.get(1) != Some(&expected_env) {
            problems.push(format!(
                "line {line}: `{key}`'s environment variable is {expected_env}, the row says {:?}",
                cells.get(1)
            ));
        }
        if let Some(default) = default {
            if !cells
                .get(2)
                .is_some_and(|shown| same_default(shown, default))
            {
                problems.push(format!(
                    "line {line}: `{key}`'s default is {default}, the row says {:?}",
                    cells.get(2)
                ));
            }
        }
    }
    for (key, (line, _)) in &rows {
        if !known.contains_key(key) {
            problems.push(format!("line {line}: `{key}` is no configuration key"));
        }
    }
    assert!(
        problems.is_empty(),
        "docs/reference/configuration.md against the configuration:\n{}",
        problems.join("\n")
    );
}
