//! Share-stream presence (design.md §10): which clients are connected, on any
//! replica, and what the quotas their flows spend allow now.

use chrono::{DateTime, Utc};

use super::Store;
use crate::domain::catalog::Fallback;
use crate::domain::window::Period;

/// One quota as a share stream reports it: what a client needs to decide
/// locally at its share when the arbiter is unreachable (design.md §12).
#[derive(Clone, Debug, PartialEq, serde::Serialize, utoipa::ToSchema)]
pub struct QuotaShare {
    pub quota: String,
    /// Tokens per second, the adaptive factor applied; `null` without cadence.
    pub rate: Option<f64>,
    /// Bucket size, the adaptive factor applied; `null` without cadence.
    pub burst: Option<f64>,
    /// The cadence as configured, which a client's local rate recovers
    /// toward after an adaptive slow-down; `null` without cadence.
    pub configured_rate: Option<f64>,
    pub configured_burst: Option<f64>,
    /// Slots per UTC hour (`null` without a `1h` window). Without cadence a
    /// client's local rate is `hourly_ceiling / 3600` per second with a
    /// burst of 1; with cadence, `rate` and `burst`; either way divided
    /// among `clients`.
    #[schema(minimum = 0, maximum = 9007199254740992_i64)]
    pub hourly_ceiling: Option<i64>,
    /// Every window of the quota, shortest first: a client's local rate
    /// never spends one faster than `ceiling / seconds`, and its clients
    /// together never more than it has `left`.
    pub windows: Vec<ShareWindow>,
    /// Live share-stream clients of this quota across replicas: each one's
    /// share is `rate / clients`.
    pub clients: i64,
    /// The stream's flows that spend this quota, by name.
    pub flows: Vec<FlowShare>,
}

/// One window of a quota in a share event.
#[derive(Clone, Debug, PartialEq, serde::Serialize, utoipa::ToSchema)]
pub struct ShareWindow {
    pub period: String,
    pub ceiling: i64,
    /// The window's nominal length (a month: 30 days).
    pub seconds: u64,
    /// What the current window has left, as the event was made.
    #[schema(minimum = 0, maximum = 9007199254740992_i64)]
    pub left: i64,
    /// When the current window ends, by the database clock.
    pub ends_at: DateTime<Utc>,
    /// Seconds from the event to `ends_at` (a client's clock need not agree
    /// with the database's).
    pub ends_in_seconds: f64,
}

/// A flow of the stream and whether its client may decide locally.
#[derive(Clone, Debug, PartialEq, serde::Serialize, utoipa::ToSchema)]
pub struct FlowShare {
    pub flow: String,
    pub fallback: Fallback,
}

impl Store {
    pub(crate) async fn join_stream(&self, flows: &[String]) -> Result<i64, sqlx::Error> {
        sqlx::query_file_scalar!("sql/stream_join.sql", flows)
            .fetch_one(self.pool())
            .await
    }

    pub(crate) async fn beat_stream(&self, id: i64, flows: &[String]) -> Result<(), sqlx::Error> {
        sqlx::query_file!("sql/stream_beat.sql", id, flows)
            .execute(self.pool())
            .await?;
        Ok(())
    }

    pub(crate) async fn leave_stream(&self, id: i64) -> Result<(), sqlx::Error> {
        sqlx::query_file!("sql/stream_leave.sql", id)
            .execute(self.pool())
            .await?;
        Ok(())
    }

    /// The quotas `flows` spend, by name.
    pub(crate) async fn stream_shares(
        &self,
        flows: &[String],
    ) -> Result<Vec<QuotaShare>, sqlx::Error> {
        let rows = sqlx::query_file!("sql/stream_shares.sql", flows)
            .fetch_all(self.pool())
            .await?;
        Ok(rows
            .into_iter()
            .map(|row| QuotaShare {
                quota: row.quota,
                rate: row.effective_rate,
                burst: row.effective_burst,
                configured_rate: row.configured_rate,
                configured_burst: row.configured_burst,
                hourly_ceiling: row.hourly_ceiling,
                windows: (row.periods.iter())
                    .zip(row.ceilings)
                    .zip(row.lefts.into_iter().zip(row.ends))
                    .filter_map(|((period, ceiling), (left, ends_at))| {
                        let period = Period::parse(period).ok()?;
                        let ends_in = (ends_at - row.db_now).num_milliseconds() as f64 / 1e3;
                        Some(ShareWindow {
                            period: period.to_string(),
                            ceiling,
                            seconds: period.nominal_seconds(),
                            left,
                            ends_at,
                            ends_in_seconds: ends_in.max(0.0),
                        })
                    })
                    .collect(),
                clients: row.clients,
                flows: row
                    .flows
                    .into_iter()
                    .zip(row.fallbacks)
                    .map(|(flow, fallback)| FlowShare {
                        flow,
                        // The table's CHECK admits only `off` and `local`.
                        fallback: fallback.parse().unwrap_or_default(),
                    })
                    .collect(),
            })
            .collect())
    }
}
