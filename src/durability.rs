//! What the store can lose in a failover (docs/design.md §13). A PostgreSQL
//! whose commits wait for a synchronous standby loses no answered grant when
//! the standby is promoted; one that replicates asynchronously may lose the
//! last commits, and the new primary then counts from older rows. A replica
//! reads which it is on every catalog sync (so within seconds of connecting
//! and of every reconnection), logs each change once, and shows it on
//! `/readyz`, the metrics and the dashboard; a new timeline is a new primary.

use std::sync::{Arc, Mutex};

use serde::Serialize;
use utoipa::ToSchema;

use crate::metrics::Metrics;

/// One reading of the store's replication settings (`sql/durability.sql`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Reading {
    pub synchronous_commit: String,
    pub synchronous_standby_names: String,
    pub standbys: i64,
    pub synchronous_standbys: i64,
    /// `None` on a server in recovery.
    pub timeline: Option<i32>,
}

/// Whether a commit waits for a standby.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum Durability {
    /// A commit returns once a synchronous standby has it: a failover to that
    /// standby loses nothing answered.
    Synchronous,
    /// A commit returns before any standby has it: a failover may lose the
    /// last commits (answered grants among them) and over-grant after.
    Asynchronous,
    /// Not read yet (the store out of reach since start-up).
    Unknown,
}

impl Reading {
    /// The rule: commits wait for a standby when `synchronous_commit` waits
    /// for one (`on`, `remote_write`, `remote_apply`) and standbys are named
    /// to wait for. (With none connected, commits wait rather than lose.)
    pub fn durability(&self) -> Durability {
        let waits = matches!(
            self.synchronous_commit.as_str(),
            "on" | "remote_write" | "remote_apply"
        );
        if waits && !self.synchronous_standby_names.trim().is_empty() {
            Durability::Synchronous
        } else {
            Durability::Asynchronous
        }
    }
}

/// What changed between two readings, worth a log line.
#[derive(Debug, PartialEq, Eq)]
pub enum Change {
    /// The first reading.
    First(Durability),
    Durability(Durability),
    /// A new timeline: the server answering is a promoted standby.
    NewPrimary {
        from: i32,
        to: i32,
    },
}

/// The changes from `before` (`None`: no reading yet) to `now`.
pub fn changes(before: Option<&Reading>, now: &Reading) -> Vec<Change> {
    let Some(before) = before else {
        return vec![Change::First(now.durability())];
    };
    let mut changes = Vec::new();
    if before.durability() != now.durability() {
        changes.push(Change::Durability(now.durability()));
    }
    if let (Some(from), Some(to)) = (before.timeline, now.timeline) {
        if from != to {
            changes.push(Change::NewPrimary { from, to });
        }
    }
    changes
}

/// The replica's last reading, shared by the sync loop that takes it and
/// the surfaces that show it.
#[derive(Clone, Default)]
pub struct DurabilityWatch {
    last: Arc<Mutex<Option<Reading>>>,
}

impl DurabilityWatch {
    /// Takes a reading: logs what changed, once, and sets the metrics.
    pub(crate) fn note(&self, reading: Reading, metrics: &Metrics) {
        let mut last = self.last.lock().unwrap_or_else(|p| p.into_inner());
        for change in changes(last.as_ref(), &reading) {
            log(&change, &reading);
            if matches!(change, Change::NewPrimary { .. }) {
                metrics.record_new_primary();
            }
        }
        metrics.set_durability(
            reading.durability() == Durability::Synchronous,
            reading.timeline,
        );
        *last = Some(reading);
    }

    pub fn durability(&self) -> Durability {
        let last = self.last.lock().unwrap_or_else(|p| p.into_inner());
        last.as_ref()
            .map_or(Durability::Unknown, Reading::durability)
    }
}

fn log(change: &Change, reading: &Reading) {
    let (commit, names) = (
        &reading.synchronous_commit,
        &reading.synchronous_standby_names,
    );
    let (standbys, synchronous) = (reading.standbys, reading.synchronous_standbys);
    match change {
        Change::First(Durability::Synchronous) | Change::Durability(Durability::Synchronous) => {
            tracing::info!(synchronous_commit = %commit, synchronous_standby_names = %names, standbys, synchronous_standbys = synchronous,
                "the store commits to a synchronous standby: a failover loses no answered grant")
        }
        Change::First(_) | Change::Durability(_) => {
            tracing::warn!(synchronous_commit = %commit, synchronous_standby_names = %names, standbys,
                "the store replicates asynchronously (or not at all): a failover may lose answered grants and over-grant after; see docs/operations/failover.md")
        }
        Change::NewPrimary { from, to } => tracing::warn!(
            from, to,
            "the store is a new primary (its timeline moved): grants it had not replicated are lost if replication was asynchronous"
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reading(commit: &str, names: &str, timeline: Option<i32>) -> Reading {
        Reading {
            synchronous_commit: commit.into(),
            synchronous_standby_names: names.into(),
            standbys: 1,
            synchronous_standbys: i64::from(!names.is_empty()),
            timeline,
        }
    }

    #[test]
    fn commits_wait_for_a_standby_only_when_both_settings_say_so() {
        let synchronous = [
            ("on", "*"),
            ("remote_apply", "ANY 1 (a, b)"),
            ("remote_write", "b"),
        ];
        for (commit, names) in synchronous {
            let durability = reading(commit, names, Some(1)).durability();
            assert_eq!(durability, Durability::Synchronous, "{commit} {names}");
        }
        let asynchronous = [("on", ""), ("local", "*"), ("off", "*"), ("on", "  ")];
        for (commit, names) in asynchronous {
            let durability = reading(commit, names, Some(1)).durability();
            assert_eq!(durability, Durability::Asynchronous, "{commit} {names:?}");
        }
    }

    #[test]
    fn a_change_of_durability_or_of_timeline_is_told_once() {
        let sync = reading("on", "*", Some(1));
        assert_eq!(
            changes(None, &sync),
            [Change::First(Durability::Synchronous)]
        );
        assert_eq!(changes(Some(&sync), &sync), []);
        let promoted = reading("on", "", Some(2));
        assert_eq!(
            changes(Some(&sync), &promoted),
            [
                Change::Durability(Durability::Asynchronous),
                Change::NewPrimary { from: 1, to: 2 }
            ]
        );
        // A reading from a server in recovery says nothing of the timeline.
        assert_eq!(changes(Some(&sync), &reading("on", "*", None)), []);
    }
}
