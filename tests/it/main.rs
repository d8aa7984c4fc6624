//! One integration test binary (faster to build): real PostgreSQL in every
//! test, a fresh database per test via `#[sqlx::test]`.

mod admin;
mod batch;
mod cadence;
mod config;
mod dashboard;
mod helpers;
mod openapi;
mod operate;
mod outage;
mod readme;
mod replicas;
mod reserve;
mod windows;
mod work;
