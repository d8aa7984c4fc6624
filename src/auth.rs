//! Who may call what (design.md §4): API keys, their roles, and the one table
//! from a route to the least role that may call it. Pure rules here; the
//! middleware in `http::auth` and the key ring's refresh are the I/O around them.

use std::collections::HashMap;

use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use crate::domain::Secret;
pub use crate::domain::{Access, AuthMode, Role};
use crate::mirror::Mirror;
use crate::store::{ActiveKey, Store};

/// What every key starts with, so a leaked one is recognisable (secret scanners).
pub(crate) const KEY_PREFIX: &str = "qa_";
/// 256 random bits per key.
const KEY_BYTES: usize = 32;

/// A caller that presented a key the replica accepts.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Principal {
    /// `None`: the bootstrap admin token, which is no stored key.
    pub key_id: Option<i64>,
    pub role: Role,
    pub tenant: Option<String>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Denied {
    /// No key, or one nobody issued (or revoked): 401.
    Unauthenticated,
    /// A key whose role is below the route's: 403.
    Forbidden { needed: Role },
}

/// Whether `caller` may call a route that needs `access`.
pub(crate) fn authorize(access: Access, caller: Option<&Principal>) -> Result<(), Denied> {
    match (access, caller) {
        (Access::Open, _) => Ok(()),
        (Access::AtLeast(_), None) => Err(Denied::Unauthenticated),
        (Access::AtLeast(needed), Some(caller)) if caller.role < needed => {
            Err(Denied::Forbidden { needed })
        }
        (Access::AtLeast(_), Some(_)) => Ok(()),
    }
}

/// Only the key that took a lease frees it, or an admin. A lease with no
/// recorded holder (taken in `open` mode, or its record pruned) is an admin's.
pub(crate) fn may_release(caller: &Principal, holder: Option<i64>) -> bool {
    caller.role == Role::Admin || (caller.key_id.is_some() && caller.key_id == holder)
}

/// A new key: the prefix and 256 bits from the operating system's generator.
pub fn new_key() -> std::io::Result<String> {
    let mut bytes = [0u8; KEY_BYTES];
    getrandom::getrandom(&mut bytes).map_err(std::io::Error::other)?;
    Ok(format!("{KEY_PREFIX}{}", hex::encode(bytes)))
}

/// What is stored of a key. One SHA-256 is enough here, unlike for a
/// password: a key carries 256 random bits, so there is no dictionary to try
/// and no faster way in than guessing 2^256 values; a deliberately slow hash
/// (argon2, bcrypt) would add nothing but its cost to every request.
pub fn key_hash(key: &str) -> [u8; 32] {
    Sha256::digest(key.as_bytes()).into()
}

/// The keys this replica accepts, by hash: checking a key costs a hash and a
/// map lookup, no round trip. Refreshed with the catalog, on its notification.
#[derive(Clone, Default)]
pub struct KeyRing {
    keys: Mirror<HashMap<[u8; 32], Principal>>,
}

impl KeyRing {
    /// Reloads the ring, in turn with every other reload (`Mirror`): a
    /// revocation is never undone by a load that read before it.
    pub(crate) async fn refresh(&self, store: &Store) -> Result<(), sqlx::Error> {
        let load = async {
            let keys = store.active_keys().await?;
            Ok(keys.into_iter().filter_map(accepted).collect())
        };
        self.keys.reload(load).await
    }

    /// How long ago the ring was loaded; `None` before the first load.
    pub(crate) fn age(&self) -> Option<std::time::Duration> {
        self.keys.age()
    }

    /// The caller an `Authorization` header names: a stored key or the
    /// bootstrap admin token.
    pub fn caller(&self, authorization: Option<&str>, token: Option<&Secret>) -> Option<Principal> {
        let presented = authorization?.strip_prefix("Bearer ")?.trim();
        // Constant-time, so the comparison does not leak how much matched.
        if token.is_some_and(|t| bool::from(presented.as_bytes().ct_eq(t.expose().as_bytes()))) {
            return Some(Principal {
                key_id: None,
                role: Role::Admin,
                tenant: None,
            });
        }
        // The lookup is by hash: timing can tell at most about the hash of a
        // wrong key, nothing about a right one.
        let hash = key_hash(presented);
        self.keys.read(|keys| keys.get(&hash).cloned())
    }
}

/// A stored key as the ring holds it; one with a role this build does not
/// know (the table's CHECK allows none) is refused rather than guessed at.
fn accepted(key: ActiveKey) -> Option<([u8; 32], Principal)> {
    let hash: [u8; 32] = key.hash.try_into().ok()?;
    let role = key.role.parse().ok()?;
    Some((
        hash,
        Principal {
            key_id: Some(key.id),
            role,
            tenant: key.tenant,
        },
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(id: i64, role: Role) -> Principal {
        Principal {
            key_id: Some(id),
            role,
            tenant: None,
        }
    }

    #[test]
    fn a_role_passes_where_it_reaches_and_no_further() {
        let order = [Role::Operator, Role::Worker, Role::Admin];
        for (i, needed) in order.iter().enumerate() {
            for (j, role) in order.iter().enumerate() {
                let answer = authorize(Access::AtLeast(*needed), Some(&key(1, *role)));
                if j >= i {
                    assert_eq!(answer, Ok(()), "{role} on a {needed} route");
                } else {
                    assert_eq!(answer, Err(Denied::Forbidden { needed: *needed }));
                }
            }
        }
    }

    #[test]
    fn no_key_is_unauthenticated_except_on_open_routes() {
        assert_eq!(
            authorize(Access::AtLeast(Role::Operator), None),
            Err(Denied::Unauthenticated)
        );
        assert_eq!(authorize(Access::Open, None), Ok(()));
    }

    #[test]
    fn only_the_taker_or_an_admin_frees_a_lease() {
        assert!(may_release(&key(1, Role::Worker), Some(1)));
        assert!(!may_release(&key(2, Role::Worker), Some(1)));
        assert!(!may_release(&key(2, Role::Worker), None));
        assert!(may_release(&key(3, Role::Admin), Some(1)));
        assert!(may_release(&key(3, Role::Admin), None));
        let token = Principal {
            key_id: None,
            role: Role::Admin,
            tenant: None,
        };
        assert!(may_release(&token, Some(1)));
    }

    #[test]
    fn keys_are_long_random_and_recognisable() {
        let (a, b) = (new_key().unwrap(), new_key().unwrap());
        assert!(a.starts_with(KEY_PREFIX));
        assert_eq!(a.len(), KEY_PREFIX.len() + 2 * KEY_BYTES);
        assert_ne!(a, b);
        assert_ne!(key_hash(&a), key_hash(&b));
    }

    #[test]
    fn the_bootstrap_token_is_an_admin_and_unknown_keys_are_nobody() {
        let ring = KeyRing::default();
        let token = Secret("bootstrap".into());
        let caller = ring.caller(Some("Bearer bootstrap"), Some(&token)).unwrap();
        assert_eq!(caller.role, Role::Admin);
        assert_eq!(caller.key_id, None);
        assert_eq!(ring.caller(Some("Bearer bootstra"), Some(&token)), None);
        assert_eq!(ring.caller(Some("bootstrap"), Some(&token)), None);
        assert_eq!(ring.caller(None, Some(&token)), None);
    }
}
