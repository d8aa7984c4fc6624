//! Getting the store ready: pool, database creation, migrations and the
//! catalog seeded from the config file.

use std::str::FromStr;

use sqlx::migrate::{MigrateDatabase, Migrator};
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{PgPool, Postgres};

use crate::config::Config;

pub static MIGRATOR: Migrator = sqlx::migrate!();

/// A pool that connects on first use, so the service starts (not ready) while
/// PostgreSQL is down and recovers by itself when it comes back.
pub fn connect_lazy(config: &Config) -> anyhow::Result<PgPool> {
    let options = PgConnectOptions::from_str(config.database_url.expose()).map_err(|e| {
        anyhow::anyhow!(
            "configuration error: `database_url` ({:?}) is not a PostgreSQL URL: {e}",
            config.database_url
        )
    })?;
    Ok(PgPoolOptions::new()
        .max_connections(config.max_connections)
        // A decision waits for a connection no longer than it may wait at all.
        .acquire_timeout(config.store_timeout)
        // No round trip to test a connection before each statement: on the
        // hot path it was one more wait on the database per group. A
        // connection that broke while idle fails its statement instead,
        // which is classified as the store out of reach (a 503, nothing
        // granted) and closed; the next statement gets a fresh one.
        .test_before_acquire(false)
        .connect_lazy_with(options.application_name("quota-arbiter")))
}

/// Creates the database named by `database_url` when it does not exist yet.
pub async fn ensure_database(config: &Config) -> Result<(), sqlx::Error> {
    let url = config.database_url.expose();
    if !Postgres::database_exists(url).await? {
        tracing::info!(database_url = ?config.database_url, "creating database");
        if let Err(error) = Postgres::create_database(url).await {
            // Another replica may have created it in the meantime.
            if !Postgres::database_exists(url).await? {
                return Err(error);
            }
        }
    }
    Ok(())
}

pub async fn migrate(pool: &PgPool) -> Result<(), sqlx::migrate::MigrateError> {
    MIGRATOR.run(pool).await
}

/// Seeds quotas and flows declared in the config file. What the tables already
/// hold wins: a ceiling changed or a mode flipped at run time is never undone
/// by a restart; a difference is logged so the operator can reconcile.
pub async fn seed_catalog(pool: &PgPool, config: &Config) -> Result<(), sqlx::Error> {
    for (name, seed) in &config.quotas {
        let wanted = seed.hourly_ceiling.unwrap_or(config.hourly_ceiling);
        let stored = sqlx::query_file_scalar!(
            "sql/seed_quota.sql",
            name,
            wanted,
            seed.rate,
            seed.burst,
            seed.adaptive,
            seed.max_in_flight,
            seed.priority2_share,
            seed.priority3_share
        )
        .fetch_one(pool)
        .await?;
        if stored != wanted {
            tracing::warn!(quota = %name, file = wanted, table = stored,
                "config file and table disagree on hourly_ceiling; the table wins");
        }
    }
    for (name, seed) in &config.flows {
        sqlx::query_file!("sql/ensure_quota.sql", seed.quota, config.hourly_ceiling)
            .execute(pool)
            .await?;
        let mode = seed.mode.map(|m| m.as_str());
        let fallback = seed.fallback.map(|f| f.as_str());
        let stored = sqlx::query_file_scalar!(
            "sql/seed_flow.sql",
            name,
            seed.quota,
            mode,
            seed.priority,
            fallback
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
