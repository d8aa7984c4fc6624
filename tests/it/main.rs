//! One integration test binary (faster to build): real PostgreSQL in every
//! test, a fresh database per test via `#[sqlx::test]`.

mod admin;
mod batch;
mod config;
mod helpers;
mod openapi;
mod outage;
mod replicas;
mod reserve;
mod windows;
mod work;
