//! The claim's statements keep the plans they were written for whatever the
//! table's statistics say (`sql/claim_plan_settings.sql`).

use serde_json::Value;
use sqlx::PgPool;

use crate::helpers::create_flow;

/// A backlog enqueued faster than autovacuum analyzes the table: the claim's
/// walk still goes down the flow's pending index in rationing order and stops
/// at the claim's size, instead of reading the whole backlog through a bitmap
/// and sorting it (161 ms against 0.4 ms for 180,000 items, measured).
#[sqlx::test]
async fn a_claims_walk_over_a_backlog_not_analyzed_yet_follows_the_pending_index(pool: PgPool) {
    create_flow(&pool, "ppf", 10, "invoice", "enforce").await;
    // A quarter of a million items, never analyzed: the planner scales the
    // table's size but not what the index holds (planned with bitmap scans,
    // this walk read all 150,000 items of the flow and sorted them).
    sqlx::query(
        "INSERT INTO work_item (flow, priority, payload)
         SELECT CASE WHEN n % 5 < 3 THEN 'invoice' ELSE 'other' END, 2, '{}'
         FROM generate_series(1, 250000) AS n",
    )
    .execute(&pool)
    .await
    .unwrap();

    let mut tx = pool.begin().await.unwrap();
    sqlx::query(include_str!("../../sql/claim_plan_settings.sql"))
        .execute(&mut *tx)
        .await
        .unwrap();
    let walk = include_str!("../../sql/work_candidates.sql");
    sqlx::raw_sql(&format!(
        "PREPARE walk (text[], text[], float8, bigint) AS {walk}"
    ))
    .execute(&mut *tx)
    .await
    .unwrap();
    let plan: Value =
        sqlx::query_scalar("EXPLAIN (FORMAT JSON) EXECUTE walk(ARRAY['invoice'], NULL, 60, 30)")
            .fetch_one(&mut *tx)
            .await
            .unwrap();
    let plan = plan.to_string();
    assert!(
        plan.contains("work_item_pending_flow_idx") && !plan.contains("Bitmap"),
        "the walk reads the backlog another way: {plan}"
    );
}
