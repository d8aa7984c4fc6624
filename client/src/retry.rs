//! The one rule for how long a transient failure is waited out, and the
//! reading of `Retry-After`.

use std::time::{Duration, SystemTime};

/// Deterministic exponential backoff, no jitter: the wait before retry `n`
/// (attempt `n + 1`) is `base · 2^(n-1)`, capped at `max`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Attempts in all, the first one included (at least 1).
    pub attempts: u32,
    pub base: Duration,
    pub max: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        Self {
            attempts: 7,
            base: Duration::from_secs(2),
            max: Duration::from_secs(120),
        }
    }
}

impl RetryPolicy {
    /// The wait before retry `retry` (1 for the second attempt), given the
    /// failed answer's `Retry-After`, if any. A `Retry-After` longer than the
    /// backoff wins and is not capped: the arbiter knows its state better
    /// than the client's guess does.
    pub fn wait_before_retry(&self, retry: u32, retry_after: Option<Duration>) -> Duration {
        let doubling = 2u32
            .checked_pow(retry.saturating_sub(1))
            .unwrap_or(u32::MAX);
        let backoff = self.base.saturating_mul(doubling).min(self.max);
        retry_after.map_or(backoff, |server| server.max(backoff))
    }
}

/// A `Retry-After` value: delta-seconds or an HTTP-date (RFC 9110 §10.2.3),
/// as a wait from `now`. A date already past is no wait; anything else is
/// `None` (ignored: the backoff alone applies).
pub fn parse_retry_after(value: &str, now: SystemTime) -> Option<Duration> {
    let value = value.trim();
    if !value.is_empty() && value.bytes().all(|b| b.is_ascii_digit()) {
        return Some(Duration::from_secs(value.parse().unwrap_or(u64::MAX)));
    }
    let date = httpdate::parse_http_date(value).ok()?;
    Some(date.duration_since(now).unwrap_or(Duration::ZERO))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const S: fn(u64) -> Duration = Duration::from_secs;

    fn policy(base: u64, max: u64) -> RetryPolicy {
        RetryPolicy {
            attempts: 7,
            base: S(base),
            max: S(max),
        }
    }

    #[test]
    fn the_default_backoff_doubles_from_two_seconds() {
        let waits: Vec<_> = (1..=6)
            .map(|n| RetryPolicy::default().wait_before_retry(n, None))
            .collect();
        assert_eq!(waits, [2, 4, 8, 16, 32, 64].map(S));
    }

    #[test]
    fn the_backoff_is_capped_at_max() {
        let p = policy(2, 10);
        let waits: Vec<_> = (1..=6).map(|n| p.wait_before_retry(n, None)).collect();
        assert_eq!(waits, [2, 4, 8, 10, 10, 10].map(S));
        // Far beyond any doubling that fits: still the cap, no overflow.
        assert_eq!(p.wait_before_retry(u32::MAX, None), S(10));
        assert_eq!(policy(2, 120).wait_before_retry(40, None), S(120));
    }

    #[test]
    fn a_longer_retry_after_wins_uncapped_and_a_shorter_one_loses() {
        let p = policy(2, 10);
        assert_eq!(p.wait_before_retry(1, Some(S(3))), S(3));
        assert_eq!(p.wait_before_retry(1, Some(S(300))), S(300));
        assert_eq!(p.wait_before_retry(3, Some(S(1))), S(8));
        assert_eq!(p.wait_before_retry(6, Some(S(5))), S(10));
    }

    #[test]
    fn retry_after_reads_seconds_and_http_dates() {
        let now = SystemTime::UNIX_EPOCH + S(1_784_000_000);
        assert_eq!(parse_retry_after("3", now), Some(S(3)));
        assert_eq!(parse_retry_after(" 120 ", now), Some(S(120)));
        let later = httpdate::fmt_http_date(now + S(10));
        assert_eq!(parse_retry_after(&later, now), Some(S(10)));
        let past = httpdate::fmt_http_date(now - S(10));
        assert_eq!(parse_retry_after(&past, now), Some(Duration::ZERO));
        for broken in ["", "-3", "1.5", "soon", "Mon, 32 Nov 2026 25:00:00 GMT"] {
            assert_eq!(parse_retry_after(broken, now), None, "{broken:?}");
        }
        assert_eq!(
            parse_retry_after("99999999999999999999999", now),
            Some(S(u64::MAX))
        );
    }

    proptest! {
        #[test]
        fn waits_never_shrink_stay_within_the_cap_and_honour_retry_after(
            base_ms in 1u64..60_000,
            max_ms in 1u64..600_000,
            retry in 1u32..64,
            retry_after_ms in proptest::option::of(0u64..10_000_000),
        ) {
            let p = RetryPolicy { attempts: 7, base: Duration::from_millis(base_ms), max: Duration::from_millis(max_ms) };
            let retry_after = retry_after_ms.map(Duration::from_millis);
            let wait = p.wait_before_retry(retry, retry_after);
            let next = p.wait_before_retry(retry + 1, retry_after);
            prop_assert!(next >= wait);
            prop_assert!(wait <= p.max.max(retry_after.unwrap_or_default()));
            prop_assert!(wait >= retry_after.unwrap_or_default());
            prop_assert!(wait >= p.base.min(p.max));
            if retry_after.is_none() {
                let exact = p.base.saturating_mul(1 << (retry - 1).min(31)).min(p.max);
                if retry <= 32 { prop_assert_eq!(wait, exact); }
            }
        }
    }
}
