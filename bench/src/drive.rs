//! Concurrent callers against the service, and what one arm measured.

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::cpu::CpuSpent;
use crate::http;

/// What one arm measured.
#[derive(Clone, Debug)]
pub struct Arm {
    pub name: String,
    /// Answers per second over the arm's wall-clock time.
    pub per_second: f64,
    pub p50_ms: Option<f64>,
    pub p99_ms: Option<f64>,
    /// How the answers were distributed (`granted`, `deferred in_flight`, …).
    pub answers: Vec<(String, usize)>,
    /// Measured through the service (the targets' p99 bound applies), not a
    /// baseline on the database alone.
    pub through_service: bool,
    /// CPU time the arm cost the service and the database.
    pub cpu: CpuSpent,
}

impl Arm {
    /// An arm's rate with the percentiles of its latencies.
    pub fn measured(
        name: &str,
        per_second: f64,
        mut latencies: Vec<Duration>,
        answers: Vec<(String, usize)>,
        through_service: bool,
    ) -> Self {
        latencies.sort_unstable();
        Self {
            name: name.to_string(),
            per_second,
            p50_ms: percentile_ms(&latencies, 0.50),
            p99_ms: percentile_ms(&latencies, 0.99),
            answers,
            through_service,
            cpu: CpuSpent::default(),
        }
    }

    /// How many answers started with `prefix` ("deferred" counts every limit).
    pub fn count(&self, prefix: &str) -> usize {
        let answers = self.answers.iter();
        answers
            .filter(|(a, _)| a.starts_with(prefix))
            .map(|(_, n)| n)
            .sum()
    }

    /// The share (0 to 1) of the answers that started with `prefix`; 0
    /// without answers.
    pub fn share_of(&self, prefix: &str) -> f64 {
        match self.count("") {
            0 => 0.0,
            total => self.count(prefix) as f64 / total as f64,
        }
    }

    /// The time the arm took, from its rate.
    pub fn seconds(&self) -> f64 {
        self.count("") as f64 / self.per_second
    }

    /// CPU microseconds per answer, of `seconds` spent over the whole arm.
    pub fn cpu_per_answer_us(&self, seconds: Option<f64>) -> Option<f64> {
        let total = self.count("");
        (total > 0).then_some(seconds? * 1e6 / total as f64)
    }

    /// The rate the arm would reach with every core busy at the CPU per
    /// answer it measured: its rate divided by the share of core time used.
    /// An estimate, not a bound: a busier replica may decide in larger groups.
    pub fn busy_cores_rate(&self) -> Option<f64> {
        let busy = 1.0 - self.cpu.idle_share?;
        (busy > 0.0).then(|| self.per_second / busy)
    }

    /// The answers as shares of the total: "granted 100%", or
    /// "granted 41%, deferred in_flight 59%".
    pub fn answer_shares(&self) -> String {
        let total = self.count("");
        if total == 0 {
            return String::new();
        }
        self.answers
            .iter()
            .map(|(answer, n)| {
                let share = 100.0 * *n as f64 / total as f64;
                if share > 0.0 && share < 1.0 {
                    format!("{answer} <1%")
                } else {
                    format!("{answer} {share:.0}%")
                }
            })
            .collect::<Vec<_>>()
            .join(", ")
    }
}

/// Which caller makes a call, and the how-manyth call of the arm it is.
#[derive(Clone, Copy, Debug)]
pub struct Call {
    pub caller: usize,
    pub n: usize,
}

/// When the callers of an arm stop.
#[derive(Clone, Copy, Debug)]
pub enum Stop {
    /// When the run's duration is up.
    Elapsed,
    /// After this many calls in all.
    AfterCalls(usize),
}

/// The service under load and how hard every arm of the run drives it.
#[derive(Clone)]
pub struct Load {
    /// A connection per caller (`Call::caller`).
    pub client: Arc<http::Client>,
    pub concurrency: usize,
    pub duration: Duration,
}

impl Load {
    /// Runs `call` from `concurrency` callers, each calling again as soon as
    /// it has its answer, until `stop`. A call answers what to count it as,
    /// or `None` to stop its caller without counting it (a drained queue).
    pub async fn drive<F, Fut>(&self, name: &str, stop: Stop, call: F) -> anyhow::Result<Arm>
    where
        F: Fn(Call) -> Fut + Clone + Send + 'static,
        Fut: Future<Output = anyhow::Result<Option<&'static str>>> + Send,
    {
        let next = Arc::new(AtomicUsize::new(0));
        let started = Instant::now();
        let until = started + self.duration;
        let callers: Vec<_> = (0..self.concurrency)
            .map(|caller| {
                let (call, next) = (call.clone(), next.clone());
                tokio::spawn(async move {
                    let mut latencies = Vec::new();
                    let mut answers = BTreeMap::<&'static str, usize>::new();
                    loop {
                        let n = next.fetch_add(1, Ordering::Relaxed);
                        let stopped = match stop {
                            Stop::Elapsed => Instant::now() >= until,
                            Stop::AfterCalls(calls) => n >= calls,
                        };
                        if stopped {
                            break;
                        }
                        let asked = Instant::now();
                        let Some(answer) = call(Call { caller, n }).await? else {
                            break;
                        };
                        latencies.push(asked.elapsed());
                        *answers.entry(answer).or_default() += 1;
                    }
                    anyhow::Ok((latencies, answers))
                })
            })
            .collect();
        let mut latencies = Vec::new();
        let mut answers = BTreeMap::<&'static str, usize>::new();
        for caller in callers {
            let (own_latencies, own_answers) = caller.await??;
            latencies.extend(own_latencies);
            for (answer, n) in own_answers {
                *answers.entry(answer).or_default() += n;
            }
        }
        // The last calls end after `until`: the rate is over the time actually spent.
        let per_second = latencies.len() as f64 / started.elapsed().as_secs_f64();
        let answers = answers
            .into_iter()
            .map(|(answer, n)| (answer.to_string(), n))
            .collect();
        Ok(Arm::measured(name, per_second, latencies, answers, true))
    }
}

/// The nearest-rank percentile `p` (0..=1) of `sorted`, in milliseconds.
pub fn percentile_ms(sorted: &[Duration], p: f64) -> Option<f64> {
    let last = sorted.len().checked_sub(1)?;
    let index = ((last as f64) * p).round() as usize;
    Some(sorted[index].as_secs_f64() * 1000.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn millis(values: impl IntoIterator<Item = u64>) -> Vec<Duration> {
        values.into_iter().map(Duration::from_millis).collect()
    }

    #[test]
    fn percentiles_pick_the_nearest_rank() {
        let sorted = millis(1..=100);
        assert_eq!(percentile_ms(&sorted, 0.50), Some(51.0));
        assert_eq!(percentile_ms(&sorted, 0.99), Some(99.0));
        assert_eq!(percentile_ms(&millis([7]), 0.99), Some(7.0));
        assert_eq!(percentile_ms(&[], 0.5), None);
    }

    #[test]
    fn latencies_are_sorted_before_percentiles() {
        let arm = Arm::measured("x", 1.0, millis([30, 10, 20]), Vec::new(), true);
        assert_eq!((arm.p50_ms, arm.p99_ms), (Some(20.0), Some(30.0)));
    }

    #[test]
    fn a_busy_cores_rate_scales_the_rate_by_the_busy_share() {
        let mut arm = Arm::measured("x", 3000.0, Vec::new(), Vec::new(), true);
        assert_eq!(arm.busy_cores_rate(), None, "idle time not measured");
        arm.cpu.idle_share = Some(0.25);
        assert_eq!(arm.busy_cores_rate(), Some(4000.0));
        arm.cpu.idle_share = Some(1.0);
        assert_eq!(arm.busy_cores_rate(), None, "nothing ran");
    }

    #[test]
    fn cpu_time_is_shared_over_every_answer() {
        let answers = vec![
            ("granted".to_string(), 3000),
            ("deferred".to_string(), 1000),
        ];
        let arm = Arm::measured("x", 1.0, Vec::new(), answers, true);
        assert_eq!(arm.cpu_per_answer_us(Some(2.0)), Some(500.0));
        assert_eq!(arm.cpu_per_answer_us(None), None);
        let silent = Arm::measured("x", 0.0, Vec::new(), Vec::new(), true);
        assert_eq!(silent.cpu_per_answer_us(Some(2.0)), None);
    }

    #[test]
    fn answers_are_counted_by_prefix() {
        let answers = vec![
            ("deferred budget".to_string(), 2),
            ("deferred cadence".to_string(), 3),
            ("granted".to_string(), 5),
        ];
        let arm = Arm::measured("x", 4.0, Vec::new(), answers, true);
        assert_eq!((arm.count("deferred"), arm.count("granted")), (5, 5));
        assert_eq!((arm.count(""), arm.count("bypassed")), (10, 0));
        assert_eq!(arm.seconds(), 2.5);
    }

    #[test]
    fn answers_are_shown_as_shares() {
        let answers = vec![
            ("deferred in_flight".to_string(), 3),
            ("granted".to_string(), 1),
        ];
        let arm = Arm::measured("x", 1.0, Vec::new(), answers, true);
        assert_eq!(arm.answer_shares(), "deferred in_flight 75%, granted 25%");
        let rare = vec![("granted".to_string(), 999), ("deferred".to_string(), 1)];
        let arm = Arm::measured("x", 1.0, Vec::new(), rare, true);
        assert_eq!(arm.answer_shares(), "granted 100%, deferred <1%");
    }
}
