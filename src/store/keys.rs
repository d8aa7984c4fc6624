//! API keys and the leases they took (design.md §4): statements only; the
//! rules live in `crate::auth`.

use std::time::Duration;

use chrono::{DateTime, Utc};

use super::Store;

/// A key as `keys list` shows it: never its secret.
#[derive(Clone, Debug)]
pub struct KeyRow {
    pub id: i64,
    pub name: Option<String>,
    pub role: String,
    pub tenant: Option<String>,
    pub created_at: DateTime<Utc>,
    pub revoked_at: Option<DateTime<Utc>>,
}

/// A key a replica accepts, as the key ring holds it.
#[derive(Clone, Debug)]
pub struct ActiveKey {
    pub id: i64,
    pub role: String,
    pub tenant: Option<String>,
    pub hash: Vec<u8>,
}

impl Store {
    pub async fn create_key(
        &self,
        name: Option<&str>,
        role: &str,
        tenant: Option<&str>,
        hash: &[u8],
    ) -> Result<(i64, DateTime<Utc>), sqlx::Error> {
        let row = sqlx::query_file!("sql/key_create.sql", name, role, tenant, hash)
            .fetch_one(self.pool())
            .await?;
        Ok((row.id, row.created_at))
    }

    pub(crate) async fn list_keys(&self) -> Result<Vec<KeyRow>, sqlx::Error> {
        sqlx::query_file_as!(KeyRow, "sql/key_list.sql")
            .fetch_all(self.pool())
            .await
    }

    /// When the key was revoked; `None`: there is no such key.
    pub(crate) async fn revoke_key(&self, id: i64) -> Result<Option<DateTime<Utc>>, sqlx::Error> {
        let row = sqlx::query_file!("sql/key_revoke.sql", id)
            .fetch_optional(self.pool())
            .await?;
        Ok(row.map(|r| r.revoked_at))
    }

    pub(crate) async fn active_keys(&self) -> Result<Vec<ActiveKey>, sqlx::Error> {
        sqlx::query_file_as!(ActiveKey, "sql/keys_active.sql")
            .fetch_all(self.pool())
            .await
    }

    pub async fn hold_leases(&self, lease_ids: &[i64], key_id: i64) -> Result<(), sqlx::Error> {
        sqlx::query_file!("sql/lease_hold.sql", lease_ids, key_id)
            .execute(self.pool())
            .await?;
        Ok(())
    }

    pub async fn lease_holder(&self, lease_id: i64) -> Result<Option<i64>, sqlx::Error> {
        let row = sqlx::query_file!("sql/lease_holder.sql", lease_id)
            .fetch_optional(self.pool())
            .await?;
        Ok(row.map(|r| r.key_id))
    }

    pub async fn prune_lease_holders(
        &self,
        retention: Duration,
        batch: i64,
    ) -> Result<u64, sqlx::Error> {
        let pruned =
            sqlx::query_file!("sql/lease_holder_prune.sql", retention.as_secs_f64(), batch)
                .execute(self.pool())
                .await?;
        Ok(pruned.rows_affected())
    }
}
