//! Concurrent enqueues share one insert (docs/design.md §9): fewer
//! statements than items, one item per ref however many ask for it at once,
//! and an item the store refuses fails only itself.

use std::collections::HashSet;
use std::time::Duration;

use quota_arbiter::store::WorkItem;
use serde_json::{json, Value};
use sqlx::postgres::PgRow;
use sqlx::{PgPool, Row};

use crate::helpers::{create_flow, eventually, metrics_text, TestApp};
use crate::work::count_of;

/// Enqueues every body at once; `(status, item)` per body, in order (the
/// item is `None` on an error).
async fn enqueue_all(
    client: reqwest::Client,
    base: String,
    bodies: Vec<Value>,
) -> Vec<(u16, Option<WorkItem>)> {
    let mut tasks = tokio::task::JoinSet::new();
    for (i, body) in bodies.into_iter().enumerate() {
        let (client, url) = (client.clone(), format!("{base}/v1/work"));
        tasks.spawn(async move {
            let response = client.post(url).json(&body).send().await.unwrap();
            let status = response.status().as_u16();
            let item = if status < 300 {
                Some(response.json::<WorkItem>().await.unwrap())
            } else {
                None
            };
            (i, (status, item))
        });
    }
    let mut answers = tasks.join_all().await;
    answers.sort_by_key(|(i, _)| *i);
    answers.into_iter().map(|(_, answer)| answer).collect()
}

#[sqlx::test(migrator = "quota_arbiter::store::FRESH_MIGRATOR")]
async fn concurrent_enqueues_share_an_insert_and_one_ref_is_one_item(pool: PgPool) {
    create_flow(&pool, "ppf", 10, "invoice", "enforce").await;
    let app = TestApp::spawn(pool.clone()).await;

    let bodies = (0..64)
        .map(|i| json!({"flow": "invoice", "ref": format!("inv-{i}"), "payload": {"n": i}}))
        .collect();
    let answers = enqueue_all(app.client.clone(), app.base.clone(), bodies).await;
    let mut ids = HashSet::new();
    for (i, (status, item)) in answers.iter().enumerate() {
        let item = item.as_ref().expect("enqueued");
        assert_eq!(*status, 201, "item {i}");
        assert_eq!(item.reference.as_deref(), Some(format!("inv-{i}").as_str()));
        assert_eq!(
            item.payload,
            json!({"n": i}),
            "each caller gets its own item"
        );
        ids.insert(item.id);
    }
    assert_eq!(ids.len(), 64);
    // One statement's items share its transaction's start.
    let statements = count_of(&pool, "SELECT count(DISTINCT enqueued_at) FROM work_item").await;
    assert!(
        statements < 64,
        "{statements} inserts for 64 concurrent enqueues"
    );

    // Twenty callers with one ref, at once: one item, created once.
    let bodies = (0..20)
        .map(|i| json!({"flow": "invoice", "ref": "once", "payload": {"n": i}}))
        .collect();
    let answers = enqueue_all(app.client.clone(), app.base.clone(), bodies).await;
    let created = answers.iter().filter(|(status, _)| *status == 201).count();
    let statuses: Vec<u16> = answers.iter().map(|(status, _)| *status).collect();
    assert_eq!(created, 1, "{statuses:?}");
    let ids: HashSet<i64> = answers
        .iter()
        .map(|(status, item)| {
            assert!(*status == 200 || *status == 201, "{status}");
            item.as_ref().unwrap().id
        })
        .collect();
    assert_eq!(ids.len(), 1, "one item for one ref");
    let stored = count_of(&pool, "SELECT count(*) FROM work_item WHERE ref = 'once'").await;
    assert_eq!(stored, 1);
}

/// An item the store refuses (here a trigger refuses one ref) fails only
/// itself: the group it was inserted with is inserted item by item.
#[sqlx::test(migrator = "quota_arbiter::store::FRESH_MIGRATOR")]
async fn an_item_the_store_refuses_fails_only_itself(pool: PgPool) {
    create_flow(&pool, "ppf", 10, "invoice", "enforce").await;
    sqlx::raw_sql(
        "CREATE FUNCTION refuse_poison() RETURNS trigger LANGUAGE plpgsql AS $$
         BEGIN
             IF NEW.ref = 'poison' THEN RAISE EXCEPTION 'poisoned item'; END IF;
             RETURN NEW;
         END $$;
         CREATE TRIGGER refuse_poison BEFORE INSERT ON work_item
             FOR EACH ROW EXECUTE FUNCTION refuse_poison();",
    )
    .execute(&pool)
    .await
    .unwrap();
    let app = TestApp::spawn(pool.clone()).await;
    let errors = || async {
        let text = metrics_text(&app.client, &app.base).await;
        let series = r#"quota_arbiter_store_errors_total{operation="enqueue_work"} "#;
        let line = text.lines().find_map(|l| l.strip_prefix(series));
        line.expect("the enqueue's error series").trim().to_string()
    };
    let poison = json!({"flow": "invoice", "ref": "poison", "payload": {}});

    // Alone, it fails once: one statement, one store error.
    let alone = enqueue_all(app.client.clone(), app.base.clone(), vec![poison.clone()]).await;
    assert_eq!(alone[0].0, 500);
    assert_eq!(errors().await, "1");

    // The first insert waits on the table, so the rest gather behind it
    // into one group with the poisoned item.
    let mut held = pool.begin().await.unwrap();
    sqlx::query("LOCK TABLE work_item IN SHARE MODE")
        .execute(&mut *held)
        .await
        .unwrap();
    let body = json!({"flow": "invoice", "ref": "first", "payload": {}});
    let first = tokio::spawn(enqueue_all(
        app.client.clone(),
        app.base.clone(),
        vec![body],
    ));
    let waiting = eventually(Duration::from_secs(5), 1, || {
        count_of(
            &pool,
            "SELECT count(*) FROM pg_stat_activity
             WHERE datname = current_database() AND wait_event_type = 'Lock'
               AND query LIKE '%Enqueue a group of work items%'",
        )
    })
    .await;
    assert_eq!(waiting, 1, "the first insert waits on the table");
    let mut bodies: Vec<Value> = (0..16)
        .map(|i| json!({"flow": "invoice", "ref": format!("good-{i}"), "payload": {}}))
        .collect();
    bodies.insert(8, poison);
    let rest = tokio::spawn(enqueue_all(app.client.clone(), app.base.clone(), bodies));
    tokio::time::sleep(Duration::from_millis(300)).await;
    held.commit().await.unwrap();

    assert_eq!(first.await.unwrap()[0].0, 201);
    let answers = rest.await.unwrap();
    for (i, (status, item)) in answers.iter().enumerate() {
        if i == 8 {
            assert_eq!(*status, 500, "the poisoned item fails");
        } else {
            assert_eq!(*status, 201, "item {i} beside the poisoned one");
            assert!(item.is_some());
        }
    }
    let stored = count_of(&pool, "SELECT count(*) FROM work_item").await;
    assert_eq!(stored, 17);
    // The group's statement and the poisoned item's own: two more errors.
    assert_eq!(errors().await, "3");
}

/// The statement alone, once: every item of a group has its row, two items
/// with one ref get the one item created for the first, and a ref seen
/// before answers its existing item (the store's retry would hide a row
/// missing here, at the cost of another statement).
#[sqlx::test(migrator = "quota_arbiter::store::FRESH_MIGRATOR")]
async fn one_enqueue_statement_answers_every_item_of_its_group(pool: PgPool) {
    create_flow(&pool, "ppf", 10, "invoice", "enforce").await;
    let enqueue = |refs: Vec<Option<&'static str>>| {
        let pool = pool.clone();
        async move {
            let n = refs.len();
            let rows = sqlx::query(include_str!("../../sql/work_enqueue.sql"))
                .bind(vec!["invoice"; n])
                .bind(refs)
                .bind(vec![None::<chrono::DateTime<chrono::Utc>>; n])
                .bind(vec![None::<i16>; n])
                .bind((0..n).map(|i| json!({ "n": i })).collect::<Vec<Value>>())
                .bind(vec![None::<Value>; n])
                .fetch_all(&pool)
                .await
                .unwrap();
            let column = |row: &PgRow, name: &str| row.get::<i64, _>(name);
            rows.iter()
                .map(|r| (column(r, "n!"), column(r, "id!"), r.get("created!")))
                .collect::<Vec<(i64, i64, bool)>>()
        }
    };
    let before = enqueue(vec![Some("old")]).await;
    let old = before[0].1;
    let rows = enqueue(vec![Some("a"), None, Some("a"), Some("old"), None]).await;
    let ns: Vec<i64> = rows.iter().map(|r| r.0).collect();
    assert_eq!(ns, [1, 2, 3, 4, 5], "one row per item, in order: {rows:?}");
    let (a, second_a) = (rows[0], rows[2]);
    assert!(a.2 && !second_a.2, "created for the first only: {rows:?}");
    assert_eq!(a.1, second_a.1, "one item for one ref: {rows:?}");
    assert_eq!((rows[3].1, rows[3].2), (old, false), "the item seen before");
    assert!(rows[1].2 && rows[4].2 && rows[1].1 != rows[4].1, "{rows:?}");
    let stored = count_of(&pool, "SELECT count(*) FROM work_item").await;
    assert_eq!(stored, 4, "old, a and the two without a ref");
}
