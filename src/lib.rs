//! quota-arbiter: many workers share a third-party quota, with PostgreSQL as
//! the single atomic arbiter. See docs/design.md for the contract.

pub mod arbiter;
pub mod auth;
pub mod bypass;
pub mod catalog;
pub mod cli;
pub mod clock;
pub mod config;
pub mod domain;
pub mod http;
pub mod metrics;
pub mod mirror;
pub mod operator;
pub mod report;
pub mod startup;
pub mod store;
pub mod tally;
pub mod telemetry;
