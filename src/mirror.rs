//! A replica's in-memory copy of something the database holds: the catalog,
//! the key ring (design.md §4, §6).
//!
//! Several tasks reload a copy: the listener on every notification, the
//! periodic sync, an admin write on its own replica. Loads overlap, and a load
//! that read the tables before a change could finish after one that read them
//! after it; stored last, the older copy would undo a flip or a revocation
//! until the next sync. So a reload reads and stores under one lock: the copy
//! stored last is always the one read last.

use std::future::Future;
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

#[derive(Default)]
pub(crate) struct Mirror<T> {
    current: Arc<RwLock<T>>,
    reloading: Arc<tokio::sync::Mutex<()>>,
    /// When the copy was last loaded; `None` before the first load.
    loaded_at: Arc<RwLock<Option<Instant>>>,
}

impl<T> Clone for Mirror<T> {
    fn clone(&self) -> Self {
        Self {
            current: self.current.clone(),
            reloading: self.reloading.clone(),
            loaded_at: self.loaded_at.clone(),
        }
    }
}

impl<T> Mirror<T> {
    /// Reads the current copy without waiting for a reload in progress.
    pub fn read<R>(&self, f: impl FnOnce(&T) -> R) -> R {
        f(&self.current.read().unwrap_or_else(|p| p.into_inner()))
    }

    /// Loads a fresh copy with `load` and stores it, after any reload that
    /// started before this one. A failed load stores nothing.
    pub async fn reload<E, F>(&self, load: F) -> Result<(), E>
    where
        F: Future<Output = Result<T, E>>,
    {
        let _in_turn = self.reloading.lock().await;
        let started = Instant::now();
        let fresh = load.await?;
        *self.current.write().unwrap_or_else(|p| p.into_inner()) = fresh;
        // As old as the moment it began to read: a load that waited on a
        // lock for a minute brings a copy a minute old at best.
        *self.loaded_at.write().unwrap_or_else(|p| p.into_inner()) = Some(started);
        Ok(())
    }

    /// How long ago the current copy began to be read; `None` before the
    /// first load.
    pub fn age(&self) -> Option<Duration> {
        let loaded_at = *self.loaded_at.read().unwrap_or_else(|p| p.into_inner());
        loaded_at.map(|at| at.elapsed())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    /// A load that read the old state and is slow to finish must not land
    /// after a later load that read the new state.
    #[tokio::test]
    async fn a_slow_stale_load_never_overwrites_a_later_one() {
        let mirror = Mirror::<&'static str>::default();
        let (read_old, old_may_finish) = (tokio::sync::Notify::new(), tokio::sync::Notify::new());
        let stale = async {
            mirror
                .reload(async {
                    read_old.notify_one();
                    old_may_finish.notified().await;
                    Ok::<_, ()>("before the revocation")
                })
                .await
        };
        let fresh = async {
            read_old.notified().await;
            let reload = mirror.reload(async { Ok::<_, ()>("after the revocation") });
            let release_stale = async {
                // Unlocked, the fresh load would have stored by now.
                tokio::time::sleep(Duration::from_millis(20)).await;
                old_may_finish.notify_one();
            };
            tokio::join!(reload, release_stale).0
        };
        let (a, b) = tokio::join!(stale, fresh);
        assert_eq!((a, b), (Ok(()), Ok(())));
        assert_eq!(mirror.read(|v| *v), "after the revocation");
    }

    #[tokio::test]
    async fn a_failed_load_keeps_the_copy() {
        let mirror = Mirror::<u32>::default();
        mirror.reload(async { Ok::<_, ()>(7) }).await.unwrap();
        assert_eq!(
            mirror.reload(async { Err::<u32, _>("down") }).await,
            Err("down")
        );
        assert_eq!(mirror.read(|v| *v), 7);
    }
}
