//! The RateLimit fields (draft-ietf-httpapi-ratelimit-headers-12), written one
//! way for every answer that carries them: admissions (design.md §11, the
//! caller's own bucket) and reservations (design.md §4, the flow's quota).
//! What the numbers are is the caller's business; how they are spelled is
//! decided here only.

use axum::http::{HeaderMap, HeaderName, HeaderValue};

/// The `RateLimit-Policy` field's name, as HTTP/2 and `HeaderMap` spell it.
pub(crate) const POLICY: &str = "ratelimit-policy";
/// The `RateLimit` field's name.
pub const LIMIT: &str = "ratelimit";

/// Seconds rounded up (`domain::seconds_rounded_up`), at least 1: a field's
/// `t` of 0 would say "now" of a limit still in force. `None` when not a
/// finite, bounded number.
pub(crate) fn whole_seconds(seconds: f64) -> Option<u64> {
    // A year is far beyond any wait a client would keep to by itself.
    const MAX: f64 = 86_400.0 * 366.0;
    (seconds.is_finite() && seconds <= MAX).then(|| {
        let millis = (seconds * 1000.0).ceil() as i64;
        crate::domain::seconds_rounded_up(millis).max(1) as u64
    })
}

/// `RateLimit-Policy`: the policy `name` allows `quota` units per `window`
/// seconds.
pub(crate) fn policy_field(name: &str, quota: u64, window: u64) -> String {
    format!("{};q={quota};w={window}", quoted(name))
}

/// `RateLimit`: `remaining` units left of the policy `name`, and the seconds
/// until that changes (`None`: nothing will, the `t` parameter is left out).
pub(crate) fn limit_field(name: &str, remaining: u64, reset: Option<u64>) -> String {
    match reset {
        Some(reset) => format!("{};r={remaining};t={reset}", quoted(name)),
        None => format!("{};r={remaining}", quoted(name)),
    }
}

/// Sets the field `name` to `value`; a value that is not a valid field value
/// (never one of the functions above, given printable names) is left out
/// rather than sent wrong.
pub fn insert(headers: &mut HeaderMap, name: &'static str, value: String) {
    if let Ok(value) = HeaderValue::from_str(&value) {
        headers.insert(HeaderName::from_static(name), value);
    }
}

/// A structured-field string (RFC 8941 §3.3.3): in quotes, with `"` and `\`
/// escaped. Quota and route class names are of a smaller alphabet anyway.
fn quoted(name: &str) -> String {
    let mut quoted = String::with_capacity(name.len() + 2);
    quoted.push('"');
    for c in name.chars() {
        if matches!(c, '"' | '\\') {
            quoted.push('\\');
        }
        quoted.push(c);
    }
    quoted.push('"');
    quoted
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seconds_round_up_to_at_least_one_and_unbounded_is_none() {
        assert_eq!(whole_seconds(0.0), Some(1));
        assert_eq!(whole_seconds(0.001), Some(1));
        assert_eq!(whole_seconds(1.0), Some(1));
        assert_eq!(whole_seconds(1.001), Some(2));
        assert_eq!(whole_seconds(3599.5), Some(3600));
        assert_eq!(whole_seconds(-5.0), Some(1));
        assert_eq!(whole_seconds(f64::NAN), None);
        assert_eq!(whole_seconds(f64::INFINITY), None);
        assert_eq!(whole_seconds(86_400.0 * 367.0), None);
    }

    #[test]
    fn the_fields_follow_the_draft_syntax() {
        assert_eq!(policy_field("mail", 5, 3600), "\"mail\";q=5;w=3600");
        assert_eq!(limit_field("mail", 0, Some(42)), "\"mail\";r=0;t=42");
        assert_eq!(limit_field("mail", 3, None), "\"mail\";r=3");
    }

    #[test]
    fn a_name_is_a_quoted_string_with_quotes_and_backslashes_escaped() {
        assert_eq!(quoted("a.b:c/d-e_f"), "\"a.b:c/d-e_f\"");
        assert_eq!(quoted(r#"a"b\c"#), r#""a\"b\\c""#);
    }

    #[test]
    fn only_valid_values_are_inserted() {
        let mut headers = HeaderMap::new();
        insert(&mut headers, LIMIT, limit_field("mail", 1, Some(2)));
        insert(&mut headers, POLICY, "bad\nvalue".into());
        assert_eq!(headers[LIMIT], "\"mail\";r=1;t=2");
        assert!(!headers.contains_key(POLICY));
    }
}
