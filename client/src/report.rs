//! `POST /v1/report`: what happened upstream after an emission. Frees the
//! grant's concurrency lease and teaches the quota's adaptive cadence.

use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::decision::LeaseId;

/// A report about one emission: the upstream's status, its duration, the lease
/// to free. Name the flow (or the quota) and give a status, a lease or both.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Report {
    #[serde(skip_serializing_if = "Option::is_none")]
    flow: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    quota: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    status: Option<u16>,
    #[serde(skip_serializing_if = "Option::is_none")]
    duration_ms: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    lease_id: Option<LeaseId>,
}

impl Report {
    /// About an emission of `flow`: its quota's cadence adapts.
    pub fn flow(flow: impl Into<String>) -> Self {
        Self::about(Some(flow.into()), None)
    }

    /// About an emission spending `quota`, when no flow names it.
    pub fn quota(quota: impl Into<String>) -> Self {
        Self::about(None, Some(quota.into()))
    }

    fn about(flow: Option<String>, quota: Option<String>) -> Self {
        Self {
            flow,
            quota,
            status: None,
            duration_ms: None,
            lease_id: None,
        }
    }

    /// The upstream's HTTP status: 429 slows the cadence down hard, other
    /// failures gently, a success lets it creep back up.
    pub fn status(mut self, status: u16) -> Self {
        self.status = Some(status);
        self
    }

    /// The upstream call timed out (status 0 on the wire).
    pub fn timed_out(self) -> Self {
        self.status(0)
    }

    /// How long the emission took (whole milliseconds).
    pub fn duration(mut self, duration: Duration) -> Self {
        self.duration_ms = Some(u64::try_from(duration.as_millis()).unwrap_or(u64::MAX));
        self
    }

    /// The grant's lease, to free its in-flight place.
    pub fn lease(mut self, lease_id: impl Into<LeaseId>) -> Self {
        self.lease_id = Some(lease_id.into());
        self
    }

    pub fn lease_id(&self) -> Option<&LeaseId> {
        self.lease_id.as_ref()
    }

    pub fn flow_name(&self) -> Option<&str> {
        self.flow.as_deref()
    }

    pub fn quota_name(&self) -> Option<&str> {
        self.quota.as_deref()
    }

    /// The upstream's status as reported (0: timed out).
    pub fn upstream_status(&self) -> Option<u16> {
        self.status
    }
}

/// What a settlement came to (`POST /v1/settle`): of the flow's first
/// quota, and of each quota the reservation spent in [`Settled::quotas`].
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
#[non_exhaustive]
pub struct Settled {
    /// The flow's first quota (the one answers name).
    #[serde(default)]
    pub quota: String,
    /// The slots the reservation took.
    pub estimated: i64,
    /// What is counted now.
    pub spent: i64,
    /// Given back to the windows still open.
    pub given_back: i64,
    /// Taken past the estimate, without refusal.
    pub overspent: i64,
    /// Every quota the reservation spent, the flow's first first.
    #[serde(default)]
    pub quotas: Vec<Settled>,
}

impl Settled {
    /// What the settlement did to `quota`, one the reservation spent.
    pub fn of(&self, quota: &str) -> Option<&Settled> {
        self.quotas.iter().find(|q| q.quota == quota)
    }
}

/// The arbiter's answer to a report.
#[derive(Clone, Debug, Default, PartialEq, Deserialize)]
#[non_exhaustive]
pub struct ReportAnswer {
    /// Whether the lease was still held (an expired one may have been reused).
    pub released: Option<bool>,
    pub held_seconds: Option<f64>,
    /// The flow's moving average hold time.
    pub avg_lease_seconds: Option<f64>,
    /// The quota's adaptive factor (0-1] after this report, when adapted.
    pub factor: Option<f64>,
    pub effective_rate: Option<f64>,
    pub effective_burst: Option<f64>,
    /// Degraded slots the arbiter counted (the client's own reports of them).
    pub counted: Option<u32>,
    /// Answered by the local fallback, the arbiter unreachable: the factor
    /// and limits are the local bucket's, and a lease was not released (it
    /// expires on its own).
    #[serde(skip)]
    pub local: bool,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reports_serialize_as_the_arbiter_reads_them() {
        let report = Report::flow("invoice")
            .status(200)
            .duration(Duration::from_millis(812))
            .lease(733927340619428183_i64);
        assert_eq!(
            serde_json::to_value(&report).unwrap(),
            serde_json::json!({"flow": "invoice", "lease_id": "733927340619428183",
                "status": 200, "duration_ms": 812})
        );
        assert_eq!(
            serde_json::to_value(Report::quota("ppf").timed_out()).unwrap(),
            serde_json::json!({"quota": "ppf", "status": 0})
        );
    }
}
