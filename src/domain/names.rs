//! Names of quotas and flows (design.md §2), parsed once where they come in —
//! a request's body, path or query, a command's argument — so that
//! past that edge a [`QuotaName`] or a [`FlowName`] is known to be one, and
//! a flow's name cannot be passed where a quota's is meant. The alphabet is
//! `crate::domain::input::name`'s (the tables check the same).

use std::fmt;
use std::ops::Deref;
use std::str::FromStr;

macro_rules! name_type {
    ($(#[$doc:meta])* $name:ident) => {
        $(#[$doc])*
        #[derive(Clone, Debug, PartialEq, Eq, Hash)]
        pub struct $name(String);

        impl $name {
            /// The name, if `value` is one: what it is not, otherwise.
            pub fn parse(value: impl Into<String>) -> Result<Self, String> {
                let value = value.into();
                crate::domain::input::name(&value)?;
                Ok(Self(value))
            }

            /// A name read back from the store: its tables check the same
            /// alphabet on the way in (`CHECK (name ~ …)`), so it is not
            /// parsed a second time.
            pub(crate) fn of_row(value: String) -> Self {
                Self(value)
            }

            pub fn as_str(&self) -> &str {
                &self.0
            }

            pub fn into_string(self) -> String {
                self.0
            }
        }

        impl Deref for $name {
            type Target = str;

            fn deref(&self) -> &str {
                &self.0
            }
        }


        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }

        /// For command-line arguments.
        impl FromStr for $name {
            type Err = String;

            fn from_str(value: &str) -> Result<Self, String> {
                Self::parse(value)
            }
        }



        impl PartialEq<&str> for $name {
            fn eq(&self, other: &&str) -> bool {
                self.0 == *other
            }
        }
    };
}

name_type!(
    /// A quota's name: a budget a third party imposes (`ppf`, `llm-tokens`).
    QuotaName
);
name_type!(
    /// A flow's name: a kind of work that spends a quota (`invoice`).
    FlowName
);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_name_is_parsed_by_the_names_alphabet() {
        assert_eq!(FlowName::parse("invoice").unwrap().as_str(), "invoice");
        assert_eq!(
            &*QuotaName::parse("ppf/v2:eu-1.b_c").unwrap(),
            "ppf/v2:eu-1.b_c"
        );
        for bad in ["", "-x", "a b", "in\u{0}voice", &"n".repeat(129)] {
            assert!(FlowName::parse(bad).is_err(), "{bad:?}");
            assert!(bad.parse::<QuotaName>().is_err(), "{bad:?}");
        }
    }
}
