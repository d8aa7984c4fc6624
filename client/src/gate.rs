//! What every client of a process shares: one cooldown gate per arbiter and
//! the local pacing bucket.
//!
//! The gates live in a process-wide registry keyed by the arbiter's URL, not in
//! a `Client`: clones of a client, and clients built apart (one per job, one per
//! library in the same worker), all see the same cooldown, so a process that
//! learned "come back in 30 s" does not send its other calls into the wall
//! meanwhile. Keyed by URL because a `Retry-After` is one arbiter's word about
//! itself; a process talks to one arbiter in practice.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use reqwest::Url;
use tokio::time::{sleep_until, Instant};

use crate::settings::Pacing;

/// Slower than this is no pacing, a typo: one request per 1000 s at least.
pub const MIN_RATE: f64 = 0.001;

/// What the clients of one arbiter share within the process.
#[derive(Default)]
pub struct Gates {
    cooldown: Cooldown,
    pacers: Mutex<Vec<(Pacing, Arc<Pacer>)>>,
}

/// The gates of the arbiter at `url`, created on first use.
pub fn for_arbiter(url: &Url) -> Arc<Gates> {
    static ARBITERS: OnceLock<Mutex<HashMap<String, Arc<Gates>>>> = OnceLock::new();
    let mut arbiters = lock(ARBITERS.get_or_init(Default::default));
    arbiters
        .entry(url.as_str().to_string())
        .or_default()
        .clone()
}

impl Gates {
    pub fn cooldown(&self) -> &Cooldown {
        &self.cooldown
    }

    /// The pacing bucket shared by the process's clients with this pacing.
    pub fn pacer(&self, pacing: Pacing) -> Arc<Pacer> {
        let mut pacers = lock(&self.pacers);
        if let Some((_, pacer)) = pacers.iter().find(|(p, _)| *p == pacing) {
            return pacer.clone();
        }
        let pacer = Arc::new(Pacer::new(pacing));
        pacers.push((pacing, pacer.clone()));
        pacer
    }
}

/// Closed until the latest `Retry-After` a call learned has passed.
#[derive(Default)]
pub struct Cooldown {
    until: Mutex<Option<Instant>>,
}

impl Cooldown {
    /// Keeps the gate closed for at least `wait` from now (never shortens it).
    pub fn close_for(&self, wait: Duration) {
        let until = Instant::now() + wait;
        let mut current = lock(&self.until);
        *current = Some(current.map_or(until, |t| t.max(until)));
    }

    /// Waits until the gate is open; a later `close_for` during the wait
    /// extends it.
    pub async fn pass(&self) {
        loop {
            let until = *lock(&self.until);
            match until {
                Some(until) if until > Instant::now() => sleep_until(until).await,
                _ => return,
            }
        }
    }
}

/// A token bucket as a schedule (GCRA): `burst` requests at once, then one per
/// `1/rate`. A take whose wait is cancelled still spends its token: the
/// process runs slower for it, never faster.
pub struct Pacer {
    interval: Duration,
    tolerance: Duration,
    /// When the bucket would be empty had every take gone at once.
    next: Mutex<Option<Instant>>,
}

impl Pacer {
    fn new(pacing: Pacing) -> Self {
        let interval = Duration::from_secs_f64(1.0 / pacing.rate.max(MIN_RATE));
        Self {
            interval,
            tolerance: interval.saturating_mul(pacing.burst.max(1) - 1),
            next: Mutex::new(None),
        }
    }

    pub async fn take(&self) {
        let now = Instant::now();
        let allowed = {
            let mut next = lock(&self.next);
            let start = next.map_or(now, |t| t.max(now));
            *next = Some(start + self.interval);
            start.checked_sub(self.tolerance).unwrap_or(now)
        };
        if allowed > now {
            sleep_until(allowed).await;
        }
    }
}

/// A poisoned lock only means another thread panicked while holding one of
/// these plain values, which stay consistent: keep going.
pub(crate) fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn the_pacer_lets_a_burst_through_then_one_per_interval() {
        let pacer = Pacer::new(Pacing {
            rate: 2.0,
            burst: 3,
        });
        let start = Instant::now();
        let mut at = Vec::new();
        for _ in 0..6 {
            pacer.take().await;
            at.push((Instant::now() - start).as_millis());
        }
        assert_eq!(at, [0, 0, 0, 500, 1000, 1500]);
        // Idle for a while refills the burst, never more.
        tokio::time::sleep(Duration::from_secs(60)).await;
        let start = Instant::now();
        let mut at = Vec::new();
        for _ in 0..4 {
            pacer.take().await;
            at.push((Instant::now() - start).as_millis());
        }
        assert_eq!(at, [0, 0, 0, 500]);
    }

    #[tokio::test(start_paused = true)]
    async fn the_cooldown_holds_until_its_latest_closing() {
        let cooldown = Cooldown::default();
        let start = Instant::now();
        cooldown.pass().await;
        assert_eq!(Instant::now(), start);
        cooldown.close_for(Duration::from_secs(5));
        cooldown.close_for(Duration::from_secs(2));
        cooldown.pass().await;
        assert_eq!(Instant::now() - start, Duration::from_secs(5));
    }

    #[test]
    fn clients_of_one_arbiter_share_its_gates_and_pacing() {
        let a = Url::parse("http://127.9.0.1:1/").unwrap();
        let b = Url::parse("http://127.9.0.2:1/").unwrap();
        assert!(Arc::ptr_eq(&for_arbiter(&a), &for_arbiter(&a)));
        assert!(!Arc::ptr_eq(&for_arbiter(&a), &for_arbiter(&b)));
        let pacing = Pacing {
            rate: 1.0,
            burst: 1,
        };
        let gates = for_arbiter(&a);
        assert!(Arc::ptr_eq(&gates.pacer(pacing), &gates.pacer(pacing)));
        let other = Pacing {
            rate: 2.0,
            burst: 1,
        };
        assert!(!Arc::ptr_eq(&gates.pacer(pacing), &gates.pacer(other)));
    }
}
