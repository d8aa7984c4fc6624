//! Getting the store ready: pool, database creation, migrations, the SQL
//! functions and views, and the catalog seeded from the config file.
//!
//! The schema is in two parts (docs/operations/upgrades.md):
//! - `migrations/`: tables, indexes, constraints, triggers and data changes,
//!   append-only, applied once each by sqlx's migrator ([`MIGRATOR`]);
//! - `sql/functions/` and `sql/views/`: one file per function or view, its
//!   current text and nowhere else, applied on every migrate in the order of
//!   [`FUNCTIONS`] and [`VIEWS`] (the binary carries them).

use std::borrow::Cow;
use std::collections::{BTreeMap, HashSet};
use std::str::FromStr;
use std::sync::LazyLock;
use std::time::Duration;

use anyhow::Context;
use sqlx::migrate::{MigrateDatabase, Migrator};
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{Executor, PgPool, Postgres};

use crate::domain::catalog::{FlowSeed, QuotaLimits};
use crate::domain::window::WindowSpec;
use crate::domain::{PoolMode, Secret};

use super::Connections;

/// The migrations in `migrations/`, as every deployed database runs them.
pub static MIGRATOR: Migrator = sqlx::migrate!();

/// A function or a view: its name and its file's text, `CREATE OR REPLACE`.
#[derive(Clone, Copy, Debug)]
pub struct SqlObject {
    pub name: &'static str,
    /// Relative to the crate's root: `sql/functions/<name>.sql`.
    pub path: &'static str,
    pub sql: &'static str,
}

macro_rules! sql_object {
    ($dir:literal, $name:literal) => {
        SqlObject {
            name: $name,
            path: concat!("sql/", $dir, "/", $name, ".sql"),
            sql: include_str!(concat!("../../sql/", $dir, "/", $name, ".sql")),
        }
    };
}

/// Every function of `sql/functions/`, in the order they are created: a SQL
/// function after the functions its body calls (PostgreSQL checks a SQL
/// function's body when it is created; a plpgsql body only when it runs).
/// Trigger functions are here; their triggers are in `migrations/`.
pub const FUNCTIONS: &[SqlObject] = &[
    sql_object!("functions", "arbiter_now"),
    sql_object!("functions", "period_seconds"),
    sql_object!("functions", "window_start_of"),
    sql_object!("functions", "window_end_of"),
    sql_object!("functions", "admit_window_of"),
    sql_object!("functions", "recovered_factor"),
    sql_object!("functions", "upstream_multiplier"),
    sql_object!("functions", "adapt_cadences"),
    sql_object!("functions", "work_state_now"),
    sql_object!("functions", "new_lease_id"),
    sql_object!("functions", "catalog_actor"),
    sql_object!("functions", "audit_catalog_change"),
    sql_object!("functions", "normalize_enforce_percent"),
    sql_object!("functions", "check_flow_quotas"),
    sql_object!("functions", "sync_quota_limits"),
    sql_object!("functions", "quota_hour_to_window"),
    sql_object!("functions", "window_to_quota_hour"),
    sql_object!("functions", "announce_api_key_change"),
    sql_object!("functions", "admit_callers"),
    sql_object!("functions", "take_windows"),
    sql_object!("functions", "take_paced_across"),
    sql_object!("functions", "take_linked"),
    sql_object!("functions", "enqueue_work"),
];

/// Every view of `sql/views/`, in the order they are created: a view after
/// the views it reads. They are dropped in the reverse order first, so a
/// view's columns may change.
pub const VIEWS: &[SqlObject] = &[
    sql_object!("views", "quota_usage"),
    sql_object!("views", "quota_recent_windows"),
    sql_object!("views", "observe_would_defer"),
    sql_object!("views", "bypasses_by_hour"),
    sql_object!("views", "quota_cadence"),
    sql_object!("views", "work_pending_by_flow"),
    sql_object!("views", "work_past_deadline"),
    sql_object!("views", "work_oldest_pending"),
    sql_object!("views", "work_waiting_by_flow"),
];

/// The fingerprint of every revision of `sql/functions/` and `sql/views/`,
/// oldest first: SHA-256 of the files in manifest order ([`objects_fingerprint`]).
/// Append one with every change to a file (tests/it/schema.rs fails until
/// then, naming it). The revision is the count.
const OBJECTS_REVISIONS: &[&str] = &[
    "83cd10a00c61a1cb1f38adb510bf53a3717e415a3b076a821a719217d4d9ce26",
    // upstream_multiplier(): the arbiter's reading of a status, in SQL.
    "21149f9845e09bd7fc4af58f752cc785be87e64399b4f8e88ea27e5c8e5b3aee",
    // Stacked windows: period_seconds(), window_start_of(ts, period, zone),
    // take_windows(), take_paced_across() over every window of a quota,
    // quota_period's triggers, the views per window.
    "40eda1624ba375046ee870f05ce256041c836752cf60450492073be596583797",
    // Several quotas per call: take_linked(), check_flow_quotas(); upstream
    // reports folded a group at a time: adapt_cadences().
    "a8630fb9adcd11af0d89194175d276b25efce5c377d8ff0a646a0cb9db4aed2a",
    // Work items that spend: enqueue_work() takes and answers `spend`.
    "e7616450b22b1c73f435b90e773bfd9dff1f7fe94007edf522c99d8e81314141",
];

/// The revision of the functions and views this build carries: a migrate
/// applies them over the same or an older revision, and leaves a newer one
/// in place (an older replica restarted during a rolling upgrade).
pub const OBJECTS_REVISION: i32 = OBJECTS_REVISIONS.len() as i32;

/// The fingerprint [`OBJECTS_REVISIONS`] ends with, when the files are as
/// this build carries them.
pub fn objects_fingerprint() -> String {
    use sha2::{Digest, Sha256};
    let mut hash = Sha256::new();
    for object in FUNCTIONS.iter().chain(VIEWS) {
        hash.update(object.path.as_bytes());
        hash.update([0]);
        hash.update(object.sql.as_bytes());
        hash.update([0]);
    }
    hex::encode(hash.finalize())
}

/// The fingerprint of [`OBJECTS_REVISION`] as recorded.
pub fn recorded_fingerprint() -> &'static str {
    OBJECTS_REVISIONS.last().expect("at least one revision")
}

/// Starts the transaction of a step that creates functions or views: under
/// the lock replicas take turns on (`sql/objects_lock.sql`), with PostgreSQL's
/// check of SQL function bodies off (before the migrations: a function may
/// read a table the migrations have yet to create; `pg_dump` restores
/// functions the same way) or on (after them: a body that reads a column no
/// table has fails the migrate, not its first call).
fn objects_begin(check_function_bodies: bool) -> String {
    format!(
        "BEGIN;\n{}\nSET LOCAL check_function_bodies = {};",
        include_str!("../../sql/objects_lock.sql"),
        if check_function_bodies { "on" } else { "off" }
    )
}

/// The views' drop, in reverse creation order. Only ours: a view someone
/// built on one of them makes the drop fail rather than vanish with it.
fn drop_views() -> String {
    let names: Vec<&str> = VIEWS.iter().rev().map(|view| view.name).collect();
    format!("DROP VIEW IF EXISTS {};", names.join(", "))
}

/// How to connect to `database_url` (`key` names the setting it came from).
/// Through a pooler in transaction mode (`mode`), no statement is kept on a
/// connection (`super::connections`): the statement cache is off.
pub fn connect_options(
    (key, database_url): (&str, &Secret),
    mode: PoolMode,
) -> anyhow::Result<PgConnectOptions> {
    let options = PgConnectOptions::from_str(database_url.expose()).map_err(|e| {
        anyhow::anyhow!(
            "configuration error: `{key}` ({database_url:?}) is not a PostgreSQL URL: {e}"
        )
    })?;
    Ok(match mode {
        PoolMode::Session => options,
        PoolMode::Transaction => options.statement_cache_capacity(0),
    })
}

/// A pool that connects on first use, so the service starts (not ready) while
/// PostgreSQL is down and recovers by itself when it comes back.
/// A decision waits for a connection no longer than it may wait at all
/// (`store_timeout`).
pub fn connect_lazy(
    url: (&str, &Secret),
    mode: PoolMode,
    max_connections: u32,
    store_timeout: Duration,
) -> anyhow::Result<PgPool> {
    let options = connect_options(url, mode)?;
    Ok(PgPoolOptions::new()
        .max_connections(max_connections)
        .acquire_timeout(store_timeout)
        // No round trip to test a connection before each statement: on the
        // hot path it was one more wait on the database per group. A
        // connection that broke while idle fails its statement instead,
        // which is classified as the store out of reach (a 503, nothing
        // granted) and closed; the next statement gets a fresh one.
        .test_before_acquire(false)
        .connect_lazy_with(options.application_name("quota-arbiter")))
}

/// Creates the database named by `database_url` when it does not exist yet.
pub async fn ensure_database(database_url: &Secret) -> Result<(), sqlx::Error> {
    let url = database_url.expose();
    if !Postgres::database_exists(url).await? {
        tracing::info!(?database_url, "creating database");
        if let Err(error) = Postgres::create_database(url).await {
            // Another replica may have created it in the meantime.
            if !Postgres::database_exists(url).await? {
                return Err(error);
            }
        }
    }
    Ok(())
}

/// Brings the database to this build's schema; what `serve` (with
/// `migrate_on_start`) and `quota-arbiter migrate` run, as often as they like:
/// 1. the functions of [`FUNCTIONS`] missing from the database are created
///    (the migrations' column defaults and triggers call them; on a new
///    database that is all of them);
/// 2. the migrations not applied yet run ([`MIGRATOR`]);
/// 3. in one transaction, the views are dropped, every function is created
///    or replaced and the views are created again, in manifest order.
///
/// Steps 1 and 3 hold one advisory lock and sqlx's migrator its own, so
/// replicas that start together take turns and the last one finds nothing
/// left but to apply the same functions and views again.
pub async fn migrate(pool: &PgPool) -> anyhow::Result<()> {
    create_missing_functions(pool).await?;
    MIGRATOR.run(pool).await.context("applying migrations/")?;
    apply_sql_objects(pool).await
}

/// Step 1 of [`migrate`]. (Each file is sent as it is, `Executor::execute` of
/// a `&str`: the simple query protocol, no statement prepared.)
async fn create_missing_functions(pool: &PgPool) -> anyhow::Result<()> {
    let mut tx = pool.begin_with(objects_begin(false)).await?;
    let present: HashSet<String> = sqlx::query_file_scalar!("sql/functions_present.sql")
        .fetch_all(&mut *tx)
        .await?
        .into_iter()
        .collect();
    for function in FUNCTIONS.iter().filter(|f| !present.contains(f.name)) {
        tx.execute(function.sql)
            .await
            .with_context(|| format!("creating {}", function.path))?;
    }
    tx.commit().await?;
    Ok(())
}

/// Step 3 of [`migrate`], unless a newer build's revision is in place.
async fn apply_sql_objects(pool: &PgPool) -> anyhow::Result<()> {
    let mut tx = pool.begin_with(objects_begin(true)).await?;
    let in_place = sqlx::query_file_scalar!("sql/objects_revision.sql")
        .fetch_optional(&mut *tx)
        .await?;
    if let Some(newer) = in_place.filter(|&revision| revision > OBJECTS_REVISION) {
        tracing::warn!(
            in_place = newer,
            this_build = OBJECTS_REVISION,
            "a newer release's SQL functions and views are in place; keeping them"
        );
        return Ok(());
    }
    tx.execute(drop_views().as_str())
        .await
        .context("dropping the views of sql/views/")?;
    for object in FUNCTIONS.iter().chain(VIEWS) {
        tx.execute(object.sql)
            .await
            .with_context(|| format!("applying {}", object.path))?;
    }
    sqlx::query_file!("sql/objects_revision_record.sql", OBJECTS_REVISION)
        .execute(&mut *tx)
        .await?;
    tx.commit().await?;
    Ok(())
}

/// The migrations for a database created empty: the tests' (every
/// `#[sqlx::test(migrator = "quota_arbiter::store::FRESH_MIGRATOR")]`), which
/// sqlx migrates before a test starts and which would otherwise have no
/// function nor view. The same migrations as [`MIGRATOR`], with steps 1 and 3
/// of [`migrate`] inside them: all the functions before the first one, the
/// views' drop, the functions and the views after the last one, the same
/// files in the same order. Each migration keeps its version and its
/// checksum, so a test database records exactly what a migrated one does:
/// readiness counts the same rows, and [`migrate`] on it (a replica started
/// on a test's database) finds every migration applied, as on any other.
/// Never for a deployed database: there the functions and views are applied
/// on every migrate, outside the migrations, so that changing one changes no
/// applied migration's checksum (design.md §5: migrations are append-only).
pub static FRESH_MIGRATOR: LazyLock<Migrator> = LazyLock::new(|| {
    let mut migrations = MIGRATOR.migrations.to_vec();
    assert!(
        migrations
            .iter()
            .all(|m| !m.no_tx && !m.migration_type.is_down_migration()),
        "FRESH_MIGRATOR wraps migrations that run in a transaction"
    );
    let first = migrations
        .first_mut()
        .expect("migrations/ holds the baseline");
    let functions: Vec<&str> = FUNCTIONS.iter().map(|f| f.sql).collect();
    first.sql = Cow::Owned(format!(
        "SET LOCAL check_function_bodies = off;\n{}\nSET LOCAL check_function_bodies = on;\n{}",
        functions.join("\n"),
        first.sql
    ));
    let last = migrations
        .last_mut()
        .expect("migrations/ holds the baseline");
    let objects: Vec<&str> = FUNCTIONS.iter().chain(VIEWS).map(|o| o.sql).collect();
    last.sql = Cow::Owned(format!(
        "{}\n{}\n{}\n{}",
        last.sql,
        drop_views(),
        objects.join("\n"),
        include_str!("../../sql/objects_revision_record.sql")
            .replace("$1", &OBJECTS_REVISION.to_string())
    ));
    Migrator {
        migrations: Cow::Owned(migrations),
        ignore_missing: MIGRATOR.ignore_missing,
        locking: MIGRATOR.locking,
        no_tx: MIGRATOR.no_tx,
    }
});

/// Seeds quotas and flows declared in the config file. What the tables already
/// hold wins: a ceiling changed or a mode flipped at run time is never undone
/// by a restart; a difference is logged so the operator can reconcile. A
/// quota without a ceiling of its own gets `default_ceiling`.
pub async fn seed_catalog(
    pool: &Connections,
    default_ceiling: i64,
    quotas: &BTreeMap<String, QuotaLimits>,
    flows: &BTreeMap<String, FlowSeed>,
) -> Result<(), sqlx::Error> {
    for (name, seed) in quotas {
        // The config's load checked every seed (naming key and source).
        let Ok(settings) = seed.settings(default_ceiling) else {
            continue;
        };
        let (periods, ceilings, zones) = super::catalog::window_columns(&settings.windows);
        // The stored windows come back in the CLI's spelling (seed_quota.sql).
        let wanted: Vec<String> = settings
            .windows
            .iter()
            .map(|w| WindowSpec::from(w).to_string())
            .collect();
        let stored = sqlx::query_file_scalar!(
            "sql/seed_quota.sql",
            name,
            seed.rate,
            seed.burst,
            seed.adaptive,
            seed.max_in_flight,
            seed.priority2_share,
            seed.priority3_share,
            &periods,
            &ceilings,
            &zones as &[Option<String>]
        )
        .fetch_one(pool)
        .await?;
        if stored != wanted {
            tracing::warn!(quota = %name, file = ?wanted, table = ?stored,
                "config file and table disagree on the quota's windows; the table wins");
        }
    }
    for (name, seed) in flows {
        // The config's load checked every seed (naming key and source).
        let Ok(quotas) = seed.quotas() else {
            continue;
        };
        let quotas: Vec<String> = quotas.into_iter().map(|q| q.into_string()).collect();
        for quota in &quotas {
            sqlx::query_file!("sql/ensure_quota.sql", quota, default_ceiling)
                .execute(pool)
                .await?;
        }
        let mode = seed.mode.map(|m| m.as_str());
        let fallback = seed.fallback.map(|f| f.as_str());
        let stored = sqlx::query_file_scalar!(
            "sql/seed_flow.sql",
            name,
            quotas[0],
            mode,
            seed.priority,
            fallback,
            &quotas[1..]
        )
        .fetch_one(pool)
        .await?;
        if mode.is_some_and(|m| m != stored) {
            tracing::warn!(flow = %name, file = ?mode, table = %stored,
                "config file and table disagree on mode; the table wins (flipped at run time)");
        }
    }
    Ok(())
}
