//! quota-arbiter: many workers share a third-party quota, with PostgreSQL as
//! the single atomic arbiter. See docs/design.md for the contract.

pub mod administration;
pub mod admission;
pub mod auth;
pub mod bypass;
pub mod catalog;
pub mod cli;
pub mod clock;
pub mod config;
pub mod domain;
pub mod durability;
pub mod http;
pub mod metrics;
pub mod mirror;
pub mod operator;
pub mod report;
pub mod reservations;
pub(crate) mod shell;
pub mod startup;
pub mod store;
pub(crate) mod supervise;
pub mod tally;
pub mod telemetry;
pub mod work_registry;
