//! `quota-arbiter keys`: API keys, straight in the database like every
//! operator command, so they work with no replica running.

use crate::auth::{self, Role};
use crate::cli::KeysCommand;
use crate::domain::catalog::validate_name;
use crate::store::Store;

pub async fn run(store: &Store, command: KeysCommand) -> anyhow::Result<()> {
    match command {
        KeysCommand::Create { role, tenant, name } => {
            create(store, role, tenant.as_deref(), name.as_deref()).await
        }
        KeysCommand::List => list(store).await,
        KeysCommand::Revoke { id } => revoke(store, id).await,
    }
}

/// Prints the key alone on stdout (for scripts) and what it is on stderr.
async fn create(
    store: &Store,
    role: Role,
    tenant: Option<&str>,
    name: Option<&str>,
) -> anyhow::Result<()> {
    for (what, value) in [("--tenant", tenant), ("--name", name)] {
        if let Some(value) = value {
            validate_name(value).map_err(|why| anyhow::anyhow!("{what} {why}"))?;
        }
    }
    let key = auth::new_key()?;
    let (id, _) = store
        .create_key(name, role.as_str(), tenant, &auth::key_hash(&key))
        .await?;
    eprintln!("key {id} created ({role}); it is shown once, here, and never stored");
    println!("{key}");
    Ok(())
}

async fn list(store: &Store) -> anyhow::Result<()> {
    let keys = store.list_keys().await?;
    println!(
        "{:>6} {:<9} {:<16} {:<24} {:<20} revoked",
        "id", "role", "tenant", "name", "created"
    );
    let time = |t: chrono::DateTime<chrono::Utc>| t.format("%Y-%m-%d %H:%M:%S").to_string();
    for key in &keys {
        println!(
            "{:>6} {:<9} {:<16} {:<24} {:<20} {}",
            key.id,
            key.role,
            key.tenant.as_deref().unwrap_or("-"),
            key.name.as_deref().unwrap_or("-"),
            time(key.created_at),
            key.revoked_at.map_or_else(|| "-".to_string(), time),
        );
    }
    if keys.is_empty() {
        println!("(no keys)");
    }
    Ok(())
}

async fn revoke(store: &Store, id: i64) -> anyhow::Result<()> {
    match store.revoke_key(id).await? {
        Some(at) => {
            println!("key {id} revoked at {}", at.format("%Y-%m-%d %H:%M:%S"));
            Ok(())
        }
        None => Err(anyhow::anyhow!("no key {id}")),
    }
}
