//! Rules the arbiter's SQL and the worker client both compute, written once
//! in the client (`client/src/adapt.rs`: the recovery, the multipliers, the
//! floors) and checked here against every SQL statement that computes them,
//! over a grid of inputs: the adaptive factor's recovery
//! (`sql/functions/recovered_factor.sql`), an upstream answer's step
//! (`sql/adapt_cadence.sql`), and the effective cadence that the paced take
//! refills at (`sql/functions/take_paced_across.sql`), the `quota_cadence`
//! view and the quota listing (`sql/list_quotas.sql`) show. (The arbiter's
//! multipliers, `upstream_multiplier()` in SQL, are held equal to the
//! client's in tests/it/client.rs.)
//!
//! Each grid runs in one transaction, so `arbiter_now()` is one instant
//! throughout and an elapsed time set in SQL is the elapsed time the client is
//! given. The answers must agree to 1e-12 (relative): both sides are `double
//! precision` arithmetic of the same formula.

use std::time::Duration;

use quota_arbiter_client::{adapt, recovered_factor, Limits};
use sqlx::{PgPool, Row};

/// Factors a bucket may hold (0 < factor <= 1), down to below the rate floor
/// of the fastest cadence.
const FACTORS: [f64; 10] = [1e-5, 0.001_5, 0.01, 0.05, 0.2, 0.5, 0.7, 0.99, 0.999_9, 1.0];
/// Seconds since the factor was set: none, a microsecond, around the time a
/// factor of 0.5 takes to recover (139 s), an hour, a day.
const ELAPSED: [f64; 12] = [
    0.0, 0.000_001, 0.5, 1.0, 2.0, 59.5, 100.0, 138.0, 139.0, 200.0, 3600.0, 86400.0,
];
/// Configured cadences: rates below, at and above the rate floor (0.01/s),
/// bursts at the burst floor (1) and above it.
const CADENCES: [(f64, f64); 7] = [
    (0.001, 1.0),
    (0.005, 3.0),
    (0.01, 1.0),
    (0.3, 2.0),
    (2.0, 1.0),
    (10.0, 40.0),
    (1000.0, 5000.0),
];
/// Upstream answers with a multiplier (and some without: they are skipped).
const STATUSES: [u16; 9] = [429, 0, 500, 503, 200, 201, 304, 404, 422];

fn assert_close(what: &str, sql: f64, client: f64) {
    let scale = sql.abs().max(client.abs()).max(f64::MIN_POSITIVE);
    assert!(
        (sql - client).abs() / scale <= 1e-12,
        "{what}: SQL {sql}, client {client}"
    );
}

#[sqlx::test(migrator = "quota_arbiter::store::FRESH_MIGRATOR")]
async fn the_sql_recovery_is_the_clients(pool: PgPool) {
    let grid: Vec<(f64, f64)> = FACTORS
        .iter()
        .flat_map(|&f| ELAPSED.iter().map(move |&e| (f, e)))
        .collect();
    let (factors, elapsed): (Vec<f64>, Vec<f64>) = grid.iter().copied().unzip();
    let recovered: Vec<f64> = sqlx::query_scalar(
        "SELECT recovered_factor(g.factor, arbiter_now() - make_interval(secs => g.seconds))
         FROM unnest($1::float8[], $2::float8[]) WITH ORDINALITY AS g (factor, seconds, n)
         ORDER BY g.n",
    )
    .bind(&factors)
    .bind(&elapsed)
    .fetch_all(&pool)
    .await
    .unwrap();
    assert_eq!(recovered.len(), grid.len());
    for ((factor, seconds), sql) in grid.into_iter().zip(recovered) {
        let client = recovered_factor(factor, Duration::from_secs_f64(seconds));
        assert_close(&format!("factor {factor} after {seconds} s"), sql, client);
    }

    // A factor set ahead of the database clock (the clock moved back)
    // recovers nothing, as after no time at all.
    let ahead: f64 =
        sqlx::query_scalar("SELECT recovered_factor(0.5, arbiter_now() + interval '10 seconds')")
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_close(
        "a factor set ahead",
        ahead,
        recovered_factor(0.5, Duration::ZERO),
    );
}

/// One quota per cadence, adaptive or not, each with a bucket (the quota's
/// trigger makes it).
async fn quotas(tx: &mut sqlx::PgConnection) -> Vec<(String, f64, f64, bool)> {
    let mut quotas = Vec::new();
    for (i, &(rate, burst)) in CADENCES.iter().enumerate() {
        for adaptive in [true, false] {
            let name = format!("cadence-{i}-{adaptive}");
            sqlx::query(
                "INSERT INTO quota (name, hourly_ceiling, rate, burst, adaptive)
                 VALUES ($1, 1000000, $2, $3, $4)",
            )
            .bind(&name)
            .bind(rate)
            .bind(burst)
            .bind(adaptive)
            .execute(&mut *tx)
            .await
            .unwrap();
            quotas.push((name, rate, burst, adaptive));
        }
    }
    quotas
}

/// Sets a quota's bucket: its factor, set `seconds` ago, and more tokens than
/// any burst (a take then reads the bucket as full: the effective burst).
async fn set_bucket(tx: &mut sqlx::PgConnection, quota: &str, factor: f64, seconds: f64) {
    sqlx::query(
        "UPDATE quota_bucket
         SET factor = $2, factor_at = arbiter_now() - make_interval(secs => $3),
             tokens = 1e12, refilled_at = arbiter_now()
         WHERE quota = $1",
    )
    .bind(quota)
    .bind(factor)
    .bind(seconds)
    .execute(&mut *tx)
    .await
    .unwrap();
}

#[sqlx::test(migrator = "quota_arbiter::store::FRESH_MIGRATOR")]
async fn an_upstream_answer_moves_the_sql_cadence_as_the_clients(pool: PgPool) {
    let mut tx = pool.begin().await.unwrap();
    let quotas = quotas(&mut tx).await;
    let mut checked = 0;
    for (quota, rate, burst, adaptive) in quotas.iter().filter(|q| q.3) {
        let ceiling = Limits {
            rate: *rate,
            burst: *burst,
        };
        for factor in FACTORS {
            for seconds in [0.0, 1.0, 59.5, 200.0, 3600.0] {
                // The SQL reads the status with upstream_multiplier(); a
                // status without a multiplier adapts nothing (no row). The
                // client's adapt() applies its own multiplier().
                for status in STATUSES
                    .iter()
                    .copied()
                    .filter(|&s| quota_arbiter_client::multiplier(s).is_some())
                {
                    set_bucket(&mut tx, quota, factor, seconds).await;
                    let client = adapt(
                        ceiling,
                        factor,
                        Duration::from_secs_f64(seconds),
                        Some(status),
                    );
                    let row = sqlx::query(include_str!("../../sql/adapt_cadence.sql"))
                        .bind(vec![quota.clone()])
                        .bind(vec![i32::from(status)])
                        .fetch_one(&mut *tx)
                        .await
                        .unwrap();
                    let what = format!(
                        "{quota} (adaptive {adaptive}) at factor {factor} set {seconds} s ago, \
                         answered {status}"
                    );
                    assert_close(
                        &format!("{what}: factor"),
                        row.get("factor?"),
                        client.factor,
                    );
                    assert_close(
                        &format!("{what}: rate"),
                        row.get("effective_rate?"),
                        client.limits.rate,
                    );
                    assert_close(
                        &format!("{what}: burst"),
                        row.get("effective_burst?"),
                        client.limits.burst,
                    );
                    checked += 1;
                }
            }
        }
    }
    assert_eq!(checked, 7 * FACTORS.len() * 5 * 6, "answers checked");
    tx.rollback().await.unwrap();
}

#[sqlx::test(migrator = "quota_arbiter::store::FRESH_MIGRATOR")]
async fn the_sql_effective_cadence_is_the_clients(pool: PgPool) {
    let mut tx = pool.begin().await.unwrap();
    let quotas = quotas(&mut tx).await;
    for (quota, rate, burst, adaptive) in &quotas {
        let ceiling = Limits {
            rate: *rate,
            burst: *burst,
        };
        for factor in FACTORS {
            for seconds in ELAPSED {
                set_bucket(&mut tx, quota, factor, seconds).await;
                // A bucket that does not adapt is at its configured cadence.
                let client = if *adaptive {
                    adapt(ceiling, factor, Duration::from_secs_f64(seconds), None)
                } else {
                    adapt(ceiling, 1.0, Duration::ZERO, None)
                };
                let what =
                    format!("{quota} (adaptive {adaptive}) at factor {factor} set {seconds} s ago");

                let view = sqlx::query(
                    "SELECT factor, effective_rate, effective_burst FROM quota_cadence
                     WHERE quota = $1",
                )
                .bind(quota)
                .fetch_one(&mut *tx)
                .await
                .unwrap();
                let view_factor: f64 = view.get("factor");
                assert_close(&format!("{what}: view factor"), view_factor, client.factor);
                let view_rate: f64 = view.get("effective_rate");
                assert_close(&format!("{what}: view rate"), view_rate, client.limits.rate);
                let view_burst: f64 = view.get("effective_burst");
                assert_close(
                    &format!("{what}: view burst"),
                    view_burst,
                    client.limits.burst,
                );

                let listed = sqlx::query(include_str!("../../sql/list_quotas.sql"))
                    .bind(quota)
                    .fetch_one(&mut *tx)
                    .await
                    .unwrap();
                let listed_rate: Option<f64> = listed.get("effective_rate");
                assert_close(
                    &format!("{what}: listed rate"),
                    listed_rate.unwrap(),
                    client.limits.rate,
                );
                let listed_burst: Option<f64> = listed.get("effective_burst");
                assert_close(
                    &format!("{what}: listed burst"),
                    listed_burst.unwrap(),
                    client.limits.burst,
                );

                // The paced take (observe mode: it spends regardless and
                // leases nothing) refills at the effective rate, and reads a
                // bucket holding more than any burst as the effective burst.
                let take = sqlx::query(include_str!("../../sql/take_paced_across.sql"))
                    .bind(vec![quota.clone()])
                    .bind(vec![1i32])
                    .bind(vec![1i32])
                    .bind(vec![false])
                    .bind(vec![*rate])
                    .bind(vec![*burst])
                    .bind(vec![*adaptive])
                    .bind(vec![1i64])
                    .bind(vec!["rules".to_string()])
                    .bind(vec![1i32])
                    .bind(vec!["1h".to_string()])
                    .bind(vec![None::<String>])
                    .bind(vec![1_000_000i64])
                    .bind(true)
                    .fetch_one(&mut *tx)
                    .await
                    .unwrap();
                let take_rate: Option<f64> = take.get("rate?");
                assert_close(
                    &format!("{what}: take rate"),
                    take_rate.unwrap(),
                    client.limits.rate,
                );
                let take_tokens: Option<f64> = take.get("tokens?");
                assert_close(
                    &format!("{what}: take burst"),
                    take_tokens.unwrap(),
                    client.limits.burst,
                );
            }
        }
    }
    tx.rollback().await.unwrap();
}
