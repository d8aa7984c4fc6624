//! What a caller may write in each kind of field, checked at the edge before
//! anything reaches the store or a log line: one rule per kind of field.
//! PostgreSQL `text` and `jsonb` cannot hold U+0000, and control characters
//! in names, refs and worker ids would forge log lines and metric labels.
//! Lengths count characters (Unicode scalar values), as JSON Schema's
//! `maxLength` does, so that the OpenAPI document and the server agree.

use serde_json::Value;

/// Longest name of a quota, a flow or a worker.
pub const MAX_NAME_LEN: usize = 128;
/// Longest caller's reference (`ref`).
pub const MAX_REF_LEN: usize = 256;
/// Longest free text a caller may write (durations, periods).
pub(crate) const MAX_TEXT_LEN: usize = 64;
/// Largest work payload, serialized: a reference to the work, not the work itself.
pub(crate) const MAX_PAYLOAD_BYTES: usize = 8 * 1024;
/// Largest magnitude of a number in a payload: `jsonb` keeps the decimal
/// digits, and near `f64::MAX` they no longer read back as a double.
pub(crate) const MAX_PAYLOAD_NUMBER: f64 = 1e300;

/// The names' alphabet, as the OpenAPI document writes it.
pub(crate) const NAME_PATTERN: &str = "^[A-Za-z0-9][A-Za-z0-9._:/-]*$";
/// What `humantime` reads as a duration, without spaces inside a term
/// (and `0`, which needs no unit).
pub(crate) const DURATION_PATTERN: &str = "^0$|^([0-9]{1,9}(nanos|nsec|ns|usec|us|millis|msec|ms|seconds|second|secs|sec|s|minutes|minute|mins|min|m|hours|hour|hrs|hr|h|days|day|d|weeks|week|wks|wk|w|months|month|M|years|year|yrs|yr|y) ?)*[0-9]{1,9}(nanos|nsec|ns|usec|us|millis|msec|ms|seconds|second|secs|sec|s|minutes|minute|mins|min|m|hours|hour|hrs|hr|h|days|day|d|weeks|week|wks|wk|w|months|month|M|years|year|yrs|yr|y)$";
/// Printable text: no C0 or C1 control character, DEL included.
pub(crate) const PRINTABLE_PATTERN: &str = "^[^\\u0000-\\u001F\\u007F-\\u009F]*$";
/// A principal or tenant in a header: visible ASCII, spaces inside only
/// (HTTP trims a header value's ends).
pub(crate) const HEADER_IDENTIFIER_PATTERN: &str = "^[!-~]([ -~]*[!-~])?$";

/// Names of quotas and flows, and worker ids, end up in URLs, metric labels
/// and log lines, so they are kept to a small, printable alphabet (the
/// tables check the same).
pub fn name(value: &str) -> Result<(), String> {
    if value.is_empty() {
        return Err("must not be empty".into());
    }
    if value.chars().count() > MAX_NAME_LEN {
        return Err(format!("must be at most {MAX_NAME_LEN} characters"));
    }
    let mut chars = value.chars();
    let first_ok = chars.next().is_some_and(|c| c.is_ascii_alphanumeric());
    let rest_ok = chars.all(|c| c.is_ascii_alphanumeric() || "._:/-".contains(c));
    if !(first_ok && rest_ok) {
        return Err(
            "must start with a letter or digit and use only letters, digits and . _ : / -".into(),
        );
    }
    Ok(())
}

/// A caller's reference: any printable text, echoed in answers and logs.
pub fn reference(value: &str) -> Result<(), String> {
    let length = value.chars().count();
    if !(1..=MAX_REF_LEN).contains(&length) {
        return Err(format!("must be 1 to {MAX_REF_LEN} characters"));
    }
    if value.chars().any(char::is_control) {
        return Err("must not hold control characters".into());
    }
    Ok(())
}

/// Free text that is parsed (a duration, a period): short, and no NUL.
pub fn text(value: &str) -> Result<(), String> {
    if value.chars().count() > MAX_TEXT_LEN {
        return Err(format!("must be at most {MAX_TEXT_LEN} characters"));
    }
    if value.contains('\0') {
        return Err("must not hold a NUL character".into());
    }
    Ok(())
}

/// A work payload: any JSON the store can hold, at most [`MAX_PAYLOAD_BYTES`].
pub fn payload(value: &Value) -> Result<(), String> {
    if value.to_string().len() > MAX_PAYLOAD_BYTES {
        return Err(format!("must be at most {MAX_PAYLOAD_BYTES} bytes of JSON"));
    }
    if holds_nul(value) {
        return Err("must not hold a NUL character (\\u0000), in a key or a string".into());
    }
    if holds_huge_number(value) {
        return Err(format!(
            "must not hold a number beyond ±{MAX_PAYLOAD_NUMBER:e}"
        ));
    }
    Ok(())
}

fn holds_nul(value: &Value) -> bool {
    match value {
        Value::String(s) => s.contains('\0'),
        Value::Array(items) => items.iter().any(holds_nul),
        Value::Object(fields) => fields
            .iter()
            .any(|(key, value)| key.contains('\0') || holds_nul(value)),
        Value::Null | Value::Bool(_) | Value::Number(_) => false,
    }
}

fn holds_huge_number(value: &Value) -> bool {
    match value {
        Value::Number(n) => n.as_f64().is_some_and(|n| n.abs() > MAX_PAYLOAD_NUMBER),
        Value::Array(items) => items.iter().any(holds_huge_number),
        Value::Object(fields) => fields.values().any(holds_huge_number),
        Value::Null | Value::Bool(_) | Value::String(_) => false,
    }
}

/// A JSON string that escapes half of a UTF-16 surrogate pair (`"\ud800"`)
/// is well-formed JSON that names no character: serde_json refuses it while
/// parsing, with one of these messages. It is bad input (422), not a
/// malformed document (400).
pub(crate) fn is_lone_surrogate(parse_error: &str) -> bool {
    [
        "lone leading surrogate",
        "unexpected end of hex escape",
        "invalid unicode code point",
    ]
    .iter()
    .any(|message| parse_error.contains(message))
}

/// How the OpenAPI document writes these rules (for `schema_with`), so that
/// the document and the server agree in both directions.
pub mod schema {
    use utoipa::openapi::schema::{
        AnyOfBuilder, ArrayBuilder, ObjectBuilder, Schema, SchemaType, Type,
    };
    use utoipa::openapi::RefOr;

    use super::{
        DURATION_PATTERN, HEADER_IDENTIFIER_PATTERN, MAX_NAME_LEN, MAX_PAYLOAD_BYTES,
        MAX_PAYLOAD_NUMBER, MAX_REF_LEN, MAX_TEXT_LEN, NAME_PATTERN, PRINTABLE_PATTERN,
    };

    fn string(min: usize, max: usize, pattern: Option<&str>, nullable: bool) -> Schema {
        let kind = if nullable {
            SchemaType::from_iter([Type::String, Type::Null])
        } else {
            SchemaType::Type(Type::String)
        };
        ObjectBuilder::new()
            .schema_type(kind)
            .min_length(Some(min))
            .max_length(Some(max))
            .pattern(pattern)
            .into()
    }

    pub fn name() -> Schema {
        string(1, MAX_NAME_LEN, Some(NAME_PATTERN), false)
    }

    pub(crate) fn optional_name() -> Schema {
        string(1, MAX_NAME_LEN, Some(NAME_PATTERN), true)
    }

    pub(crate) fn optional_names() -> Schema {
        let items: RefOr<Schema> = name().into();
        ArrayBuilder::new()
            .schema_type(SchemaType::from_iter([Type::Array, Type::Null]))
            .items(items)
            .into()
    }

    pub(crate) fn optional_reference() -> Schema {
        string(1, MAX_REF_LEN, Some(PRINTABLE_PATTERN), true)
    }

    /// A principal or tenant in a JSON body: printable, like a reference.
    pub(crate) fn optional_identifier() -> Schema {
        string(1, MAX_REF_LEN, Some(PRINTABLE_PATTERN), true)
    }

    /// A principal or tenant in a header ([`HEADER_IDENTIFIER_PATTERN`]).
    pub(crate) fn header_identifier() -> Schema {
        string(1, MAX_REF_LEN, Some(HEADER_IDENTIFIER_PATTERN), false)
    }

    /// A duration as `humantime` reads it: `30s`, `5m`, `1h 30m`.
    pub fn duration() -> Schema {
        string(1, MAX_TEXT_LEN, Some(DURATION_PATTERN), false)
    }

    pub(crate) fn optional_duration() -> Schema {
        string(1, MAX_TEXT_LEN, Some(DURATION_PATTERN), true)
    }

    /// A work payload: any JSON value, as every generator can read it (a
    /// recursive schema of its kinds is skipped by some). The store's limits
    /// ([`super::payload`]) are refused at the edge with a 422 naming them.
    pub fn payload() -> Schema {
        ObjectBuilder::new()
            .schema_type(SchemaType::AnyValue)
            .description(Some(format!(
                "Any JSON value (default null). The store refuses, with a 422 naming the \
                 rule: a NUL character (\\u0000) in a key or a string, a number beyond \
                 ±{MAX_PAYLOAD_NUMBER:e}, more than {MAX_PAYLOAD_BYTES} bytes serialized"
            )))
            .into()
    }

    /// Amounts by quota name (`{"llm-tokens": 3500}`): up to a flow's
    /// quotas, each amount within `min..=max`; `null` or absent where
    /// `nullable`.
    pub(crate) fn amounts(min: i64, max: i64, nullable: bool) -> Schema {
        let types = if nullable {
            SchemaType::from_iter([Type::Object, Type::Null])
        } else {
            SchemaType::from(Type::Object)
        };
        let amount = ObjectBuilder::new()
            .schema_type(SchemaType::from(Type::Integer))
            .format(Some(utoipa::openapi::SchemaFormat::KnownFormat(
                utoipa::openapi::KnownFormat::Int64,
            )))
            .minimum(Some(min))
            .maximum(Some(max));
        ObjectBuilder::new()
            .schema_type(types)
            .additional_properties(Some(amount))
            .min_properties(Some(usize::from(nullable)))
            .max_properties(Some(crate::domain::catalog::MAX_FLOW_QUOTAS))
            .into()
    }

    /// `quotas` on a flow: 1 to 8 distinct names, or absent.
    pub(crate) fn quotas() -> Schema {
        let items: RefOr<Schema> = name().into();
        ArrayBuilder::new()
            .schema_type(SchemaType::from_iter([Type::Array, Type::Null]))
            .items(items)
            .min_items(Some(1))
            .max_items(Some(crate::domain::catalog::MAX_FLOW_QUOTAS))
            .unique_items(true)
            .into()
    }

    /// `spend` on a reservation: the flow's quotas, 1 to 10^9 each.
    pub(crate) fn spend() -> Schema {
        amounts(1, crate::domain::decision::MAX_SPEND, true)
    }

    /// `spent` on a settlement: the reservation's quotas, 0 to 10^9 each.
    pub(crate) fn spent() -> Schema {
        amounts(0, crate::domain::decision::MAX_SPEND, false)
    }

    /// A schema that holds when one of `alternatives` does (each a plain
    /// schema as JSON, with a `type`: utoipa's untagged `Schema` reads back
    /// neither `anyOf` nor a schema without one, and writes `const` as `enum`).
    pub(crate) fn any_of(alternatives: impl IntoIterator<Item = serde_json::Value>) -> Schema {
        alternatives
            .into_iter()
            .fold(AnyOfBuilder::new(), |any, alternative| {
                let alternative: Schema =
                    serde_json::from_value(alternative).expect("a plain schema");
                any.item(alternative)
            })
            .into()
    }
}

/// Integer fields: JSON Schema counts `226.0` as the integer 226, so the
/// server does too (serde alone refuses it); `226.5` is refused.
pub mod integer {
    use std::collections::BTreeMap;
    use std::fmt;
    use std::marker::PhantomData;

    use serde::de::{self, Deserializer, Visitor};
    use serde::Deserialize;

    use crate::domain::Patch;

    /// `#[serde(default, deserialize_with = "crate::domain::input::integer::optional")]`
    pub(crate) fn optional<'de, D, T>(d: D) -> Result<Option<T>, D::Error>
    where
        D: Deserializer<'de>,
        T: TryFrom<i64>,
    {
        d.deserialize_option(Whole(PhantomData))
    }

    /// `#[serde(deserialize_with = "crate::domain::input::integer::required")]`
    pub fn required<'de, D, T>(d: D) -> Result<T, D::Error>
    where
        D: Deserializer<'de>,
        T: TryFrom<i64>,
    {
        optional(d)?.ok_or_else(|| de::Error::custom("an integer is required, not null"))
    }

    /// Amounts by name (`{"llm-tokens": 3500}`), each an integer as
    /// JSON Schema counts one.
    /// `#[serde(default, deserialize_with = "crate::domain::input::integer::amounts")]`
    pub(crate) fn amounts<'de, D>(d: D) -> Result<BTreeMap<String, i64>, D::Error>
    where
        D: Deserializer<'de>,
    {
        let map = BTreeMap::<String, Amount>::deserialize(d)?;
        Ok(map
            .into_iter()
            .map(|(name, amount)| (name, amount.0))
            .collect())
    }

    /// [`amounts`], or `null`.
    pub(crate) fn optional_amounts<'de, D>(d: D) -> Result<Option<BTreeMap<String, i64>>, D::Error>
    where
        D: Deserializer<'de>,
    {
        let map = Option::<BTreeMap<String, Amount>>::deserialize(d)?;
        Ok(map.map(|map| {
            map.into_iter()
                .map(|(name, amount)| (name, amount.0))
                .collect()
        }))
    }

    /// One amount of a map.
    struct Amount(i64);

    impl<'de> Deserialize<'de> for Amount {
        fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
            required(d).map(Amount)
        }
    }

    /// A merge-patch integer: `null` removes, a value sets.
    pub fn patch<'de, D, T>(d: D) -> Result<Patch<T>, D::Error>
    where
        D: Deserializer<'de>,
        T: TryFrom<i64>,
    {
        Ok(optional(d)?.map_or(Patch::Remove, Patch::Set))
    }

    struct Whole<T>(PhantomData<T>);

    impl<T: TryFrom<i64>> Whole<T> {
        fn fit<E: de::Error>(n: i64) -> Result<Option<T>, E> {
            T::try_from(n)
                .map(Some)
                .map_err(|_| E::custom(format!("{n} is out of range")))
        }
    }

    impl<'de, T: TryFrom<i64>> Visitor<'de> for Whole<T> {
        type Value = Option<T>;

        fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
            f.write_str("an integer")
        }

        fn visit_none<E: de::Error>(self) -> Result<Self::Value, E> {
            Ok(None)
        }

        fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
            Ok(None)
        }

        fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
            d.deserialize_any(self)
        }

        fn visit_i64<E: de::Error>(self, n: i64) -> Result<Self::Value, E> {
            Self::fit(n)
        }

        fn visit_u64<E: de::Error>(self, n: u64) -> Result<Self::Value, E> {
            let n = i64::try_from(n).map_err(|_| E::custom(format!("{n} is out of range")))?;
            Self::fit(n)
        }

        fn visit_i128<E: de::Error>(self, n: i128) -> Result<Self::Value, E> {
            let n = i64::try_from(n).map_err(|_| E::custom(format!("{n} is out of range")))?;
            Self::fit(n)
        }

        fn visit_u128<E: de::Error>(self, n: u128) -> Result<Self::Value, E> {
            let n = i64::try_from(n).map_err(|_| E::custom(format!("{n} is out of range")))?;
            Self::fit(n)
        }

        fn visit_f64<E: de::Error>(self, n: f64) -> Result<Self::Value, E> {
            // 2^63 is the first f64 beyond i64.
            if n.fract() != 0.0
                || !(-9.223_372_036_854_776e18..9.223_372_036_854_776e18).contains(&n)
            {
                return Err(E::invalid_type(de::Unexpected::Float(n), &self));
            }
            Self::fit(n as i64)
        }
    }
}

/// Ids that must survive every JSON reader exactly (a lease's 60 random
/// bits): JavaScript's `JSON.parse`, jq and Go's `encoding/json` into `any`
/// read numbers as doubles and lose the digits past 2^53, so the id travels
/// as a decimal string. A caller may still send an integer (deprecated,
/// CHANGELOG), read by the same rules as every integer field.
pub mod exact_id {
    use std::fmt;

    use serde::de::{self, Deserializer, Visitor};
    use serde::Serializer;
    use utoipa::openapi::schema::{ObjectBuilder, Schema, SchemaType, Type};

    /// The decimal digits of an id, as the OpenAPI document writes them.
    pub(crate) const PATTERN: &str = "^-?[0-9]{1,19}$";

    /// `#[serde(serialize_with = "crate::domain::input::exact_id::optional_string")]`
    pub(crate) fn optional_string<S: Serializer>(
        id: &Option<i64>,
        s: S,
    ) -> Result<S::Ok, S::Error> {
        match id {
            Some(id) => s.collect_str(id),
            None => s.serialize_none(),
        }
    }

    /// `#[serde(serialize_with = "crate::domain::input::exact_id::string")]`
    pub(crate) fn string<S: Serializer>(id: &i64, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(id)
    }

    /// `#[serde(deserialize_with = "crate::domain::input::exact_id::required")]`:
    /// a decimal string or an integer, never `null`.
    pub(crate) fn required<'de, D: Deserializer<'de>>(d: D) -> Result<i64, D::Error> {
        optional(d)?.ok_or_else(|| de::Error::custom("an id is required, not null"))
    }

    /// `#[serde(default, deserialize_with = "crate::domain::input::exact_id::optional")]`:
    /// a decimal string or an integer; `null` or absent is none.
    pub(crate) fn optional<'de, D: Deserializer<'de>>(d: D) -> Result<Option<i64>, D::Error> {
        d.deserialize_option(StringOrInteger)
    }

    struct StringOrInteger;

    impl<'de> Visitor<'de> for StringOrInteger {
        type Value = Option<i64>;

        fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
            f.write_str("an id: a string of decimal digits (or an integer)")
        }

        fn visit_none<E: de::Error>(self) -> Result<Self::Value, E> {
            Ok(None)
        }

        fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
            Ok(None)
        }

        fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
            d.deserialize_any(self)
        }

        fn visit_str<E: de::Error>(self, text: &str) -> Result<Self::Value, E> {
            let digits = text.strip_prefix('-').unwrap_or(text);
            if digits.is_empty() || digits.len() > 19 || !digits.bytes().all(|b| b.is_ascii_digit())
            {
                return Err(E::invalid_value(de::Unexpected::Str(text), &self));
            }
            text.parse()
                .map(Some)
                .map_err(|_| E::custom(format!("{text} is out of range")))
        }

        fn visit_i64<E: de::Error>(self, n: i64) -> Result<Self::Value, E> {
            super::integer::optional(de::value::I64Deserializer::new(n))
        }

        fn visit_u64<E: de::Error>(self, n: u64) -> Result<Self::Value, E> {
            super::integer::optional(de::value::U64Deserializer::new(n))
        }

        fn visit_f64<E: de::Error>(self, n: f64) -> Result<Self::Value, E> {
            super::integer::optional(de::value::F64Deserializer::new(n))
        }
    }

    /// An id in an answer: a string of digits, or `null`.
    pub(crate) fn optional_schema() -> Schema {
        ObjectBuilder::new()
            .schema_type(SchemaType::from_iter([Type::String, Type::Null]))
            .pattern(Some(PATTERN))
            .description(Some(
                "An exact id: a string of decimal digits (a JSON number would lose digits in \
                 JavaScript and jq)",
            ))
            .into()
    }

    /// A required id a caller sends: a string of digits.
    pub(crate) fn required_input_schema() -> Schema {
        ObjectBuilder::new()
            .schema_type(SchemaType::from(Type::String))
            .pattern(Some(PATTERN))
            .description(Some("An exact id: a string of decimal digits"))
            .into()
    }

    /// An id a caller sends: a string of digits; an integer is still read
    /// (deprecated).
    pub(crate) fn optional_input_schema() -> Schema {
        let mut schema = super::schema::any_of([
            serde_json::json!({"type": "string", "pattern": PATTERN}),
            serde_json::json!({"type": "integer", "format": "int64",
                "minimum": i64::MIN, "maximum": i64::MAX, "deprecated": true}),
            serde_json::json!({"type": "null"}),
        ]);
        if let Schema::AnyOf(any) = &mut schema {
            any.description = Some(
                "An exact id as a string of decimal digits; an integer is still accepted \
                 (deprecated)"
                    .into(),
            );
        }
        schema
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn names_are_a_small_printable_alphabet() {
        for ok in ["invoice", "a", "ppf/v2:eu-1.b_c", &"n".repeat(MAX_NAME_LEN)] {
            assert_eq!(name(ok), Ok(()), "{ok}");
        }
        for bad in [
            "",
            "-lead",
            "a b",
            "a\0b",
            "a\nb",
            "a\u{7f}",
            "é",
            &"n".repeat(MAX_NAME_LEN + 1),
        ] {
            assert!(name(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn refs_are_printable_and_counted_in_characters() {
        assert_eq!(reference("order 42 / é ✓"), Ok(()));
        assert_eq!(reference(&"é".repeat(MAX_REF_LEN)), Ok(()), "not bytes");
        for bad in [
            "",
            "a\0b",
            "a\tb",
            "a\u{1b}[31m",
            "a\u{85}",
            &"r".repeat(MAX_REF_LEN + 1),
        ] {
            assert!(reference(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn free_text_is_short_and_holds_no_nul() {
        assert_eq!(text("1h 30m"), Ok(()));
        assert_eq!(
            text(&"1".repeat(MAX_TEXT_LEN)),
            Ok(()),
            "the longest allowed"
        );
        assert!(text("30\0s").is_err());
        assert!(text(&"1".repeat(MAX_TEXT_LEN + 1)).is_err());
    }

    #[test]
    fn payloads_hold_no_nul_anywhere() {
        assert_eq!(payload(&json!({"a": [1, "x", {"b": null}]})), Ok(()));
        for bad in [
            json!("a\u{0}"),
            json!({"a": {"b": ["ok", "n\u{0}"]}}),
            json!({"k\u{0}": 1}),
        ] {
            assert!(payload(&bad).is_err(), "{bad}");
        }
        let big = json!({"blob": "x".repeat(MAX_PAYLOAD_BYTES)});
        assert!(payload(&big).is_err());
        // 8 KiB of JSON, the quotes included: the largest allowed.
        let largest = json!("x".repeat(8 * 1024 - 2));
        assert_eq!(largest.to_string().len(), MAX_PAYLOAD_BYTES);
        assert_eq!(payload(&largest), Ok(()));
    }

    #[derive(Debug, serde::Deserialize)]
    struct Counted {
        #[serde(default, deserialize_with = "integer::optional")]
        count: Option<i16>,
    }

    #[test]
    fn integers_may_be_written_with_a_zero_fraction() {
        let count = |body: &str| serde_json::from_str::<Counted>(body).map(|c| c.count);
        assert_eq!(count(r#"{"count": 226}"#).unwrap(), Some(226));
        assert_eq!(count(r#"{"count": 226.0}"#).unwrap(), Some(226));
        assert_eq!(count(r#"{"count": 2.26e2}"#).unwrap(), Some(226));
        assert_eq!(count(r#"{"count": null}"#).unwrap(), None);
        assert_eq!(count("{}").unwrap(), None);
        assert_eq!(count(r#"{"count": -5}"#).unwrap(), Some(-5));
        // Wider integers than JSON parsers give today, from other formats.
        use serde::de::value::{Error, I128Deserializer, U128Deserializer};
        let wide = integer::optional::<_, i16>(I128Deserializer::<Error>::new(-226));
        assert_eq!(wide.unwrap(), Some(-226));
        let wide = integer::optional::<_, i16>(U128Deserializer::<Error>::new(226));
        assert_eq!(wide.unwrap(), Some(226));
        let fraction = count(r#"{"count": 226.5}"#).unwrap_err().to_string();
        assert!(fraction.contains("expected an integer"), "{fraction}");
        for bad in [
            r#"{"count": 226.5}"#,
            r#"{"count": 40000}"#,
            r#"{"count": 1e300}"#,
            r#"{"count": "226"}"#,
        ] {
            assert!(count(bad).is_err(), "{bad}");
        }
    }

    /// Each schema of the OpenAPI document writes the rule its field is
    /// checked by here: the same lengths, the same alphabet.
    #[test]
    fn the_schemas_write_the_rules_the_server_checks() {
        let strings = [
            (schema::name(), MAX_NAME_LEN, NAME_PATTERN, false),
            (schema::optional_name(), MAX_NAME_LEN, NAME_PATTERN, true),
            (
                schema::optional_reference(),
                MAX_REF_LEN,
                PRINTABLE_PATTERN,
                true,
            ),
            (
                schema::optional_identifier(),
                MAX_REF_LEN,
                PRINTABLE_PATTERN,
                true,
            ),
            (
                schema::header_identifier(),
                MAX_REF_LEN,
                HEADER_IDENTIFIER_PATTERN,
                false,
            ),
            (schema::duration(), MAX_TEXT_LEN, DURATION_PATTERN, false),
            (
                schema::optional_duration(),
                MAX_TEXT_LEN,
                DURATION_PATTERN,
                true,
            ),
        ];
        for (schema, longest, pattern, nullable) in strings {
            let schema = serde_json::to_value(schema).unwrap();
            let kind = if nullable {
                json!(["string", "null"])
            } else {
                json!("string")
            };
            assert_eq!(schema["type"], kind, "{schema}");
            assert_eq!(schema["minLength"], 1, "{schema}");
            assert_eq!(schema["maxLength"], longest, "{schema}");
            assert_eq!(schema["pattern"], pattern, "{schema}");
        }
        let names = serde_json::to_value(schema::optional_names()).unwrap();
        assert_eq!(names["type"], json!(["array", "null"]));
        assert_eq!(
            names["items"],
            serde_json::to_value(schema::name()).unwrap()
        );
    }

    #[test]
    fn the_payload_schema_is_any_json_and_names_the_stores_limits() {
        let schema = serde_json::to_value(schema::payload()).unwrap();
        for constraint in ["type", "anyOf", "$ref", "items", "properties"] {
            assert!(schema.get(constraint).is_none(), "any JSON value: {schema}");
        }
        let description = schema["description"].as_str().unwrap_or_default();
        for limit in ["NUL", "1e300", "8192 bytes", "default null"] {
            assert!(description.contains(limit), "{limit}: {schema}");
        }
    }

    #[test]
    fn exact_ids_travel_as_strings_and_read_from_strings_or_integers() {
        #[derive(serde::Serialize, serde::Deserialize, Debug, PartialEq)]
        struct Carrier {
            #[serde(
                default,
                serialize_with = "exact_id::optional_string",
                deserialize_with = "exact_id::optional"
            )]
            id: Option<i64>,
        }
        let beyond_a_double = 863_254_688_558_838_201_i64;
        let written = serde_json::to_value(Carrier {
            id: Some(beyond_a_double),
        })
        .unwrap();
        assert_eq!(written, json!({"id": "863254688558838201"}));
        assert_eq!(
            serde_json::to_value(Carrier { id: None }).unwrap(),
            json!({"id": null})
        );
        let read = |body: &str| serde_json::from_str::<Carrier>(body).map(|c| c.id);
        assert_eq!(
            read(r#"{"id": "863254688558838201"}"#).unwrap(),
            Some(beyond_a_double)
        );
        assert_eq!(
            read(r#"{"id": 863254688558838201}"#).unwrap(),
            Some(beyond_a_double)
        );
        assert_eq!(read(r#"{"id": "-5"}"#).unwrap(), Some(-5));
        assert_eq!(read(r#"{"id": 7.0}"#).unwrap(), Some(7));
        assert_eq!(read(r#"{"id": null}"#).unwrap(), None);
        assert_eq!(read("{}").unwrap(), None);
        for refused in [
            r#"{"id": ""}"#,
            r#"{"id": "-"}"#,
            r#"{"id": "12a"}"#,
            r#"{"id": " 12"}"#,
            r#"{"id": "+12"}"#,
            r#"{"id": "99999999999999999999"}"#,
            r#"{"id": "9223372036854775808"}"#,
            r#"{"id": 7.5}"#,
            r#"{"id": true}"#,
        ] {
            assert!(read(refused).is_err(), "{refused}");
        }
        let schema = serde_json::to_value(exact_id::optional_schema()).unwrap();
        assert_eq!(schema["type"], json!(["string", "null"]));
        assert_eq!(schema["pattern"], exact_id::PATTERN);
    }

    #[test]
    fn lone_surrogates_are_recognised_from_the_parser() {
        for body in [
            r#"{"a": "\ud800"}"#,
            r#"{"a": "\udc00"}"#,
            r#"{"a": "\ud800x"}"#,
            r#"{"a": "\ud800\u0041"}"#,
        ] {
            let error = serde_json::from_str::<Value>(body).unwrap_err();
            assert!(is_lone_surrogate(&error.to_string()), "{body}: {error}");
        }
        let other = serde_json::from_str::<Value>(r#"{"a": }"#).unwrap_err();
        assert!(!is_lone_surrogate(&other.to_string()));
    }
}
