//! The schema's one place per object: every function and view is defined in
//! one file, `sql/functions/<name>.sql` or `sql/views/<name>.sql`, and nowhere
//! else (not in `migrations/`, not in a statement of `sql/`); a migrated
//! database holds exactly those, each once; and a test's database (sqlx's
//! `FRESH_MIGRATOR`) is exactly what `store::migrate` makes.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use quota_arbiter::store::{
    objects_fingerprint, recorded_fingerprint, FUNCTIONS, OBJECTS_REVISION, VIEWS,
};
use sqlx::postgres::PgPoolOptions;
use sqlx::PgPool;

use crate::helpers::{database_url, postgres_host_port};

const ROOT: &str = env!("CARGO_MANIFEST_DIR");

/// Every file under `dir` whose name ends with `extension`, recursively.
fn files(dir: &Path, extension: &str) -> Vec<PathBuf> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
        let path = entry.unwrap().path();
        if path.is_dir() {
            found.extend(files(&path, extension));
        } else if path.to_string_lossy().ends_with(extension) {
            found.push(path);
        }
    }
    found.sort();
    found
}

/// What a SQL file creates or alters, as (`create function`, name) pairs:
/// the words after `CREATE [OR REPLACE]` or `ALTER`, comments left out.
fn definitions(sql: &str) -> Vec<(String, String)> {
    let code: String = sql
        .lines()
        .map(|line| line.split_once("--").map_or(line, |(code, _)| code))
        .collect::<Vec<_>>()
        .join("\n")
        .to_lowercase();
    let words: Vec<&str> = code
        .split(|c: char| c.is_whitespace() || c == '(' || c == ';')
        .filter(|w| !w.is_empty())
        .collect();
    let mut found = Vec::new();
    for (i, word) in words.iter().enumerate() {
        let mut at = i + 1;
        let verb = match *word {
            "create" => {
                if words.get(at) == Some(&"or") && words.get(at + 1) == Some(&"replace") {
                    at += 2;
                }
                "create"
            }
            "alter" => "alter",
            _ => continue,
        };
        let mut kind = match words.get(at) {
            Some(&k @ ("function" | "procedure" | "view" | "aggregate")) => k.to_string(),
            Some(&"materialized") if words.get(at + 1) == Some(&"view") => {
                at += 1;
                "materialized view".into()
            }
            _ => continue,
        };
        let name = words.get(at + 1).copied().unwrap_or_default();
        let name = name.trim_start_matches("public.").trim_matches('"');
        kind = format!("{verb} {kind}");
        found.push((kind, name.to_string()));
    }
    found
}

fn relative(path: &Path) -> String {
    path.strip_prefix(ROOT)
        .unwrap_or(path)
        .to_string_lossy()
        .into_owned()
}

/// The names of `sql/<dir>/*.sql`.
fn object_files(dir: &str) -> Vec<String> {
    files(&Path::new(ROOT).join("sql").join(dir), ".sql")
        .iter()
        .map(|path| path.file_stem().unwrap().to_string_lossy().into_owned())
        .collect()
}

#[test]
fn each_function_and_view_is_defined_in_one_file_of_its_own() {
    // name -> every (file, what) that defines or alters it.
    let mut defined: BTreeMap<String, Vec<(String, String)>> = BTreeMap::new();
    let mut sql_files = files(&Path::new(ROOT).join("sql"), ".sql");
    sql_files.extend(files(&Path::new(ROOT).join("migrations"), ".sql"));
    for path in &sql_files {
        let text = std::fs::read_to_string(path).unwrap();
        for (what, name) in definitions(&text) {
            defined
                .entry(name)
                .or_default()
                .push((relative(path), what));
        }
    }
    assert!(
        defined.len() >= FUNCTIONS.len() + VIEWS.len(),
        "found {defined:?}"
    );
    for (name, places) in &defined {
        let [(file, what)] = places.as_slice() else {
            panic!("{name} is defined or altered in more than one place: {places:?}");
        };
        let own = match what.as_str() {
            "create function" => format!("sql/functions/{name}.sql"),
            "create view" => format!("sql/views/{name}.sql"),
            // A function's settings (SET clauses) are part of its file: a
            // migration's ALTER would be undone by the next migrate.
            _ => panic!("{file}: {what} {name}: functions and views are created in sql/functions/ or sql/views/ only"),
        };
        assert_eq!(file, &own, "{what} {name} belongs in its own file");
    }
    // And each of those files holds its one definition (the map above would
    // list a second one under the same name).
    for dir in ["functions", "views"] {
        for name in object_files(dir) {
            assert!(
                defined.contains_key(&name),
                "sql/{dir}/{name}.sql defines no {dir} named {name}"
            );
        }
    }
}

#[test]
fn the_manifest_lists_each_file_once() {
    for (dir, manifest) in [("functions", FUNCTIONS), ("views", VIEWS)] {
        let mut listed: Vec<String> = manifest.iter().map(|o| o.name.to_string()).collect();
        let count = listed.len();
        listed.sort();
        listed.dedup();
        assert_eq!(
            listed.len(),
            count,
            "sql/{dir} listed twice in the manifest"
        );
        assert_eq!(
            listed,
            object_files(dir),
            "src/store/bootstrap.rs lists sql/{dir}/ (each file, once)"
        );
    }
}

/// The functions (with their arguments) and views of the current schema,
/// extensions' members left out.
async fn schema_objects(pool: &PgPool) -> (Vec<String>, Vec<String>) {
    let functions: Vec<String> = sqlx::query_scalar(
        "SELECT p.proname::text FROM pg_proc p
         WHERE p.pronamespace = to_regnamespace(current_schema())
           AND NOT EXISTS (SELECT 1 FROM pg_depend d
                           WHERE d.classid = 'pg_proc'::regclass AND d.objid = p.oid
                             AND d.deptype = 'e')
         ORDER BY 1",
    )
    .fetch_all(pool)
    .await
    .unwrap();
    let views: Vec<String> = sqlx::query_scalar(
        "SELECT c.relname::text FROM pg_class c
         WHERE c.relnamespace = to_regnamespace(current_schema()) AND c.relkind IN ('v', 'm')
           AND NOT EXISTS (SELECT 1 FROM pg_depend d
                           WHERE d.classid = 'pg_class'::regclass AND d.objid = c.oid
                             AND d.deptype = 'e')
         ORDER BY 1",
    )
    .fetch_all(pool)
    .await
    .unwrap();
    (functions, views)
}

#[sqlx::test(migrator = "quota_arbiter::store::FRESH_MIGRATOR")]
async fn every_function_and_view_of_a_migrated_database_has_its_one_file(pool: PgPool) {
    quota_arbiter::store::migrate(&pool).await.unwrap();
    let (functions, views) = schema_objects(&pool).await;
    // One function per name: an overload left behind by a changed signature
    // would be a second definition with no file.
    assert_eq!(
        functions,
        object_files("functions"),
        "the database's functions, each once, are sql/functions/*.sql"
    );
    assert_eq!(
        views,
        object_files("views"),
        "the database's views are sql/views/*.sql"
    );
}

/// Everything the schema is made of, one line per column, constraint, index,
/// trigger, function, view, sequence and applied migration: two databases
/// with the same lines have the same schema.
async fn fingerprint(pool: &PgPool) -> Vec<String> {
    sqlx::query_scalar(
        r#"
        WITH s AS (SELECT to_regnamespace(current_schema()) AS oid)
        SELECT format('relation %s %s %s %s', c.relname, c.relkind, c.relpersistence, c.reloptions)
        FROM pg_class c, s WHERE c.relnamespace = s.oid
        UNION ALL
        SELECT format('column %s %s %s %s %s %s %s', c.relname, a.attnum, a.attname,
                      format_type(a.atttypid, a.atttypmod), a.attnotnull, a.attidentity,
                      pg_get_expr(d.adbin, d.adrelid))
        FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid
        JOIN s ON c.relnamespace = s.oid
        LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
        WHERE a.attnum > 0 AND NOT a.attisdropped
        UNION ALL
        SELECT format('constraint %s %s %s', n.conrelid::regclass, n.conname, pg_get_constraintdef(n.oid))
        FROM pg_constraint n, s WHERE n.connamespace = s.oid
        UNION ALL
        SELECT format('index %s', pg_get_indexdef(i.indexrelid))
        FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid JOIN s ON c.relnamespace = s.oid
        UNION ALL
        SELECT format('trigger %s', pg_get_triggerdef(t.oid))
        FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid JOIN s ON c.relnamespace = s.oid
        WHERE NOT t.tgisinternal
        UNION ALL
        SELECT format('function %s', pg_get_functiondef(p.oid))
        FROM pg_proc p, s WHERE p.pronamespace = s.oid
        UNION ALL
        SELECT format('view %s %s', c.relname, pg_get_viewdef(c.oid))
        FROM pg_class c, s WHERE c.relnamespace = s.oid AND c.relkind IN ('v', 'm')
        UNION ALL
        SELECT format('sequence %s %s %s %s %s', c.relname, q.seqtypid::regtype, q.seqstart,
                      q.seqincrement, q.seqmax)
        FROM pg_sequence q JOIN pg_class c ON c.oid = q.seqrelid JOIN s ON c.relnamespace = s.oid
        UNION ALL
        SELECT format('migration %s %s %s %s', version, description, success, encode(checksum, 'hex'))
        FROM _sqlx_migrations
        ORDER BY 1
        "#,
    )
    .fetch_all(pool)
    .await
    .unwrap()
}

/// A database beside the test's, migrated by `store::migrate` the way `serve`
/// and `quota-arbiter migrate` do it, dropped at the end.
async fn migrated_beside(pool: &PgPool) -> (PgPool, String) {
    // (The test's own name is as long as a name may be: a suffix would be cut.)
    let name = format!(
        "quota_arbiter_schema_{}_{}",
        std::process::id(),
        chrono::Utc::now().timestamp_micros()
    );
    sqlx::raw_sql(&format!(r#"CREATE DATABASE "{name}""#))
        .execute(pool)
        .await
        .unwrap();
    let url = database_url(pool, &postgres_host_port()).await;
    let (server, _) = url.rsplit_once('/').unwrap();
    let migrated = PgPoolOptions::new()
        .max_connections(2)
        .connect(&format!("{server}/{name}"))
        .await
        .unwrap();
    quota_arbiter::store::migrate(&migrated).await.unwrap();
    (migrated, name)
}

#[sqlx::test(migrator = "quota_arbiter::store::FRESH_MIGRATOR")]
async fn a_test_database_is_what_migrate_makes(pool: PgPool) {
    let tested = fingerprint(&pool).await;
    assert!(tested.iter().any(|line| line.starts_with("function ")));
    assert!(tested.iter().any(|line| line.starts_with("view ")));
    assert!(tested.iter().any(|line| line.starts_with("migration ")));

    let (migrated, name) = migrated_beside(&pool).await;
    let made = fingerprint(&migrated).await;
    // Migrating again (every start of a replica does) changes nothing.
    quota_arbiter::store::migrate(&migrated).await.unwrap();
    let again = fingerprint(&migrated).await;
    migrated.close().await;
    sqlx::raw_sql(&format!(r#"DROP DATABASE "{name}" WITH (FORCE)"#))
        .execute(&pool)
        .await
        .unwrap();

    let differences = |a: &[String], b: &[String]| -> Vec<String> {
        let only_a = a
            .iter()
            .filter(|l| !b.contains(l))
            .map(|l| format!("- {l}"));
        let only_b = b
            .iter()
            .filter(|l| !a.contains(l))
            .map(|l| format!("+ {l}"));
        only_a.chain(only_b).collect()
    };
    assert_eq!(
        differences(&tested, &made),
        Vec::<String>::new(),
        "FRESH_MIGRATOR (-) and store::migrate (+) make the same schema"
    );
    assert_eq!(differences(&made, &again), Vec::<String>::new());

    // And store::migrate on a test's database (a replica started on it)
    // finds every migration applied and leaves the same schema.
    quota_arbiter::store::migrate(&pool).await.unwrap();
    assert_eq!(
        differences(&tested, &fingerprint(&pool).await),
        Vec::<String>::new()
    );
}

#[test]
fn every_sqlx_test_gets_the_fresh_migrator() {
    let mut sources = files(&Path::new(ROOT).join("tests"), ".rs");
    sources.extend(files(&Path::new(ROOT).join("src"), ".rs"));
    let mut bare = Vec::new();
    for path in sources {
        let text = std::fs::read_to_string(&path).unwrap();
        for (n, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.starts_with("#[sqlx::test")
                && line.ends_with(']')
                && !line.contains(r#"migrator = "quota_arbiter::store::FRESH_MIGRATOR""#)
            {
                bare.push(format!("{}:{}: {line}", relative(&path), n + 1));
            }
        }
    }
    assert!(
        bare.is_empty(),
        "a #[sqlx::test] database needs the functions and views: \
         #[sqlx::test(migrator = \"quota_arbiter::store::FRESH_MIGRATOR\")]\n{}",
        bare.join("\n")
    );
}

/// A change to a function or view file comes with a new revision: the
/// fingerprint the revisions end with is the files' own.
#[test]
fn the_objects_revision_is_raised_with_every_change_to_their_files() {
    assert_eq!(
        recorded_fingerprint(),
        objects_fingerprint(),
        "sql/functions/ or sql/views/ changed: append \"{}\" to OBJECTS_REVISIONS in \
         src/store/bootstrap.rs (revision {} then)",
        objects_fingerprint(),
        OBJECTS_REVISION + 1
    );
}

/// An older build migrating a database whose functions and views a newer
/// release applied (a replica of the old release restarted during a rolling
/// upgrade) leaves them in place; the same or an older revision is
/// re-applied.
#[sqlx::test(migrator = "quota_arbiter::store::FRESH_MIGRATOR")]
async fn a_newer_releases_functions_and_views_stay_in_place(pool: PgPool) {
    let recorded = || async {
        sqlx::query_scalar::<_, i32>("SELECT revision FROM sql_objects")
            .fetch_one(&pool)
            .await
            .unwrap()
    };
    assert_eq!(
        recorded().await,
        OBJECTS_REVISION,
        "a test database's revision"
    );
    // A newer release's body, under a newer revision.
    let newer = "CREATE OR REPLACE FUNCTION arbiter_now() RETURNS timestamptz
        LANGUAGE sql STABLE PARALLEL SAFE AS $$ SELECT now() + interval '0' /* newer */ $$";
    let body = || async {
        sqlx::query_scalar::<_, String>("SELECT prosrc FROM pg_proc WHERE proname = 'arbiter_now'")
            .fetch_one(&pool)
            .await
            .unwrap()
    };
    sqlx::raw_sql(newer).execute(&pool).await.unwrap();
    sqlx::query("UPDATE sql_objects SET revision = $1")
        .bind(OBJECTS_REVISION + 1)
        .execute(&pool)
        .await
        .unwrap();
    quota_arbiter::store::migrate(&pool).await.unwrap();
    assert!(body().await.contains("newer"), "kept: {}", body().await);
    assert_eq!(recorded().await, OBJECTS_REVISION + 1);

    // The same revision (or an older one) in place: this build's files win.
    sqlx::query("UPDATE sql_objects SET revision = $1")
        .bind(OBJECTS_REVISION)
        .execute(&pool)
        .await
        .unwrap();
    quota_arbiter::store::migrate(&pool).await.unwrap();
    assert!(
        !body().await.contains("newer"),
        "re-applied: {}",
        body().await
    );
    assert_eq!(recorded().await, OBJECTS_REVISION);
}
