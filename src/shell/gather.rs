//! Gathering concurrent requests into groups (design.md §8): every request
//! for one key (a quota, a route class) joins that key's queue; the first
//! arrival on an empty queue becomes its leader and decides the queue group
//! after group (one statement each) until nobody waits. Requests that arrive
//! while a group's statement runs form the next group, so the group size
//! follows the load with no timer and a lone request waits for nobody.

use std::collections::HashMap;
use std::future::Future;
use std::hash::Hash;
use std::sync::{Arc, Mutex};

use tokio::sync::oneshot;

use crate::store::StoreError;

/// Where a group's leader sends one waiter its answer.
pub(crate) type Reply<T> = oneshot::Sender<Result<T, StoreError>>;

/// A group whose statement failed: every waiter still waiting hears why.
pub(crate) fn fail_all<T>(replies: impl IntoIterator<Item = Reply<T>>, error: &StoreError) {
    for reply in replies {
        let _ = reply.send(Err(error.clone()));
    }
}

/// Queues by key. `S` is what the latest arrival knew of its key (the
/// catalog's rule at the time): a group is decided by it. `W` is a waiter.
pub(crate) struct Gather<K, S, W> {
    queues: Arc<Mutex<HashMap<K, Queue<S, W>>>>,
}

struct Queue<S, W> {
    latest: S,
    waiters: Vec<W>,
}

impl<K, S, W> Clone for Gather<K, S, W> {
    fn clone(&self) -> Self {
        Self {
            queues: self.queues.clone(),
        }
    }
}

impl<K, S, W> Default for Gather<K, S, W> {
    fn default() -> Self {
        Self {
            queues: Arc::default(),
        }
    }
}

impl<K: Hash + Eq, S, W> Gather<K, S, W> {
    /// Joins `key`'s queue with the waiter `waiter(reply)` and gives the
    /// answer its group's leader sends to `reply`. The first arrival on an
    /// empty queue starts `lead(key)`, as a task of its own: a caller that
    /// gives up must not stop the group it leads. A leader that drops a reply
    /// unanswered is a failure. The join happens now; the answer owns
    /// nothing of `self`, so it may be awaited anywhere (detached).
    pub(crate) fn ask<T, F>(
        &self,
        key: K,
        latest: S,
        waiter: impl FnOnce(Reply<T>) -> W,
        lead: impl FnOnce(K) -> F,
    ) -> impl Future<Output = Result<T, StoreError>> + Send + 'static
    where
        K: Clone,
        T: Send + 'static,
        F: Future<Output = ()> + Send + 'static,
    {
        let (reply, answer) = oneshot::channel();
        if self.join(key.clone(), latest, waiter(reply)) {
            tokio::spawn(lead(key));
        }
        async move {
            answer.await.unwrap_or_else(|_| {
                let stopped = "the group's leader stopped before answering";
                Err(StoreError::Failed(stopped.into()))
            })
        }
    }

    /// Adds `waiter` to `key`'s queue. `true`: the queue was empty and the
    /// caller must start its leader.
    #[must_use = "the first arrival must start the queue's leader"]
    fn join(&self, key: K, latest: S, waiter: W) -> bool {
        let mut queues = self.queues.lock().unwrap_or_else(|p| p.into_inner());
        match queues.get_mut(&key) {
            Some(queue) => {
                queue.latest = latest;
                queue.waiters.push(waiter);
                false
            }
            None => {
                let waiters = vec![waiter];
                queues.insert(key, Queue { latest, waiters });
                true
            }
        }
    }

    /// The leader's next group: every waiter that joined since the last one,
    /// with what the latest of them knew. `None` when nobody waits: the
    /// queue is gone, and the next arrival leads a new one.
    pub(crate) fn next_group(&self, key: &K) -> Option<(S, Vec<W>)>
    where
        S: Clone,
    {
        let mut queues = self.queues.lock().unwrap_or_else(|p| p.into_inner());
        let queue = queues.get_mut(key)?;
        if queue.waiters.is_empty() {
            queues.remove(key);
            return None;
        }
        Some((queue.latest.clone(), std::mem::take(&mut queue.waiters)))
    }
}

/// One queue whose every group one call answers, an answer per ask in
/// the order asked (the releases of places, the upstream reports): a
/// statement per group instead of one per ask.
pub(crate) struct Batched<A, T> {
    queue: Gather<(), (), (A, Reply<T>)>,
}

impl<A, T> Clone for Batched<A, T> {
    fn clone(&self) -> Self {
        Self {
            queue: self.queue.clone(),
        }
    }
}

impl<A, T> Default for Batched<A, T> {
    fn default() -> Self {
        Self {
            queue: Gather::default(),
        }
    }
}

impl<A: Send + 'static, T: Send + 'static> Batched<A, T> {
    /// Joins the queue with `ask`; its group is answered by `answer` (the
    /// first arrival's, for every group its leader decides), which must give
    /// one answer per ask, in order.
    pub(crate) fn ask<F, Fut>(
        &self,
        ask: A,
        answer: F,
    ) -> impl Future<Output = Result<T, StoreError>> + Send + 'static
    where
        F: Fn(Vec<A>) -> Fut + Send + 'static,
        Fut: Future<Output = Result<Vec<T>, StoreError>> + Send,
    {
        let queue = self.queue.clone();
        let lead = move |key: ()| async move {
            while let Some(((), group)) = queue.next_group(&key) {
                let (asks, replies): (Vec<A>, Vec<Reply<T>>) = group.into_iter().unzip();
                match answer(asks).await {
                    Ok(answers) if answers.len() == replies.len() => {
                        for (reply, answer) in replies.into_iter().zip(answers) {
                            let _ = reply.send(Ok(answer));
                        }
                    }
                    Ok(_) => {
                        let error =
                            StoreError::Failed("a group's answers do not match its asks".into());
                        fail_all(replies, &error);
                    }
                    Err(error) => fail_all(replies, &error),
                }
            }
        };
        self.queue.ask((), (), |reply| (ask, reply), lead)
    }
}

/// Answers `asks` a round of distinct keys at a time (`rounds_of_distinct`),
/// each round by one call of `answer`, so that a repeat comes after what it
/// repeats, as it would alone; the answers in the order asked.
pub(crate) async fn in_rounds<A, K, T, F, Fut>(
    asks: &[A],
    key: impl Fn(&A) -> K,
    answer: F,
) -> Result<Vec<T>, StoreError>
where
    A: Clone,
    K: Hash + Eq,
    F: Fn(Vec<A>) -> Fut,
    Fut: Future<Output = Result<Vec<T>, StoreError>>,
{
    let mut answers: Vec<Option<T>> = asks.iter().map(|_| None).collect();
    for round in rounds_of_distinct(asks, key) {
        let round_asks: Vec<A> = round.iter().map(|&i| asks[i].clone()).collect();
        let answered = answer(round_asks).await?;
        if answered.len() != round.len() {
            return Err(StoreError::Failed(
                "a round's answers do not match its asks".into(),
            ));
        }
        for (i, one) in round.into_iter().zip(answered) {
            answers[i] = Some(one);
        }
    }
    Ok(answers.into_iter().flatten().collect())
}

/// The positions of `asks` in rounds whose keys are distinct: the first ask
/// of each key in the first round, the second in the second, …, each round
/// in arrival order.
pub(crate) fn rounds_of_distinct<A, K: std::hash::Hash + Eq>(
    asks: &[A],
    key: impl Fn(&A) -> K,
) -> Vec<Vec<usize>> {
    let mut seen: HashMap<K, usize> = HashMap::new();
    let mut rounds: Vec<Vec<usize>> = Vec::new();
    for (i, ask) in asks.iter().enumerate() {
        let round = seen.entry(key(ask)).or_insert(0);
        if rounds.len() <= *round {
            rounds.push(Vec::new());
        }
        rounds[*round].push(i);
        *round += 1;
    }
    rounds
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn repeats_go_to_later_rounds_in_arrival_order() {
        let ids = [4, 5, 4, 6, 4, 5];
        assert_eq!(
            rounds_of_distinct(&ids, |id| *id),
            [vec![0, 1, 3], vec![2, 5], vec![4]]
        );
        assert!(rounds_of_distinct(&[] as &[i64], |id| *id).is_empty());
    }

    #[test]
    fn the_first_arrival_leads_and_later_ones_join_its_group() {
        let gather = Gather::<&str, u32, char>::default();
        assert!(gather.join("q", 1, 'a'));
        assert!(!gather.join("q", 2, 'b'));
        assert!(gather.join("other", 7, 'x'), "each key has its own leader");
        assert_eq!(gather.next_group(&"q"), Some((2, vec!['a', 'b'])));
        assert!(!gather.join("q", 3, 'c'), "a leader is still deciding");
        assert_eq!(gather.next_group(&"q"), Some((3, vec!['c'])));
        assert_eq!(gather.next_group(&"q"), None);
        assert!(
            gather.join("q", 4, 'd'),
            "an emptied queue gets a new leader"
        );
        assert_eq!(gather.next_group(&"other"), Some((7, vec!['x'])));
    }

    /// The leader runs on a clone: it must see the queues callers join.
    #[test]
    fn clones_share_the_queues() {
        let gather = Gather::<&str, u32, char>::default();
        let leader = gather.clone();
        assert!(gather.join("q", 1, 'a'));
        assert!(!leader.join("q", 2, 'b'));
        assert_eq!(leader.next_group(&"q"), Some((2, vec!['a', 'b'])));
    }

    /// A leader that answers each waiter of a group with what the group's
    /// latest arrival knew, counting how often it was started.
    fn leader(
        gather: &Gather<&'static str, u32, Reply<u32>>,
        started: &Arc<Mutex<u32>>,
    ) -> impl FnOnce(&'static str) -> std::pin::Pin<Box<dyn Future<Output = ()> + Send>> {
        let (gather, started) = (gather.clone(), started.clone());
        move |key| {
            *started.lock().unwrap() += 1;
            Box::pin(async move {
                while let Some((latest, group)) = gather.next_group(&key) {
                    for reply in group {
                        let _ = reply.send(Ok(latest));
                    }
                }
            })
        }
    }

    #[tokio::test]
    async fn the_first_asker_starts_the_leader_and_every_asker_hears_its_group() {
        let gather = Gather::<&str, u32, Reply<u32>>::default();
        let started = Arc::new(Mutex::new(0));
        let a = gather.ask("q", 1, |r| r, leader(&gather, &started));
        let b = gather.ask("q", 2, |r| r, leader(&gather, &started));
        assert_eq!((a.await.unwrap(), b.await.unwrap()), (2, 2));
        assert_eq!(*started.lock().unwrap(), 1, "one leader for the group");
        let c = gather.ask("q", 3, |r| r, leader(&gather, &started));
        assert_eq!(c.await.unwrap(), 3);
        assert_eq!(
            *started.lock().unwrap(),
            2,
            "an emptied queue, a new leader"
        );
    }

    #[tokio::test]
    async fn a_reply_the_leader_drops_is_a_failure() {
        let gather = Gather::<&str, u32, Reply<u32>>::default();
        let dropping = gather.clone();
        let lead = move |key| async move { while dropping.next_group(&key).is_some() {} };
        let answer = gather.ask("q", 1, |r| r, lead).await;
        assert!(matches!(answer, Err(StoreError::Failed(_))), "{answer:?}");
    }

    #[test]
    fn every_waiter_of_a_failed_group_hears_the_failure() {
        let (replies, mut answers): (Vec<Reply<u32>>, Vec<_>) =
            (0..3).map(|_| oneshot::channel()).unzip();
        fail_all(replies, &StoreError::Failed("the statement".into()));
        for answer in &mut answers {
            let heard = answer.try_recv().expect("an answer");
            assert!(matches!(heard, Err(StoreError::Failed(_))), "{heard:?}");
        }
    }

    #[test]
    fn no_group_for_a_key_nobody_asked_for() {
        let gather = Gather::<&str, u32, char>::default();
        assert_eq!(gather.next_group(&"q"), None);
    }
}
