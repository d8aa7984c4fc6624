//! Configuration layering and its errors.
// figment's Jail closures return figment::Error, which is large by design.
#![allow(clippy::result_large_err)]

use std::time::Duration;

use figment::Jail;
use quota_arbiter::config::Config;
use quota_arbiter::domain::PoolMode;

#[test]
fn env_overrides_file_overrides_defaults() {
    Jail::expect_with(|jail| {
        jail.create_file(
            "arbiter.toml",
            r#"
                hourly_ceiling = 500
                bypass_horizon = "5m"
                [quotas.ppf]
                hourly_ceiling = 1000
                [flows.invoice]
                quota = "ppf"
                mode = "enforce"
                priority = 1
            "#,
        )?;
        jail.set_env("QUOTA_CONFIG", "arbiter.toml");
        jail.set_env("QUOTA_HOURLY_CEILING", "700");
        // DATABASE_URL is left alone: other tests in this binary read it.
        jail.set_env("QUOTA_ADMIN_TOKEN", "hunter2");
        let config = Config::load().expect("valid config");
        assert_eq!(config.hourly_ceiling, 700, "env wins over the file");
        assert_eq!(
            config.bypass_horizon,
            Duration::from_secs(300),
            "file wins over defaults"
        );
        assert_eq!(config.listen.to_string(), "127.0.0.1:8080", "default");
        assert_eq!(config.flows["invoice"].quota.as_deref(), Some("ppf"));
        let printed = format!("{config:?}");
        assert!(
            !printed.contains("hunter2"),
            "secrets are never printed: {printed}"
        );
        assert!(
            printed.contains(r#"admin_token: Some("[redacted]")"#)
                && printed.contains("hourly_ceiling: 700"),
            "the rest is: {printed}"
        );
        let url = quota_arbiter::domain::Secret("postgres://app:hunter2@db.internal/quotas".into());
        let printed = format!("{url:?}");
        assert!(
            !printed.contains("hunter2") && printed.contains("db.internal/quotas"),
            "{printed}"
        );
        Ok(())
    });
}

#[test]
fn a_bad_value_names_the_key_and_where_it_came_from() {
    Jail::expect_with(|jail| {
        jail.set_env("QUOTA_HOURLY_CEILING", "lots");
        let error = Config::load().unwrap_err().to_string();
        assert!(error.contains("hourly_ceiling"), "{error}");
        assert!(error.contains("QUOTA_HOURLY_CEILING"), "{error}");
        Ok(())
    });
    Jail::expect_with(|jail| {
        jail.create_file("arbiter.toml", "bypass_horizon = \"soon\"\n")?;
        jail.set_env("QUOTA_CONFIG", "arbiter.toml");
        let error = Config::load().unwrap_err().to_string();
        assert!(error.contains("bypass_horizon"), "{error}");
        assert!(error.contains("arbiter.toml"), "{error}");
        Ok(())
    });
    Jail::expect_with(|jail| {
        // At most 1.9 s, so a decision's 503 comes within 2 s.
        jail.set_env("QUOTA_STORE_TIMEOUT", "1900ms");
        let at_most = Config::load().expect("1.9 s is allowed").store_timeout;
        assert_eq!(at_most, Duration::from_millis(1900));
        for too_long in ["5s", "1901ms"] {
            jail.set_env("QUOTA_STORE_TIMEOUT", too_long);
            let error = Config::load().unwrap_err().to_string();
            assert!(error.contains("store_timeout"), "{too_long}: {error}");
        }
        Ok(())
    });
}

#[test]
fn foreign_quota_variables_are_ignored_and_tokens_stay_strings() {
    Jail::expect_with(|jail| {
        jail.set_env("QUOTA_ARBITER_PORT", "tcp://10.0.0.1:8080");
        jail.set_env("QUOTA_ADMIN_TOKEN", "123456");
        let config = Config::load().expect("valid config");
        assert_eq!(config.admin_token.unwrap().expose(), "123456");
        Ok(())
    });
    Jail::expect_with(|jail| {
        jail.set_env("QUOTA_ADMIN_TOKEN", "");
        assert!(
            Config::load().unwrap().admin_token.is_none(),
            "empty means unset"
        );
        Ok(())
    });
}

#[test]
fn the_default_file_is_read_when_present() {
    Jail::expect_with(|jail| {
        jail.create_file("quota-arbiter.toml", "hourly_ceiling = 42\n")?;
        assert_eq!(Config::load().unwrap().hourly_ceiling, 42);
        Ok(())
    });
}

#[test]
fn lease_duration_comes_from_the_environment_and_is_checked() {
    Jail::expect_with(|jail| {
        assert_eq!(
            Config::load().unwrap().lease_duration,
            Duration::from_secs(300)
        );
        jail.set_env("QUOTA_LEASE_DURATION", "30s");
        assert_eq!(
            Config::load().unwrap().lease_duration,
            Duration::from_secs(30)
        );
        jail.set_env("QUOTA_LEASE_DURATION", "1s");
        assert_eq!(
            Config::load().unwrap().lease_duration,
            Duration::from_secs(1),
            "at least 1s: 1s is allowed"
        );
        for too_short in ["0s", "999ms"] {
            jail.set_env("QUOTA_LEASE_DURATION", too_short);
            let error = Config::load().unwrap_err().to_string();
            assert!(error.contains("lease_duration"), "{too_short}: {error}");
        }
        Ok(())
    });
}

#[test]
fn work_retention_defaults_to_a_week_and_zero_keeps_everything() {
    Jail::expect_with(|jail| {
        assert_eq!(
            Config::load().unwrap().work_retention,
            Duration::from_secs(7 * 24 * 3600)
        );
        jail.create_file("quota-arbiter.toml", "work_retention = \"2d\"\n")?;
        assert_eq!(
            Config::load().unwrap().work_retention,
            Duration::from_secs(2 * 24 * 3600)
        );
        jail.set_env("QUOTA_WORK_RETENTION", "0s");
        assert_eq!(Config::load().unwrap().work_retention, Duration::ZERO);
        jail.set_env("QUOTA_WORK_RETENTION", "a while");
        let error = Config::load().unwrap_err().to_string();
        assert!(
            error.contains("work_retention") && error.contains("QUOTA_WORK_RETENTION"),
            "{error}"
        );
        Ok(())
    });
}

#[test]
fn a_seeded_quota_is_checked_like_one_put_through_the_api() {
    Jail::expect_with(|jail| {
        jail.create_file(
            "quota-arbiter.toml",
            "[quotas.api]\nhourly_ceiling = 100\nmax_in_flight = 0\n",
        )?;
        let error = Config::load().unwrap_err().to_string();
        assert!(
            error.contains("quotas.api") && error.contains("max_in_flight"),
            "{error}"
        );
        Ok(())
    });
}

/// Behind a transaction pooler, what needs a session (migrations, LISTEN)
/// goes to `direct_database_url`; start-up refuses to migrate without one.
#[test]
fn transaction_pooling_takes_its_sessions_from_the_direct_url() {
    Jail::expect_with(|jail| {
        jail.set_env("DATABASE_URL", "postgres://app:secret@pgbouncer:6432/qa");
        jail.set_env("QUOTA_DATABASE_POOL_MODE", "transaction");
        let error = Config::load().unwrap_err().to_string();
        assert!(error.contains("direct_database_url"), "{error}");
        assert!(error.contains("migrate_on_start"), "{error}");

        jail.set_env("QUOTA_MIGRATE_ON_START", "false");
        let polling = Config::load().expect("no migrations, no session needed");
        assert_eq!(polling.database_pool_mode, PoolMode::Transaction);
        assert!(polling.session_url().is_none());

        jail.set_env("QUOTA_MIGRATE_ON_START", "true");
        jail.set_env(
            "QUOTA_DIRECT_DATABASE_URL",
            "postgres://app:secret@postgres:5432/qa",
        );
        let direct = Config::load().expect("migrations on the direct URL");
        let (key, url) = direct.session_url().unwrap();
        assert_eq!(key, "direct_database_url");
        assert_eq!(url.expose(), "postgres://app:secret@postgres:5432/qa");
        assert!(!format!("{direct:?}").contains("secret"), "{direct:?}");

        jail.set_env("QUOTA_DATABASE_POOL_MODE", "statement");
        let error = Config::load().unwrap_err().to_string();
        assert!(error.contains("database_pool_mode"), "{error}");
        Ok(())
    });
    Jail::expect_with(|_| {
        let session = Config::load().unwrap();
        assert_eq!(session.database_pool_mode, PoolMode::Session);
        assert_eq!(session.session_url().unwrap().0, "database_url");
        Ok(())
    });
}
