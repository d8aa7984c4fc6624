//! One table for the run: a line per arm, then the ratios the issue sets as
//! targets, each with its bound and PASS or MISS.

use crate::drive::Arm;
use crate::server::ResidentMemory;

/// Everything one run measured. Baselines are missing with --no-pgbench,
/// the work arms with --no-claims.
pub struct Measured {
    pub healthz: Arm,
    pub enforce: Arm,
    /// The enforce arm's flow through a second service behind PgBouncer in
    /// transaction pooling; `None` when not run.
    pub pooled: Option<Arm>,
    /// The enforce arm on a quota of three windows (1m, 1h, 1d).
    pub stacked: Arm,
    /// The enforce arm on a flow that spends two quotas in each call (an
    /// LLM's requests, 1m and 1d, and tokens, 1m).
    pub two_quotas: Arm,
    pub observe: Arm,
    pub cadence: Arm,
    pub in_flight: Arm,
    /// Whole worker cycles: reserve, hold a place, release it.
    pub release_cycles: Arm,
    /// Whole worker cycles: reserve, report an upstream 429.
    pub report_storm: Arm,
    /// Batches of budget-only items on one quota: each answer is a batch.
    pub batch: Arm,
    pub many_quotas: Arm,
    /// The many-quotas arm on paced quotas (a cadence that never refuses).
    pub many_paced: Arm,
    pub admit_hot: Arm,
    pub admit_spread: Arm,
    pub enqueue: Option<Arm>,
    pub claims: Option<Arm>,
    /// Whole worker cycles: enqueue, claim, done.
    pub claim_done: Option<Arm>,
    pub bare_hot: Option<Arm>,
    pub bare_spread: Option<Arm>,
    pub raw_claim: Option<Arm>,
    pub memory: ResidentMemory,
    /// How many quotas the many-quotas arm spreads over.
    pub quotas: usize,
}

impl Measured {
    /// In the order they ran: each baseline next to the arm it is compared with.
    pub fn arms(&self) -> Vec<&Arm> {
        [
            Some(&self.healthz),
            self.bare_hot.as_ref(),
            Some(&self.enforce),
            self.pooled.as_ref(),
            Some(&self.stacked),
            Some(&self.two_quotas),
            Some(&self.observe),
            Some(&self.cadence),
            Some(&self.in_flight),
            Some(&self.release_cycles),
            Some(&self.report_storm),
            Some(&self.batch),
            self.bare_spread.as_ref(),
            Some(&self.many_quotas),
            Some(&self.many_paced),
            Some(&self.admit_hot),
            Some(&self.admit_spread),
            self.raw_claim.as_ref(),
            self.enqueue.as_ref(),
            self.claims.as_ref(),
            self.claim_done.as_ref(),
        ]
        .into_iter()
        .flatten()
        .collect()
    }

    pub fn targets(&self) -> Vec<Target> {
        let rate = |arm: &Arm, baseline: Option<&Arm>| {
            baseline.map(|baseline| arm.per_second / baseline.per_second)
        };
        let bare = self.bare_hot.as_ref();
        let quotas = self.quotas;
        let mut targets = vec![
            Target::times(
                "budget enforce / bare upsert, hot row",
                rate(&self.enforce, bare),
                25.0,
            ),
            Target {
                what: "budget enforce / GET /healthz".into(),
                measured: rate(&self.enforce, Some(&self.healthz)).map(|r| r * 100.0),
                bound: Bound::AtLeast(70.0),
                unit: Unit::Percent,
            },
            Target {
                what: "three windows / one window, enforce".into(),
                measured: rate(&self.stacked, Some(&self.enforce)).map(|r| r * 100.0),
                bound: Bound::AtLeast(80.0),
                unit: Unit::Percent,
            },
            Target::times(
                "three windows / bare upsert, hot row",
                rate(&self.stacked, bare),
                10.0,
            ),
            Target::times(
                "two quotas per call / bare upsert, hot row",
                rate(&self.two_quotas, bare),
                10.0,
            ),
            Target::times(
                "cadence / bare upsert, hot row",
                rate(&self.cadence, bare),
                10.0,
            ),
            Target::times(
                "max_in_flight / bare upsert, hot row",
                rate(&self.in_flight, bare),
                10.0,
            ),
            Target::times(
                "granted release cycles / bare upsert, hot row",
                rate(&self.release_cycles, bare)
                    .map(|r| r * self.release_cycles.share_of("granted")),
                5.0,
            ),
            Target::times(
                "reserve + 429 report cycles / bare upsert, hot row",
                rate(&self.report_storm, bare),
                5.0,
            ),
        ];
        targets.push(Target::times(
            "admit, one hot caller / bare upsert, hot row",
            rate(&self.admit_hot, bare),
            10.0,
        ));
        targets.push(Target::times(
            &format!("{} / bare upsert, hot row", self.admit_spread.name),
            rate(&self.admit_spread, bare),
            10.0,
        ));
        if let Some(claims) = &self.claims {
            targets.push(Target::times(
                "claims / claim transaction",
                rate(claims, self.raw_claim.as_ref()),
                5.0,
            ));
        }
        if let Some(cycles) = &self.claim_done {
            targets.push(Target::times(
                "enqueue, claim, done cycles / bare upsert, hot row",
                rate(cycles, bare).map(|r| r * cycles.share_of("done")),
                2.0,
            ));
        }
        targets.push(Target::times(
            &format!("{quotas} quotas / bare upsert, {quotas} rows"),
            rate(&self.many_quotas, self.bare_spread.as_ref()),
            2.0,
        ));
        targets.push(Target::times(
            &format!("{quotas} paced quotas / bare upsert, {quotas} rows"),
            rate(&self.many_paced, self.bare_spread.as_ref()),
            2.0,
        ));
        let worst = self
            .slowest_decisions()
            .and_then(|arm| Some((arm.p99_ms?, &arm.name)));
        targets.push(Target {
            what: match worst {
                Some((_, name)) => format!("p99 of every decision arm (worst: {name})"),
                None => "p99 of every decision arm".into(),
            },
            measured: worst.map(|(p99, _)| p99),
            bound: Bound::AtMost(10.0),
            unit: Unit::Milliseconds,
        });
        targets.push(Target {
            what: "service resident memory after the run".into(),
            measured: Some(self.memory.now_kb as f64 * 1024.0 / 1e6),
            bound: Bound::AtMost(64.0),
            unit: Unit::Megabytes,
        });
        targets
    }

    /// What running behind PgBouncer in transaction pooling costs: the arm's
    /// rate and p99 beside the same flow's on PostgreSQL itself.
    pub fn pooled_share(&self) -> Option<String> {
        let pooled = self.pooled.as_ref()?;
        let p99 = |arm: &Arm| arm.p99_ms.map_or("n/a".into(), |p| format!("{p:.1} ms"));
        Some(format!(
            "behind PgBouncer (transaction pooling): {:.0}/s, {:.0} % of the same flow on PostgreSQL itself ({:.0}/s); p99 {} against {}",
            pooled.per_second,
            pooled.per_second / self.enforce.per_second * 100.0,
            self.enforce.per_second,
            p99(pooled),
            p99(&self.enforce),
        ))
    }

    /// The service arm with the worst p99 of a decision: not a batch's
    /// answer (it carries many decisions), a whole cycle's (several
    /// requests and an emission), a claim's (its p99 target is retired:
    /// design.md §8) or a baseline's (not the service).
    fn slowest_decisions(&self) -> Option<&Arm> {
        let not_a_decision = [
            Some(&self.batch),
            Some(&self.release_cycles),
            Some(&self.report_storm),
            self.claims.as_ref(),
            self.claim_done.as_ref(),
            self.enqueue.as_ref(),
            // The target is the service's on PostgreSQL itself; behind a
            // transaction pooler each statement takes three more round
            // trips, the deployment's choice (deployment.md).
            self.pooled.as_ref(),
        ];
        self.arms()
            .into_iter()
            .filter(|arm| arm.through_service)
            .filter(|arm| {
                !not_a_decision
                    .iter()
                    .flatten()
                    .any(|a| std::ptr::eq(*arm, *a))
            })
            .filter_map(|arm| Some((arm.p99_ms?, arm)))
            .max_by(|a, b| a.0.total_cmp(&b.0))
            .map(|(_, arm)| arm)
    }
}

#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Bound {
    AtLeast(f64),
    AtMost(f64),
}

#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Unit {
    Times,
    Percent,
    Milliseconds,
    Megabytes,
}

impl Unit {
    /// A measured value, to the precision that means something for it.
    fn show(self, value: f64) -> String {
        let decimals = match self {
            Unit::Times => 2,
            Unit::Percent => 0,
            Unit::Milliseconds | Unit::Megabytes => 1,
        };
        format!("{value:.decimals$}{}", self.suffix())
    }

    fn suffix(self) -> &'static str {
        match self {
            Unit::Times => "x",
            Unit::Percent => " %",
            Unit::Milliseconds => " ms",
            Unit::Megabytes => " MB",
        }
    }
}

/// One target: what is compared, what was measured (`None`: its baseline was
/// not run), and the bound it must keep.
#[derive(Clone, Debug)]
pub struct Target {
    pub what: String,
    pub measured: Option<f64>,
    pub bound: Bound,
    pub unit: Unit,
}

impl Target {
    fn times(what: &str, measured: Option<f64>, at_least: f64) -> Self {
        Self {
            what: what.to_string(),
            measured,
            bound: Bound::AtLeast(at_least),
            unit: Unit::Times,
        }
    }

    pub fn verdict(&self) -> &'static str {
        match (self.measured, self.bound) {
            (None, _) => "n/a",
            (Some(v), Bound::AtLeast(bound)) if v >= bound => "PASS",
            (Some(v), Bound::AtMost(bound)) if v <= bound => "PASS",
            (Some(_), _) => "MISS",
        }
    }

    fn bound_shown(&self) -> String {
        let (sign, bound) = match self.bound {
            Bound::AtLeast(bound) => (">=", bound),
            Bound::AtMost(bound) => ("<=", bound),
        };
        format!("{sign} {bound}{}", self.unit.suffix())
    }
}

const NAME_WIDTH: usize = 38;

pub fn print_arms(arms: &[&Arm]) {
    println!(
        "{:<NAME_WIDTH$} {:>11} {:>8} {:>8} {:>9} {:>9} {:>9} {:>6}  answers",
        "arm", "per second", "p50 ms", "p99 ms", "svc us/op", "db us/op", "cli us/op", "idle"
    );
    let ms = |v: Option<f64>| v.map_or_else(|| "-".to_string(), |v| format!("{v:.2}"));
    let us = |v: Option<f64>| v.map_or_else(|| "-".to_string(), |v| format!("{v:.0}"));
    for arm in arms {
        println!(
            "{:<NAME_WIDTH$} {:>11.0} {:>8} {:>8} {:>9} {:>9} {:>9} {:>6}  {}",
            arm.name,
            arm.per_second,
            ms(arm.p50_ms),
            ms(arm.p99_ms),
            us(arm.cpu_per_answer_us(arm.cpu.service_seconds)),
            us(arm.cpu_per_answer_us(arm.cpu.database_seconds)),
            us(arm.cpu_per_answer_us(arm.cpu.client_seconds)),
            percent(arm.cpu.idle_share),
            arm.answer_shares()
        );
    }
}

fn percent(share: Option<f64>) -> String {
    share.map_or_else(|| "-".to_string(), |s| format!("{:.0}%", s * 100.0))
}

/// What waiting alone cannot explain: the budget arm against the HTTP floor
/// if both kept every core busy at the CPU per answer they measured (rate
/// divided by the busy share), and the mean latency of the slowest arm's
/// `callers` at that rate (each asks again at once: callers / rate).
pub fn busy_cores_bounds(measured: &Measured, callers: usize) -> Vec<String> {
    let mut lines = Vec::new();
    let (budget, floor) = (&measured.enforce, &measured.healthz);
    if let (Some(budget_rate), Some(floor_rate)) =
        (budget.busy_cores_rate(), floor.busy_cores_rate())
    {
        lines.push(format!(
            "every core busy at the CPU per answer measured (rate / busy share): {} {budget_rate:.0}/s, \
             {} {floor_rate:.0}/s: {:.0} %",
            budget.name,
            floor.name,
            100.0 * budget_rate / floor_rate
        ));
    }
    let slowest = measured.slowest_decisions();
    if let Some((arm, rate)) = slowest.and_then(|arm| Some((arm, arm.busy_cores_rate()?))) {
        lines.push(format!(
            "{}, every core busy: {rate:.0}/s; {callers} callers would still wait {:.1} ms on average",
            arm.name,
            callers as f64 / rate * 1000.0
        ));
    }
    lines
}

pub fn print_targets(targets: &[Target]) {
    let width = targets.iter().map(|t| t.what.len()).max().unwrap_or(0);
    println!(
        "{:<width$} {:>10} {:>10}  verdict",
        "target", "measured", "bound"
    );
    for target in targets {
        let measured = target
            .measured
            .map_or_else(|| "-".to_string(), |v| target.unit.show(v));
        println!(
            "{:<width$} {:>10} {:>10}  {}",
            target.what,
            measured,
            target.bound_shown(),
            target.verdict()
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn arm(name: &str, per_second: f64, p99_ms: f64, through_service: bool) -> Arm {
        Arm {
            name: name.into(),
            per_second,
            p50_ms: Some(p99_ms / 2.0),
            p99_ms: Some(p99_ms),
            answers: Vec::new(),
            through_service,
            cpu: Default::default(),
        }
    }

    fn measured() -> Measured {
        Measured {
            healthz: arm("healthz", 40_000.0, 3.0, true),
            enforce: arm("enforce", 30_000.0, 4.0, true),
            pooled: Some(arm("pooled", 15_000.0, 900.0, true)),
            stacked: arm("stacked", 29_000.0, 4.0, true),
            two_quotas: arm("two quotas", 25_000.0, 4.0, true),
            observe: arm("observe", 29_000.0, 4.0, true),
            cadence: arm("cadence", 2_000.0, 65.0, true),
            in_flight: arm("in flight", 20_000.0, 9.0, true),
            release_cycles: Arm {
                answers: vec![("deferred in_flight".into(), 10), ("granted".into(), 90)],
                ..arm("release cycles", 12_000.0, 9.0, true)
            },
            report_storm: arm("storm", 8_000.0, 9.0, true),
            batch: arm("batches", 1_000.0, 900.0, true),
            many_quotas: arm("many", 32_000.0, 8.0, true),
            many_paced: arm("many paced", 24_000.0, 8.0, true),
            admit_hot: arm("admit hot", 24_000.0, 5.0, true),
            admit_spread: arm("admit, 10000 callers", 16_000.0, 7.0, true),
            enqueue: None,
            claims: Some(arm("claims", 300.0, 500.0, true)),
            claim_done: Some(Arm {
                answers: vec![("done".into(), 3), ("empty".into(), 1)],
                ..arm("enqueue, claim, done", 6_000.0, 600.0, true)
            }),
            bare_hot: Some(arm("bare hot", 2_000.0, 90.0, false)),
            bare_spread: Some(arm("bare spread", 16_000.0, 200.0, false)),
            raw_claim: None,
            memory: ResidentMemory {
                now_kb: 30_000,
                peak_kb: 31_000,
            },
            quotas: 1000,
        }
    }

    fn verdicts(measured: &Measured) -> Vec<(String, Option<f64>, &'static str)> {
        measured
            .targets()
            .into_iter()
            .map(|t| {
                let verdict = t.verdict();
                (
                    t.what,
                    t.measured.map(|v| (v * 100.0).round() / 100.0),
                    verdict,
                )
            })
            .collect()
    }

    #[test]
    fn each_target_compares_its_arms_with_its_bound() {
        let shown = verdicts(&measured());
        let expected = [
            ("budget enforce / bare upsert, hot row", Some(15.0), "MISS"),
            ("budget enforce / GET /healthz", Some(75.0), "PASS"),
            ("three windows / one window, enforce", Some(96.67), "PASS"),
            ("three windows / bare upsert, hot row", Some(14.5), "PASS"),
            (
                "two quotas per call / bare upsert, hot row",
                Some(12.5),
                "PASS",
            ),
            ("cadence / bare upsert, hot row", Some(1.0), "MISS"),
            ("max_in_flight / bare upsert, hot row", Some(10.0), "PASS"),
            (
                "granted release cycles / bare upsert, hot row",
                Some(5.4),
                "PASS",
            ),
            (
                "reserve + 429 report cycles / bare upsert, hot row",
                Some(4.0),
                "MISS",
            ),
            (
                "admit, one hot caller / bare upsert, hot row",
                Some(12.0),
                "PASS",
            ),
            (
                "admit, 10000 callers / bare upsert, hot row",
                Some(8.0),
                "MISS",
            ),
            ("claims / claim transaction", None, "n/a"),
            (
                "enqueue, claim, done cycles / bare upsert, hot row",
                Some(2.25),
                "PASS",
            ),
            ("1000 quotas / bare upsert, 1000 rows", Some(2.0), "PASS"),
            (
                "1000 paced quotas / bare upsert, 1000 rows",
                Some(1.5),
                "MISS",
            ),
            (
                "p99 of every decision arm (worst: cadence)",
                Some(65.0),
                "MISS",
            ),
            ("service resident memory after the run", Some(30.72), "PASS"),
        ];
        let expected: Vec<_> = expected
            .into_iter()
            .map(|(what, v, verdict)| (what.to_string(), v, verdict))
            .collect();
        assert_eq!(shown, expected);
    }

    #[test]
    fn busy_cores_bounds_scale_each_rate_by_its_busy_share() {
        let mut run = measured();
        assert!(
            busy_cores_bounds(&run, 64).is_empty(),
            "idle time not measured"
        );
        run.enforce.cpu.idle_share = Some(0.25); // 30,000/s -> 40,000/s
        run.healthz.cpu.idle_share = Some(0.2); // 40,000/s -> 50,000/s
        run.cadence.cpu.idle_share = Some(0.2); // 2,000/s -> 2,500/s
        assert_eq!(
            busy_cores_bounds(&run, 64),
            [
                "every core busy at the CPU per answer measured (rate / busy share): \
                 enforce 40000/s, healthz 50000/s: 80 %",
                "cadence, every core busy: 2500/s; 64 callers would still wait 25.6 ms on average",
            ]
        );
    }

    #[test]
    fn the_pooled_arm_is_read_against_the_same_flow_on_postgresql_itself() {
        let mut run = measured();
        assert_eq!(
            run.pooled_share().unwrap(),
            "behind PgBouncer (transaction pooling): 15000/s, 50 % of the same flow on \
             PostgreSQL itself (30000/s); p99 900.0 ms against 4.0 ms"
        );
        run.pooled = None;
        assert_eq!(run.pooled_share(), None);
    }

    #[test]
    fn baselines_batches_cycles_and_claims_never_count_as_the_worst_decision_p99() {
        let mut run = measured();
        run.cadence.p99_ms = Some(3.0);
        for arm in [
            &mut run.batch,
            &mut run.release_cycles,
            &mut run.report_storm,
        ] {
            arm.p99_ms = Some(900.0);
        }
        let p99 = run
            .targets()
            .into_iter()
            .find(|t| t.what.starts_with("p99"));
        let p99 = p99.unwrap();
        assert_eq!(p99.what, "p99 of every decision arm (worst: in flight)");
        assert_eq!((p99.measured, p99.verdict()), (Some(9.0), "PASS"));
    }
}
