//! The pending-work registry: items, their leases, and the claim's building
//! blocks (run inside the claim's transaction).

use std::collections::BTreeMap;
use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};
use sqlx::PgExecutor;
use utoipa::ToSchema;

use super::{Store, StoreTransaction};
use crate::domain::rationing::Rank;
use crate::domain::FlowName;

/// A work item as a reader sees it: a claim whose `lease_until` has passed
/// reads `pending`, as the next claim treats it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct WorkItem {
    pub id: i64,
    pub flow: String,
    #[serde(rename = "ref")]
    pub reference: Option<String>,
    pub deadline: Option<DateTime<Utc>>,
    /// 1 is the most important; the flow's priority unless the item named one.
    pub priority: i16,
    #[schema(schema_with = crate::domain::input::schema::payload)]
    pub payload: serde_json::Value,
    /// `pending` (a claim whose lease ran out included), `claimed` or `done`.
    pub state: String,
    /// How the last claim was decided: `granted`, `bypassed` or `unthrottled`.
    pub outcome: Option<String>,
    /// Claims so far: each one spent a slot (or bypassed the quota).
    pub attempts: i32,
    /// The worker holding the claim (or whose lease ran out, or who emitted
    /// it); `null` once released.
    pub claimed_by: Option<String>,
    pub enqueued_at: DateTime<Utc>,
    pub claimed_at: Option<DateTime<Utc>>,
    pub lease_until: Option<DateTime<Utc>>,
    pub done_at: Option<DateTime<Utc>>,
    /// A released item is not claimed before this time (its retry delay);
    /// `null` (or a time past) when it is claimable now.
    pub not_before: Option<DateTime<Utc>>,
    /// What claiming it spends of its flow's quotas (`{"llm-tokens": 3500}`);
    /// a quota not named, one. `null`: one of each (design.md §12).
    #[schema(schema_with = crate::domain::input::schema::spend)]
    pub spend: Option<serde_json::Value>,
}

/// A `WorkItem` from a query row that has its columns.
macro_rules! work_item {
    ($r:expr) => {
        WorkItem {
            id: $r.id,
            flow: $r.flow,
            reference: $r.reference,
            deadline: $r.deadline,
            priority: $r.priority,
            payload: $r.payload,
            state: $r.state,
            outcome: $r.outcome,
            attempts: $r.attempts,
            claimed_by: $r.claimed_by,
            enqueued_at: $r.enqueued_at,
            claimed_at: $r.claimed_at,
            lease_until: $r.lease_until,
            done_at: $r.done_at,
            not_before: $r.not_before,
            spend: $r.spend,
        }
    };
}

/// What to enqueue.
#[derive(Clone, Debug)]
pub struct NewWork {
    pub flow: FlowName,
    pub reference: Option<String>,
    pub deadline: Option<DateTime<Utc>>,
    pub priority: Option<i16>,
    pub payload: serde_json::Value,
    /// What claiming it spends of each quota it names (`None`: one of each).
    pub spend: Option<BTreeMap<String, i64>>,
}

/// A locked, claimable item, before the claim decides about it.
#[derive(Clone, Debug)]
pub struct Candidate {
    pub id: i64,
    pub flow: String,
    pub deadline: Option<DateTime<Utc>>,
    pub priority: i16,
    pub reference: Option<String>,
    /// What claiming it spends (`WorkItem::spend`).
    pub spend: Option<serde_json::Value>,
}

impl Candidate {
    /// Its place in rationing order; first come first served is the order
    /// of ids (a bigserial, so never negative).
    pub fn rank(&self) -> Rank {
        Rank::new(self.deadline, self.priority, self.id.unsigned_abs())
    }
}

/// Which claimable items one candidate query looks at.
pub(crate) struct Lane<'a> {
    /// Items of these flows, outside the bypass horizon.
    pub flows: &'a [String],
    /// The worker's flows; `None`: all.
    pub worker_flows: Option<&'a [String]>,
    pub horizon_seconds: f64,
}

/// What a claim sees before it takes any slot.
#[derive(Debug, Default)]
pub(crate) struct FirstLook {
    /// Items inside the bypass horizon, locked.
    pub due: Vec<Candidate>,
    /// Items of flows the arbiter does not throttle, locked.
    pub unthrottled: Vec<Candidate>,
    /// Enforced flows with claimable work outside the horizon.
    pub busy: Vec<String>,
}

/// Leftover after a claim that got nothing.
pub struct Backlog {
    pub db_now: DateTime<Utc>,
    /// Pending items, waiting ones included.
    pub pending: i64,
    /// Pending items not waiting out a retry delay.
    pub claimable: i64,
    /// The earliest time a claimable item could be granted.
    pub retry_at: DateTime<Utc>,
    /// When the first retry delay ends.
    pub next_not_before: Option<DateTime<Utc>>,
}

/// One finish of a group: worker `worker` finishes item `id` so.
#[derive(Clone, Debug)]
pub(crate) struct FinishAsk {
    pub id: i64,
    pub worker: String,
    pub finish: Finish,
}

/// How a worker finishes a claimed item.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Finish {
    /// Emitted: done.
    Done,
    /// Not emitted: pending again once the delay has passed.
    Release(RetryDelay),
}

/// When a released item may be claimed again.
#[derive(Clone, Copy, Debug)]
pub(crate) enum RetryDelay {
    /// The default backoff, which grows with the item's attempts.
    Backoff,
    After(Duration),
    At(DateTime<Utc>),
}

/// The default retry delay: 5 s after the first claim, doubling with every
/// further claim, at most 1 h. Every claim spends a slot, so an item whose
/// emission keeps failing costs about one slot an hour once the backoff is
/// at its cap, instead of one per loop of its worker.
pub(crate) const RELEASE_BACKOFF_BASE: Duration = Duration::from_secs(5);
pub(crate) const RELEASE_BACKOFF_CAP: Duration = Duration::from_secs(3600);
/// The furthest ahead a release may push an item, whatever it asks for.
pub(crate) const MAX_RETRY_DELAY: Duration = Duration::from_secs(7 * 24 * 3600);

impl Store {
    /// Enqueues a group of items in one statement; per item, in order,
    /// `(item, created)`. A ref seen before returns its item.
    pub async fn enqueue(&self, works: &[NewWork]) -> Result<Vec<(WorkItem, bool)>, sqlx::Error> {
        let mut answers: Vec<Option<(WorkItem, bool)>> = vec![None; works.len()];
        // A concurrent enqueue of the same ref commits after this statement's
        // snapshot: the insert then does nothing and the item is not visible
        // yet. The next statement sees it.
        for _ in 0..3 {
            let asked: Vec<usize> = (0..works.len()).filter(|&i| answers[i].is_none()).collect();
            if asked.is_empty() {
                break;
            }
            let asked_works: Vec<&NewWork> = asked.iter().map(|&i| &works[i]).collect();
            let flows: Vec<&str> = asked_works.iter().map(|w| w.flow.as_str()).collect();
            let refs: Vec<Option<&str>> =
                asked_works.iter().map(|w| w.reference.as_deref()).collect();
            let deadlines: Vec<Option<DateTime<Utc>>> =
                asked_works.iter().map(|w| w.deadline).collect();
            let priorities: Vec<Option<i16>> = asked_works.iter().map(|w| w.priority).collect();
            let payloads: Vec<&serde_json::Value> =
                asked_works.iter().map(|w| &w.payload).collect();
            let spends: Vec<Option<serde_json::Value>> = asked_works
                .iter()
                .map(|w| w.spend.as_ref().map(|spend| serde_json::json!(spend)))
                .collect();
            let rows = sqlx::query_file!(
                "sql/work_enqueue.sql",
                &flows as &[&str],
                &refs as &[Option<&str>],
                &deadlines as &[Option<DateTime<Utc>>],
                &priorities as &[Option<i16>],
                &payloads as &[&serde_json::Value],
                &spends as &[Option<serde_json::Value>]
            )
            .fetch_all(self.pool())
            .await?;
            for r in rows {
                let Some(&i) = usize::try_from(r.n - 1).ok().and_then(|n| asked.get(n)) else {
                    return Err(sqlx::Error::Protocol(format!(
                        "enqueue answered item {}",
                        r.n
                    )));
                };
                let created = r.created;
                answers[i] = Some((work_item!(r), created));
            }
        }
        answers
            .into_iter()
            .map(|a| a.ok_or(sqlx::Error::RowNotFound))
            .collect()
    }

    pub async fn work_item(&self, id: i64) -> Result<Option<WorkItem>, sqlx::Error> {
        sqlx::query_file_as!(WorkItem, "sql/work_get.sql", id)
            .fetch_optional(self.pool())
            .await
    }

    /// Finishes a group of claimed items in one statement, each item once
    /// (`sql/work_finish.sql`): one answer per ask, in order — the item and
    /// the in-flight place lease its claim held, or `None` when its worker
    /// holds no claim on it.
    pub(crate) async fn finish_works(
        &self,
        asks: &[FinishAsk],
    ) -> Result<Vec<Option<(WorkItem, Option<i64>)>>, sqlx::Error> {
        let ids: Vec<i64> = asks.iter().map(|a| a.id).collect();
        let workers: Vec<String> = asks.iter().map(|a| a.worker.clone()).collect();
        let done: Vec<bool> = asks
            .iter()
            .map(|a| matches!(a.finish, Finish::Done))
            .collect();
        let delays = asks.iter().map(|a| match a.finish {
            Finish::Release(RetryDelay::After(delay)) => (Some(delay.as_secs_f64()), None),
            Finish::Release(RetryDelay::At(at)) => (None, Some(at)),
            Finish::Release(RetryDelay::Backoff) | Finish::Done => (None, None),
        });
        let (retry_in, retry_at): (Vec<Option<f64>>, Vec<Option<DateTime<Utc>>>) = delays.unzip();
        let rows = sqlx::query_file!(
            "sql/work_finish.sql",
            &ids,
            &workers,
            &done,
            &retry_in as &[Option<f64>],
            &retry_at as &[Option<DateTime<Utc>>],
            RELEASE_BACKOFF_BASE.as_secs_f64(),
            RELEASE_BACKOFF_CAP.as_secs_f64(),
            MAX_RETRY_DELAY.as_secs_f64()
        )
        .fetch_all(self.pool())
        .await?;
        let mut finished: Vec<Option<(WorkItem, Option<i64>)>> = vec![None; asks.len()];
        for r in rows {
            let at = usize::try_from(r.position - 1)
                .ok()
                .filter(|&at| at < asks.len());
            if let Some(at) = at {
                finished[at] = Some((work_item!(r), r.place_lease_id));
            }
        }
        Ok(finished)
    }

    /// Deletes up to `batch` items done longer than `retention` ago; how many.
    pub async fn prune_done_work(
        &self,
        retention: Duration,
        batch: i64,
    ) -> Result<u64, sqlx::Error> {
        let pruned = sqlx::query_file!("sql/work_prune.sql", retention.as_secs_f64(), batch)
            .execute(self.pool())
            .await?;
        Ok(pruned.rows_affected())
    }

    pub async fn backlog(
        &self,
        worker_flows: Option<&[String]>,
        horizon_seconds: f64,
    ) -> Result<Backlog, sqlx::Error> {
        let row = sqlx::query_file!("sql/work_retry.sql", worker_flows, horizon_seconds)
            .fetch_one(self.pool())
            .await?;
        Ok(Backlog {
            db_now: row.db_now,
            pending: row.pending,
            claimable: row.claimable,
            retry_at: row.retry_at,
            next_not_before: row.next_not_before,
        })
    }
}

/// Locks up to `limit` claimable items of `lane`, most urgent first: those
/// without a `spend` (`without_spend`: a lane of one quota's slots), or all.
pub(super) async fn lock_candidates(
    db: &mut StoreTransaction,
    lane: &Lane<'_>,
    limit: i64,
    without_spend: bool,
) -> Result<Vec<Candidate>, sqlx::Error> {
    if limit < 1 {
        return Ok(Vec::new());
    }
    sqlx::query_file_as!(
        Candidate,
        "sql/work_candidates.sql",
        lane.flows,
        lane.worker_flows,
        lane.horizon_seconds,
        limit,
        without_spend
    )
    .fetch_all(db)
    .await
}

/// Locks up to `limit` claimable items of `lane` that carry a `spend`, most
/// urgent first, on the index of such items: most flows have none.
pub(super) async fn lock_candidates_with_spend(
    db: &mut StoreTransaction,
    lane: &Lane<'_>,
    limit: i64,
) -> Result<Vec<Candidate>, sqlx::Error> {
    if limit < 1 {
        return Ok(Vec::new());
    }
    sqlx::query_file_as!(
        Candidate,
        "sql/work_candidates_with_spend.sql",
        lane.flows,
        lane.worker_flows,
        lane.horizon_seconds,
        limit
    )
    .fetch_all(db)
    .await
}

/// Locks up to `limit` due items and up to `limit` items of flows nobody
/// throttles (count mode or unknown, by the flow table), and says which of
/// `enforced` have work: one statement.
pub(super) async fn first_look(
    db: &mut StoreTransaction,
    worker_flows: Option<&[String]>,
    horizon_seconds: f64,
    limit: i64,
    enforced: &[String],
) -> Result<FirstLook, sqlx::Error> {
    let rows = sqlx::query_file!(
        "sql/work_first_look.sql",
        worker_flows,
        horizon_seconds,
        limit,
        enforced
    )
    .fetch_all(db)
    .await?;
    let mut look = FirstLook::default();
    for row in rows {
        let candidate = |id, priority| Candidate {
            id,
            flow: row.flow.clone(),
            deadline: row.deadline,
            priority,
            reference: row.reference.clone(),
            spend: row.spend.clone(),
        };
        match (row.lane.as_str(), row.id, row.priority) {
            ("due", Some(id), Some(priority)) => look.due.push(candidate(id, priority)),
            ("unthrottled", Some(id), Some(priority)) => {
                look.unthrottled.push(candidate(id, priority))
            }
            _ => look.busy.push(row.flow),
        }
    }
    Ok(look)
}

/// Leases the locked items `ids`, each to its worker for its lease, with its
/// outcome and the in-flight place lease it holds (if any).
pub(super) async fn lease<'e>(
    db: impl PgExecutor<'e>,
    ids: &[i64],
    workers: &[String],
    lease_seconds: &[f64],
    outcomes: &[String],
    place_leases: &[Option<i64>],
) -> Result<Vec<WorkItem>, sqlx::Error> {
    sqlx::query_file_as!(
        WorkItem,
        "sql/work_claim.sql",
        ids,
        workers,
        lease_seconds,
        outcomes,
        place_leases as &[Option<i64>]
    )
    .fetch_all(db)
    .await
}

/// Locks up to `n` free in-flight places of `quota` for a claim.
pub(super) async fn lock_free_places(
    db: &mut StoreTransaction,
    quota: &str,
    n: i64,
) -> Result<Vec<i32>, sqlx::Error> {
    sqlx::query_file_scalar!("sql/claim_free_places.sql", quota, n)
        .fetch_all(db)
        .await
}

/// An in-flight place leased to a claimed item.
#[derive(Clone, Copy, Debug)]
pub struct PlaceLease {
    pub place: i32,
    pub lease_id: i64,
    pub valid_until: DateTime<Utc>,
}

/// Leases the locked `places` of `quota`, one to each of `flows`.
pub(super) async fn lease_places(
    db: &mut StoreTransaction,
    quota: &str,
    places: &[i32],
    flows: &[String],
) -> Result<Vec<PlaceLease>, sqlx::Error> {
    sqlx::query_file_as!(
        PlaceLease,
        "sql/claim_lease_places.sql",
        quota,
        places,
        flows
    )
    .fetch_all(db)
    .await
}
