//! One integration test binary (faster to build): real PostgreSQL in every
//! test, a fresh database per test via `#[sqlx::test]`.

mod admin;
mod admit;
mod batch;
mod cadence;
mod claim_groups;
mod claim_plans;
mod client;
mod config;
mod dashboard;
mod docs;
mod enqueue_groups;
mod gateway;
mod helpers;
mod history;
mod input;
mod keys;
mod metrics;
mod openapi;
mod operate;
mod outage;
mod paced;
mod readme;
mod replicas;
mod report;
mod reserve;
mod rules;
mod schema;
mod shell_worker;
mod shutdown;
mod stream;
mod surfaces;
mod tally;
mod views;
mod windows;
mod work;
