//! The one rule for how an upstream's answers move a cadence, shared by the
//! arbiter (`POST /v1/report`, design.md §5) and the client's local fallback
//! (design.md §12): a multiplier per status, floors, and passive recovery.
//!
//! The arbiter keeps its factor in PostgreSQL (`quota_bucket.factor`, recovered
//! by the SQL function `recovered_factor` on the database clock); its tests
//! check that function against [`recovered_factor`] here.

use std::time::Duration;

/// Slowest a cadence adapts down to: one token per 100 s.
pub const RATE_FLOOR: f64 = 0.01;
/// Smallest bucket a cadence adapts down to: one token.
pub const BURST_FLOOR: f64 = 1.0;
/// Passive recovery: the factor grows by this much per second (0.5 %/s),
/// compounded, never above 1.
pub const RECOVERY_PER_SECOND: f64 = 1.005;

/// The adaptive cadence's reading of the upstream's HTTP status (0: the call
/// timed out): back off hard on 429, gently on other failures, creep back up
/// on success. Other answers (a 404, a redirect) say nothing about the rate.
pub fn multiplier(status: u16) -> Option<f64> {
    match status {
        429 => Some(0.7),
        0 => Some(0.8),
        500..=599 => Some(0.9),
        200..=299 => Some(1.05),
        _ => None,
    }
}

/// A factor set `elapsed` ago, recovered to now: ×1.005 per second, never
/// above 1.
pub fn recovered_factor(factor: f64, elapsed: Duration) -> f64 {
    (factor * RECOVERY_PER_SECOND.powf(elapsed.as_secs_f64())).min(1.0)
}

/// A token bucket's size: tokens per second and tokens at once.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Limits {
    pub rate: f64,
    pub burst: f64,
}

/// An adaptive bucket: a factor (0-1] of the limits it may reach, and when
/// the factor was last set.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Adapted {
    /// The factor now, recovered and multiplied.
    pub factor: f64,
    /// The limits in force: `ceiling × factor`, within the floors and never
    /// above `ceiling`.
    pub limits: Limits,
}

/// The one adaptation step: the factor set `elapsed` ago recovers to now,
/// then the upstream's `status`, if any and if it says something, multiplies
/// it. The factor never goes above 1 nor below what keeps the rate at
/// [`RATE_FLOOR`]; the limits in force are `ceiling × factor` with the rate
/// at least [`RATE_FLOOR`] and the burst at least [`BURST_FLOOR`], never above
/// `ceiling` (a ceiling already below a floor stays as it is). This is the
/// arbiter's `adapt_cadence.sql` and `quota_cadence` view, for a client's
/// bucket whose ceiling is its share.
pub fn adapt(ceiling: Limits, factor: f64, elapsed: Duration, status: Option<u16>) -> Adapted {
    let recovered = recovered_factor(factor, elapsed);
    let floor = (RATE_FLOOR / ceiling.rate).min(1.0);
    let factor = match status.and_then(multiplier) {
        Some(multiplier) => (recovered * multiplier).max(floor).min(1.0),
        None => recovered,
    };
    let within = |value: f64, floor: f64, ceiling: f64| value.max(floor.min(ceiling)).min(ceiling);
    Adapted {
        factor,
        limits: Limits {
            rate: within(ceiling.rate * factor, RATE_FLOOR, ceiling.rate),
            burst: within(ceiling.burst * factor, BURST_FLOOR, ceiling.burst),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const SHARE: Limits = Limits {
        rate: 10.0,
        burst: 4.0,
    };

    fn after(status: u16) -> Adapted {
        adapt(SHARE, 1.0, Duration::ZERO, Some(status))
    }

    #[test]
    fn each_status_has_its_coefficient() {
        assert_eq!(multiplier(429), Some(0.7));
        assert_eq!(multiplier(0), Some(0.8));
        assert_eq!(multiplier(503), Some(0.9));
        assert_eq!(multiplier(201), Some(1.05));
        for silent in [100, 304, 404, 422] {
            assert_eq!(multiplier(silent), None, "{silent}");
        }
        let close = |a: f64, b: f64| (a - b).abs() < 1e-9;
        assert!(close(after(429).limits.rate, 7.0));
        assert!(close(after(0).limits.rate, 8.0));
        assert!(close(after(500).limits.rate, 9.0));
        assert!(close(after(429).limits.burst, 2.8));
    }

    #[test]
    fn success_never_lifts_above_the_ceiling() {
        assert_eq!(after(200).factor, 1.0);
        assert_eq!(after(200).limits, SHARE);
        let slowed = adapt(SHARE, 0.5, Duration::ZERO, Some(200));
        assert!((slowed.factor - 0.525).abs() < 1e-9);
    }

    #[test]
    fn floors_hold_the_rate_and_the_burst() {
        let mut factor = 1.0;
        for _ in 0..200 {
            factor = adapt(SHARE, factor, Duration::ZERO, Some(429)).factor;
        }
        let floored = adapt(SHARE, factor, Duration::ZERO, None);
        assert!((floored.limits.rate - RATE_FLOOR).abs() < 1e-12);
        assert_eq!(floored.limits.burst, BURST_FLOOR);
        assert!((factor - RATE_FLOOR / SHARE.rate).abs() < 1e-12);
        // A share already below the floors is not raised to them.
        let tiny = Limits {
            rate: 0.001,
            burst: 0.5,
        };
        assert_eq!(adapt(tiny, 1.0, Duration::ZERO, Some(429)).limits, tiny);
    }

    #[test]
    fn the_factor_recovers_half_a_percent_a_second() {
        let close = |a: f64, b: f64| (a - b).abs() < 1e-9;
        assert!(close(recovered_factor(0.5, Duration::from_secs(1)), 0.5025));
        assert!(close(
            recovered_factor(0.5, Duration::from_secs(100)),
            0.5 * 1.005f64.powi(100)
        ));
        assert_eq!(recovered_factor(0.5, Duration::from_secs(200)), 1.0);
        let recovering = adapt(SHARE, 0.5, Duration::from_secs(60), None);
        assert!(close(
            recovering.limits.rate,
            10.0 * 0.5 * 1.005f64.powi(60)
        ));
    }

    proptest! {
        #[test]
        fn adaptation_stays_within_the_floors_and_the_ceiling(
            rate in 0.02f64..1e6,
            burst in 1.0f64..1e9,
            factor in 0.0f64..=1.0,
            elapsed_ms in 0u64..10_000_000,
            status in proptest::option::of(0u16..600),
        ) {
            let ceiling = Limits { rate, burst };
            let floor = RATE_FLOOR / rate;
            let factor = factor.max(floor);
            let elapsed = Duration::from_millis(elapsed_ms);
            let now = adapt(ceiling, factor, elapsed, status);
            prop_assert!(now.factor <= 1.0 && now.factor >= floor * (1.0 - 1e-12));
            prop_assert!(now.limits.rate <= rate && now.limits.rate >= RATE_FLOOR);
            prop_assert!(now.limits.burst <= burst && now.limits.burst >= BURST_FLOOR);
            let recovered = recovered_factor(factor, elapsed);
            prop_assert!(recovered >= factor);
            match status.and_then(multiplier) {
                Some(m) if m < 1.0 => prop_assert!(now.factor <= recovered),
                Some(_) => prop_assert!(now.factor >= recovered),
                None => prop_assert_eq!(now.factor, recovered),
            }
        }

        #[test]
        fn recovery_compounds(
            factor in 0.001f64..=1.0, a in 0u64..600_000, b in 0u64..600_000,
        ) {
            let (a, b) = (Duration::from_millis(a), Duration::from_millis(b));
            let twice = recovered_factor(recovered_factor(factor, a), b);
            let once = recovered_factor(factor, a + b);
            prop_assert!((twice - once).abs() < 1e-9);
        }
    }
}
