//! The crate's layers (docs/design.md §9): which top-level module of `src/`
//! names which other (`crate::x` anywhere outside comments and unit-test
//! modules), read from the source. No module reaches back to one that
//! reaches it — no import cycle — and `domain`, the leaf, names none.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Each top-level module and the top-level modules it names.
fn module_graph() -> BTreeMap<String, BTreeSet<String>> {
    let src = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    let mut files = Vec::new();
    collect(&src, &mut files);
    for file in files {
        let module = top_module(&src, &file);
        if module == "lib" || module == "main" {
            continue;
        }
        let text = std::fs::read_to_string(&file).unwrap();
        let named = graph.entry(module.clone()).or_default();
        for other in crate_paths(&code_of(&text)) {
            if other != module {
                named.insert(other);
            }
        }
    }
    graph
}

fn collect(dir: &Path, files: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            collect(&path, files);
        } else if path.extension().is_some_and(|e| e == "rs") {
            files.push(path);
        }
    }
}

/// `src/store/claim.rs` → `store`; `src/arbiter.rs` → `arbiter`.
fn top_module(src: &Path, file: &Path) -> String {
    let relative = file.strip_prefix(src).unwrap();
    let first = relative.components().next().unwrap().as_os_str();
    first.to_string_lossy().trim_end_matches(".rs").to_string()
}

/// The code of a file: without line comments (doc comments cite other
/// modules) and without its unit tests (`#[cfg(test)] mod tests`, at the end).
fn code_of(text: &str) -> String {
    let text = text
        .split("#[cfg(test)]\nmod tests")
        .next()
        .unwrap_or_default();
    text.lines()
        .map(|line| match line.find("//") {
            Some(at) => &line[..at],
            None => line,
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// The modules named as `crate::<module>` in `code`.
fn crate_paths(code: &str) -> BTreeSet<String> {
    code.match_indices("crate::")
        .filter(|(at, _)| {
            // `$crate::` and `quota_arbiter_crate::` are not this crate's paths.
            !code[..*at].ends_with(|c: char| c == '$' || c == '_' || c.is_alphanumeric())
        })
        .map(|(at, word)| {
            code[at + word.len()..]
                .chars()
                .take_while(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == '_')
                .collect::<String>()
        })
        .filter(|module| !module.is_empty())
        .collect()
}

/// A cycle of `graph`, if it has one: the modules on it, in order.
fn a_cycle(graph: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    fn visit(
        module: &str,
        graph: &BTreeMap<String, BTreeSet<String>>,
        path: &mut Vec<String>,
        done: &mut BTreeSet<String>,
    ) -> Option<Vec<String>> {
        if let Some(at) = path.iter().position(|m| m == module) {
            let mut cycle = path[at..].to_vec();
            cycle.push(module.to_string());
            return Some(cycle);
        }
        if done.contains(module) {
            return None;
        }
        path.push(module.to_string());
        for next in graph.get(module).into_iter().flatten() {
            if let Some(cycle) = visit(next, graph, path, done) {
                return Some(cycle);
            }
        }
        path.pop();
        done.insert(module.to_string());
        None
    }
    let mut done = BTreeSet::new();
    graph
        .keys()
        .find_map(|module| visit(module, graph, &mut Vec::new(), &mut done))
}

#[test]
fn no_module_of_src_reaches_back_to_one_that_reaches_it() {
    let graph = module_graph();
    assert!(graph.len() > 10, "the modules of src/: {graph:?}");
    assert_eq!(
        a_cycle(&graph),
        None,
        "an import cycle; the graph: {graph:#?}"
    );
}

#[test]
fn the_domain_names_nothing_else_of_the_crate() {
    let graph = module_graph();
    assert_eq!(graph.get("domain"), Some(&BTreeSet::new()), "{graph:#?}");
}

#[test]
fn the_reader_finds_crate_paths_and_cycles() {
    let code = code_of(
        "use crate::store::Store; // crate::http in a comment\n\
         let x = $crate::y; crate::domain::Limit::Budget;\n\
         #[cfg(test)]\nmod tests { use crate::startup; }",
    );
    assert_eq!(
        crate_paths(&code),
        BTreeSet::from(["domain".into(), "store".into()])
    );
    let graph = |edges: &[(&str, &str)]| {
        let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        for (from, to) in edges {
            graph
                .entry(from.to_string())
                .or_default()
                .insert(to.to_string());
        }
        graph
    };
    assert_eq!(a_cycle(&graph(&[("a", "b"), ("b", "c")])), None);
    assert_eq!(
        a_cycle(&graph(&[("a", "b"), ("b", "c"), ("c", "b")])),
        Some(vec!["b".into(), "c".into(), "b".into()])
    );
}

/// Whether `code` names the type `Store` itself (not `StoreError` and the
/// like), or reaches a `.store` field.
fn names_the_store(code: &str) -> bool {
    let word = |c: char| c == '_' || c.is_alphanumeric();
    let store_type = code.match_indices("Store").any(|(at, w)| {
        let before = code[..at].chars().next_back();
        let after = code[at + w.len()..].chars().next();
        // `CatalogError::Store(…)`: a variant that wraps a store error.
        let a_variant = code[..at].ends_with("Error::");
        !before.is_some_and(word) && !after.is_some_and(word) && !a_variant
    });
    let store_field = code.match_indices(".store").any(|(at, w)| {
        let after = code[at + w.len()..].chars().next();
        !after.is_some_and(word)
    });
    store_type || store_field
}

/// HTTP calls the products, which own their store calls through the one
/// shell (time budget, metrics, outage mapping): no handler reaches the
/// store itself.
#[test]
fn http_reaches_the_store_only_through_the_products() {
    let http = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("src/http");
    let mut files = Vec::new();
    collect(&http, &mut files);
    assert!(files.len() > 5, "{files:?}");
    let naming: Vec<_> = files
        .iter()
        .filter(|file| names_the_store(&code_of(&std::fs::read_to_string(file).unwrap())))
        .collect();
    assert!(
        naming.is_empty(),
        "HTTP modules naming the store: {naming:?}"
    );
}

#[test]
fn the_reader_finds_the_store_named() {
    assert!(names_the_store("use crate::store::Store;"));
    assert!(names_the_store("fn f(s: &Store) {}"));
    assert!(names_the_store("state.store.reserve()"));
    assert!(!names_the_store(
        "use crate::store::{StoreError, WindowRow};"
    ));
    assert!(!names_the_store(
        "state.reservations.decide(); let x = MyStore;"
    ));
    assert!(!names_the_store("state.store_errors.inc()"));
    assert!(!names_the_store(
        "CatalogError::Store(error) => error.into()"
    ));
}
