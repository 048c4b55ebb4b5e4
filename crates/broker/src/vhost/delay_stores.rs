//! The vhost's registry of delay stores: one per `x-delayed-message` exchange and one per queue
//! that delays its retries, opened on first use (or at boot, for durable ones). Invariant: a
//! store lives only while its delayed exchange or its queue does (`prune_delayed` after each
//! change drops the others, with their messages).

use std::sync::Arc;

use super::{Snapshot, VHost};
use crate::delayed::DelayStore;
use crate::queue::QueueRef;

impl VHost {
    /// The store of delayed exchange `exchange`, opened on first use; `None` when there is no
    /// such exchange or it cannot be opened.
    pub fn delay_store(self: &Arc<Self>, exchange: &str) -> Option<Arc<DelayStore>> {
        let mut stores = self.delayed.lock();
        if let Some(s) = stores.get(exchange) {
            return Some(s.clone());
        }
        let snap = self.snapshot.load();
        let x = snap.table.exchanges.get(exchange).filter(|x| x.delayed)?;
        let dir = self.storage.as_ref().map(|st| {
            st.dir
                .join("delayed")
                .join(crate::delayed::dir_name(exchange))
        });
        let persister = self.storage.as_ref().map(|st| st.persister.clone());
        match DelayStore::open(self, exchange, false, dir, persister, x.durable) {
            Ok(s) => {
                stores.insert(x.name.clone(), s.clone());
                Some(s)
            }
            Err(e) => {
                tracing::error!(vhost = %self.name, exchange, error = %e, "cannot open the delayed message store");
                None
            }
        }
    }

    /// The store holding queue `queue`'s delayed retries, opened on first use.
    pub fn retry_store(self: &Arc<Self>, queue: &str) -> Option<Arc<DelayStore>> {
        let mut stores = self.retry.lock();
        if let Some(s) = stores.get(queue) {
            return Some(s.clone());
        }
        let q = self.snapshot.load().queues.get(queue)?.clone();
        let dir = self.storage.as_ref().map(|st| {
            st.dir
                .join("delayed")
                .join(format!("q-{}", crate::delayed::dir_name(queue)))
        });
        let persister = self.storage.as_ref().map(|st| st.persister.clone());
        let durable = q.options().durable;
        match DelayStore::open(self, queue, true, dir, persister, durable) {
            Ok(s) => {
                stores.insert(q.name().clone(), s.clone());
                Some(s)
            }
            Err(e) => {
                tracing::error!(vhost = %self.name, queue, error = %e, "cannot open the delayed retry store");
                None
            }
        }
    }

    /// Drops the stores of delayed exchanges and retrying queues that are gone (and their
    /// messages, as the plugin drops a deleted exchange's).
    pub(super) fn prune_delayed(&self, defs: &Snapshot) {
        let mut stores = self.delayed.lock();
        if !stores.is_empty() {
            stores.retain(|name, store| {
                let keep = defs.table.exchanges.get(name).is_some_and(|x| x.delayed);
                if !keep {
                    store.destroy();
                }
                keep
            });
        }
        drop(stores);
        let mut stores = self.retry.lock();
        if !stores.is_empty() {
            stores.retain(|name, store| {
                let keep = defs.queues.contains_key(name);
                if !keep {
                    store.destroy();
                }
                keep
            });
        }
    }

    /// Messages held by delayed exchange `exchange`.
    pub fn delayed_count(&self, exchange: &str) -> u64 {
        self.delayed.lock().get(exchange).map_or(0, |s| s.len())
    }

    /// Opens every durable delayed exchange's store (recovering its messages) and removes the
    /// files of any other.
    pub(super) fn recover_delayed(self: &Arc<Self>) {
        let Some(storage) = &self.storage else { return };
        let names: Vec<Arc<str>> = self
            .snapshot
            .load()
            .table
            .exchanges
            .values()
            .filter(|x| x.delayed && x.durable)
            .map(|x| x.name.clone())
            .collect();
        let mut keep = std::collections::HashSet::new();
        for n in names {
            if self.delay_store(&n).is_some() {
                keep.insert(crate::delayed::dir_name(&n));
            }
        }
        let Ok(entries) = std::fs::read_dir(storage.dir.join("delayed")) else {
            return;
        };
        for e in entries.flatten() {
            let dir = e.file_name().to_string_lossy().into_owned();
            if let Some(hash) = dir.strip_prefix("q-") {
                // A durable queue's retries: kept while the queue is.
                let name = std::fs::read_to_string(e.path().join("name")).unwrap_or_default();
                let durable = self
                    .snapshot
                    .load()
                    .queues
                    .get(name.as_str())
                    .is_some_and(|q| q.options().durable);
                if durable
                    && crate::delayed::dir_name(&name) == hash
                    && self.retry_store(&name).is_some()
                {
                    continue;
                }
            } else if keep.contains(&dir) {
                continue;
            }
            let _ = std::fs::remove_dir_all(e.path());
        }
    }
}

/// A delay store routes what comes due through its vhost.
impl crate::delayed::DueRoutes for VHost {
    fn name(&self) -> &Arc<str> {
        &self.name
    }
    fn route_due(&self, exchange: &str, msg: &crate::message::Message, out: &mut Vec<QueueRef>) {
        VHost::route_due(self, exchange, msg, out)
    }
    fn queue(&self, name: &str) -> Option<QueueRef> {
        VHost::queue(self, name)
    }
}
