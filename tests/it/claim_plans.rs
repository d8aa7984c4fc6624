//! The claim's statements keep the plans they were written for whatever the
//! table's statistics say (`sql/claim_plan_settings.sql`).

use serde_json::Value;
use sqlx::{PgPool, Row};

use crate::helpers::create_flow;

/// A backlog enqueued faster than autovacuum analyzes the table: the claim's
/// walk still goes down the flow's pending index in rationing order and stops
/// at the claim's size, instead of reading the whole backlog through a bitmap
/// and sorting it (161 ms against 0.4 ms for 180,000 items, measured).
#[sqlx::test(migrator = "quota_arbiter::store::FRESH_MIGRATOR")]
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
        "PREPARE walk (text[], text[], float8, bigint, boolean) AS {walk}"
    ))
    .execute(&mut *tx)
    .await
    .unwrap();
    let plan: Value = sqlx::query_scalar(
        "EXPLAIN (FORMAT JSON) EXECUTE walk(ARRAY['invoice'], NULL, 60, 30, true)",
    )
    .fetch_one(&mut *tx)
    .await
    .unwrap();
    let plan = plan.to_string();
    assert!(
        plan.contains("work_item_pending_flow_idx") && !plan.contains("Bitmap"),
        "the walk reads the backlog another way: {plan}"
    );
    // Every claim also looks for items with a `spend` in the flows of one
    // quota: on their own index, which holds none of this backlog, so the
    // look reads nothing of it (on the pending index it read the flow's
    // whole backlog: claims fell from 8,000/s to 960/s in the bench).
    let spending = include_str!("../../sql/work_candidates_with_spend.sql");
    sqlx::raw_sql(&format!(
        "PREPARE spending (text[], text[], float8, bigint) AS {spending}"
    ))
    .execute(&mut *tx)
    .await
    .unwrap();
    let plan: Value = sqlx::query_scalar(
        "EXPLAIN (FORMAT JSON) EXECUTE spending(ARRAY['invoice'], NULL, 60, 30)",
    )
    .fetch_one(&mut *tx)
    .await
    .unwrap();
    let plan = plan.to_string();
    assert!(
        plan.contains("work_item_pending_spend_idx") && !plan.contains("Bitmap"),
        "the look for items with a spend reads the backlog: {plan}"
    );
}

/// How this connection has read `table` (sequential scans, rows fetched
/// through an index) in the statistics it has not reported yet: at least
/// all its open transaction read.
async fn reads_not_yet_reported(tx: &mut sqlx::PgConnection, table: &str) -> (i64, i64) {
    sqlx::query_as(
        "SELECT coalesce(seq_scan, 0), coalesce(idx_tup_fetch, 0)
         FROM pg_stat_xact_user_tables WHERE relname = $1",
    )
    .bind(table)
    .fetch_optional(tx)
    .await
    .unwrap()
    .unwrap_or((0, 0))
}

/// Items of `invoice` (pending, and claimed with a lease still running) and
/// other flows beside it, written after the statements were first planned.
/// Thousands, not more: every later commit on the server waits for a bulk
/// insert's WAL to reach the disk, and the suite's replicas answer 503 past a
/// 1.5 s store timeout.
async fn grow_the_registry(pool: &PgPool, items: i64) {
    sqlx::raw_sql(&format!(
        "INSERT INTO flow (name, quota, mode)
         SELECT 'other-' || n, 'ppf', 'observe' FROM generate_series(1, 500) AS n;
         INSERT INTO work_item (flow, ref, priority, payload)
         SELECT 'invoice', 'inv-' || n, 2, '{{}}' FROM generate_series(1, {items}) AS n;
         INSERT INTO work_item (flow, priority, payload, state, claimed_by, claimed_at, lease_until)
         SELECT 'invoice', 2, '{{}}', 'claimed', 'w', now(), now() + interval '5 minutes'
         FROM generate_series(1, {items}) AS n;"
    ))
    .execute(pool)
    .await
    .unwrap();
}

/// A connection keeps its plans: statements first planned while the registry
/// was empty (a new deployment) still find rows by key once it has grown,
/// instead of reading the whole table (a merge or hash join over every item
/// to lease 30 of them: 10 ms a group at 20,000 items) or the whole flow
/// table. Checked by what the claim's transaction read.
#[sqlx::test(migrator = "quota_arbiter::store::FRESH_MIGRATOR")]
async fn a_claims_statements_planned_on_an_empty_registry_read_by_key_once_it_grew(pool: PgPool) {
    create_flow(&pool, "ppf", 10, "invoice", "enforce").await;
    let mut conn = pool.acquire().await.unwrap();
    let settings = include_str!("../../sql/claim_plan_settings.sql");
    let prepare = format!(
        "PREPARE look (text[], float8, bigint, text[]) AS {};
         PREPARE walk (text[], text[], float8, bigint, boolean) AS {};
         PREPARE lease (bigint[], text[], float8[], text[], bigint[]) AS {};",
        include_str!("../../sql/work_first_look.sql"),
        include_str!("../../sql/work_candidates.sql"),
        include_str!("../../sql/work_claim.sql"),
    );
    sqlx::raw_sql(&prepare).execute(&mut *conn).await.unwrap();
    let look = format!(
        "BEGIN; {settings};
         EXECUTE look(ARRAY['invoice'], 60, 32, '{{}}');
         EXECUTE look(NULL, 60, 32, ARRAY['invoice']);"
    );
    let walk = "EXECUTE walk(ARRAY['invoice'], ARRAY['invoice'], 60, 32, true)";
    sqlx::raw_sql(&look).execute(&mut *conn).await.unwrap();
    sqlx::raw_sql(walk).execute(&mut *conn).await.unwrap();
    sqlx::raw_sql("EXECUTE lease('{1}', '{w}', '{30}', '{granted}', '{NULL}'); COMMIT")
        .execute(&mut *conn)
        .await
        .unwrap();

    grow_the_registry(&pool, 5_000).await;
    sqlx::raw_sql(&look).execute(&mut *conn).await.unwrap();
    let walked = sqlx::raw_sql(walk).fetch_all(&mut *conn).await.unwrap();
    let ids: Vec<String> = walked
        .iter()
        .map(|row| row.get::<i64, _>("id!").to_string())
        .collect();
    assert_eq!(ids.len(), 32);
    let leased = sqlx::raw_sql(&format!(
        "EXECUTE lease('{{{}}}', array_fill('w'::text, ARRAY[32]), array_fill(30::float8, ARRAY[32]),
                       array_fill('granted'::text, ARRAY[32]), array_fill(NULL::bigint, ARRAY[32]))",
        ids.join(",")
    ))
    .execute(&mut *conn)
    .await
    .unwrap();
    assert_eq!(leased.rows_affected(), 32);

    let (items_scanned, items_fetched) = reads_not_yet_reported(&mut conn, "work_item").await;
    let (flows_scanned, flows_fetched) = reads_not_yet_reported(&mut conn, "flow").await;
    assert_eq!(
        (items_scanned, flows_scanned),
        (0, 0),
        "sequential scans of the items and the flows"
    );
    // The looks, the walk of 32 and the 32 leased: a few hundred at most,
    // where a plan over every item fetches 5,000 or more.
    sqlx::raw_sql("ROLLBACK").execute(&mut *conn).await.unwrap();
    assert!(items_fetched < 300, "{items_fetched} items fetched");
    assert!(flows_fetched < 10, "{flows_fetched} flows fetched");
}

/// The same for an enqueue: a ref seen before is found by the ref's index,
/// and a flow's priority by the flow's key, however small the registry was
/// when the statement was first planned (five runs, then the plan is kept).
#[sqlx::test(migrator = "quota_arbiter::store::FRESH_MIGRATOR")]
async fn an_enqueue_planned_on_an_empty_registry_reads_by_key_once_it_grew(pool: PgPool) {
    create_flow(&pool, "ppf", 10, "invoice", "enforce").await;
    let mut conn = pool.acquire().await.unwrap();
    let prepare = format!(
        "PREPARE enqueue (text[], text[], timestamptz[], smallint[], jsonb[], jsonb[]) AS {}",
        include_str!("../../sql/work_enqueue.sql")
    );
    sqlx::raw_sql(&prepare).execute(&mut *conn).await.unwrap();
    let enqueue = |refs: &str| {
        let refs: Vec<String> = (1..=32).map(|n| format!("{refs}-{n}")).collect();
        let refs = refs.join(",");
        format!(
            "EXECUTE enqueue(array_fill('invoice'::text, ARRAY[32]), '{{{refs}}}',
                             array_fill(NULL::timestamptz, ARRAY[32]),
                             array_fill(NULL::smallint, ARRAY[32]),
                             array_fill('{{}}'::jsonb, ARRAY[32]),
                             array_fill(NULL::jsonb, ARRAY[32]))"
        )
    };
    for run in 0..6 {
        let refs = format!("early-{run}");
        sqlx::raw_sql(&enqueue(&refs))
            .execute(&mut *conn)
            .await
            .unwrap();
    }

    grow_the_registry(&pool, 5_000).await;
    sqlx::raw_sql("BEGIN").execute(&mut *conn).await.unwrap();
    // Refs seen before: each answer is the existing item.
    let answers = sqlx::raw_sql(&enqueue("inv"))
        .fetch_all(&mut *conn)
        .await
        .unwrap();
    assert_eq!(answers.len(), 32);
    assert!(answers.iter().all(|row| !row.get::<bool, _>("created!")));
    let (items_scanned, items_fetched) = reads_not_yet_reported(&mut conn, "work_item").await;
    let (flows_scanned, _) = reads_not_yet_reported(&mut conn, "flow").await;
    sqlx::raw_sql("COMMIT").execute(&mut *conn).await.unwrap();
    assert_eq!(
        (items_scanned, flows_scanned),
        (0, 0),
        "sequential scans of the items and the flows"
    );
    assert!(items_fetched < 300, "{items_fetched} items fetched");
}
