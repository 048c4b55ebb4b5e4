//! Opening a vhost's storage: replaying its definitions at boot, opening (or creating) the logs
//! behind its queues and streams, and removing the logs no durable queue owns.

use std::sync::Arc;

use warren_protocol::method::QueueDeclare;

use super::{ExchangeSpec, Storage, VHost};
use crate::definitions::{self, Definition, DefinitionsStore};
use crate::error::{AmqpError, AmqpResult};
use crate::queue::{Backing, Queue, QueueArgs, QueueLogOf, QueueOptions, QueueRef};

impl VHost {
    /// A vhost whose durable definitions and messages live under `storage.dir`; what is there
    /// from an earlier run is loaded.
    pub fn open(name: &str, storage: Storage) -> std::io::Result<Arc<VHost>> {
        std::fs::create_dir_all(storage.dir.join("queues"))?;
        // Scratch logs hold non-durable queues' paged-out messages: nothing there outlives a run.
        let _ = std::fs::remove_dir_all(storage.dir.join("scratch"));
        let store = definitions::FileStore::new(&storage.dir, name);
        let defs = store.load()?;
        let v = Self::with_storage(name, Some(storage), Some(Box::new(store)), None);
        v.loading.store(true, std::sync::atomic::Ordering::Relaxed);
        let (mut queues, mut messages) = (0usize, 0u64);
        for d in defs {
            let r = match d {
                Definition::Generation(_) => Ok(()),
                Definition::ExchangeDelete(x) => v.delete_exchange(&x.exchange, false),
                Definition::QueueDelete(q) => {
                    v.delete_queue(&q.queue, false, false, None).map(|_| ())
                }
                Definition::QueueUnbind(b) => v.bind_queue(
                    &b.queue,
                    &b.exchange,
                    &b.routing_key,
                    &b.arguments,
                    false,
                    None,
                ),
                Definition::ExchangeUnbind(b) => v.bind_exchange(
                    &b.destination,
                    &b.source,
                    &b.routing_key,
                    &b.arguments,
                    false,
                ),
                Definition::Exchange(x) => v.declare_exchange(&ExchangeSpec {
                    name: &x.exchange,
                    kind: &x.kind,
                    passive: false,
                    durable: true,
                    auto_delete: x.auto_delete,
                    internal: x.internal,
                    arguments: &x.arguments,
                }),
                Definition::Queue(id, q) => v.restore_queue(id, &q).map(|n| {
                    queues += 1;
                    messages += n;
                }),
                Definition::QueueBind(b) => v.bind_queue(
                    &b.queue,
                    &b.exchange,
                    &b.routing_key,
                    &b.arguments,
                    true,
                    None,
                ),
                Definition::ExchangeBind(b) => v.bind_exchange(
                    &b.destination,
                    &b.source,
                    &b.routing_key,
                    &b.arguments,
                    true,
                ),
            };
            if let Err(e) = r {
                tracing::warn!(vhost = name, error = %e.text, "skipping a stored definition");
            }
        }
        v.loading.store(false, std::sync::atomic::Ordering::Relaxed);
        v.remove_orphan_logs();
        v.recover_delayed();
        // Compacts: one snapshot of what was recovered, and an empty journal after it.
        if let Err(e) = v.save(&v.defs.lock()) {
            // What was read stays valid on disk; each change will retry the rewrite.
            tracing::error!(vhost = name, error = %e, "cannot compact the definitions at boot");
        }
        tracing::info!(vhost = name, queues, messages, "vhost recovered");
        Ok(v)
    }

    /// What backs a new or recovered queue: a durable queue's log `id` (opened here, with what
    /// it recovered), or a place for a scratch log. `None` without storage.
    pub(super) fn backing(&self, durable_id: Option<u64>) -> Option<std::io::Result<Backing>> {
        let storage = self.storage.as_ref()?;
        let persister = storage.persister.clone();
        Some(match durable_id {
            Some(id) => {
                let dir = storage.dir.join("queues").join(format!("{id:016x}"));
                crate::queue::Log::open(&dir, crate::persist::stored_body_len).map(|(log, rec)| {
                    Backing {
                        persister,
                        durable: Some((id, QueueLogOf::Store(log), rec)),
                        scratch: None,
                    }
                })
            }
            None => {
                let dir = storage
                    .dir
                    .join("scratch")
                    .join(format!("{:016x}", rand::random::<u64>()));
                Ok(Backing {
                    persister,
                    durable: None,
                    scratch: Some(Box::new(move || {
                        let (mut log, _) =
                            crate::queue::Log::open(&dir, crate::persist::stored_body_len)?;
                        log.set_scratch();
                        Ok(QueueLogOf::Store(log))
                    })),
                })
            }
        })
    }

    /// Creates or recovers the stream whose log is `queues/<id>` (streams need a data directory).
    pub(super) fn open_stream(
        &self,
        name: Arc<str>,
        opts: QueueOptions,
        id: u64,
    ) -> AmqpResult<QueueRef> {
        let Some(storage) = self.storage.as_ref() else {
            return Err(AmqpError::internal_error(format!(
                "cannot create stream '{name}': the broker has no data directory"
            )));
        };
        let dir = storage.dir.join("queues").join(format!("{id:016x}"));
        crate::queue::stream::Stream::open(
            name.clone(),
            self.name.clone(),
            opts,
            id,
            dir,
            storage.persister.clone(),
        )
        .map(QueueRef::Stream)
        .map_err(|e| {
            AmqpError::internal_error(format!("cannot open the log of stream '{name}': {e}"))
        })
    }

    /// Recreates a durable queue from the definitions file with the messages in its log.
    fn restore_queue(self: &Arc<Self>, id: u64, d: &QueueDeclare) -> AmqpResult<u64> {
        let args = QueueArgs::parse(
            &d.arguments,
            &format!("queue '{}' in vhost '{}'", d.queue, self.name),
        )?;
        let opts = QueueOptions {
            durable: true,
            exclusive_owner: None,
            auto_delete: d.auto_delete,
            arguments: d.arguments.clone(),
            args,
        };
        if crate::queue::args::is_stream(&d.arguments) {
            let name: Arc<str> = (&*d.queue).into();
            let q = self.open_stream(name.clone(), opts, id)?;
            let n = q.message_count() as u64;
            let mut defs = self.defs.lock();
            defs.queues.insert(name, q);
            self.publish_snapshot(&defs);
            return Ok(n);
        }
        let name: Arc<str> = (&*d.queue).into();
        if let Some(q) = self.open_on_machine(&name, &opts, Some(id)) {
            let mut defs = self.defs.lock();
            defs.queues.insert(name, q);
            self.publish_snapshot(&defs);
            return Ok(0);
        }
        let backing = match self.backing(Some(id)) {
            Some(Ok(b)) => Some(b),
            Some(Err(e)) => {
                return Err(AmqpError::internal_error(format!(
                    "cannot open the log of queue '{}': {e}",
                    d.queue
                )))
            }
            None => None,
        };
        let n = backing
            .as_ref()
            .and_then(|b| b.durable.as_ref())
            .map_or(0, |(_, _, rec)| rec.count as u64);
        let name: Arc<str> = (&*d.queue).into();
        let q = QueueRef::Local(Queue::with_log(
            name.clone(),
            self.name.clone(),
            opts,
            Arc::downgrade(self),
            backing,
        ));
        let mut defs = self.defs.lock();
        defs.queues.insert(name, q);
        self.publish_snapshot(&defs);
        Ok(n)
    }

    /// A quorum queue outside a cluster, on the replicated queue machine (a group of one member
    /// under its queue directory's `group/`): a new one (`id` none), or a recovered one. One
    /// recovered with a classic log (an earlier release's form) is carried over into a new
    /// group (`replicated/legacy.rs`); if that cannot start, it stays a classic queue (logged).
    pub(super) fn open_on_machine(
        self: &Arc<Self>,
        name: &Arc<str>,
        opts: &QueueOptions,
        id: Option<u64>,
    ) -> Option<QueueRef> {
        let storage = self.storage.as_ref()?;
        let me = storage.quorum_on_machine.clone()?;
        if self.cluster.is_some() || !crate::queue::args::is_quorum(&opts.arguments) {
            return None;
        }
        let id = id.unwrap_or_else(rand::random::<u64>);
        let dir = storage.dir.join("queues").join(format!("{id:016x}"));
        let carry = match crate::replicated::legacy::single_node_seed(&dir) {
            Ok(c) => c,
            Err(e) => {
                // Left as it is, on the earlier form: nothing is lost.
                tracing::error!(vhost = %self.name, queue = %name, error = %e, "cannot carry a quorum queue of the earlier form over to the queue machine; it stays a classic queue");
                return None;
            }
        };
        if let Some(c) = &carry {
            tracing::info!(vhost = %self.name, queue = %name, messages = c.legacy.len(), "a quorum queue of the earlier form is carried over to the queue machine");
        }
        let owner: std::sync::Weak<dyn crate::queue::QueueOwner> = Arc::downgrade(self) as _;
        let mut at = crate::replicated::Placement::alone(id, me);
        at.carry = carry;
        Some(QueueRef::Other(crate::replicated::ReplicatedQueue::open(
            name.clone(),
            self.name.clone(),
            opts.clone(),
            Some(id),
            dir.join("group"),
            owner,
            at,
        )))
    }

    /// Deletes queue log directories that no durable queue owns (left by non-durable state or
    /// a crash between creating a log and recording its queue).
    fn remove_orphan_logs(&self) {
        let Some(storage) = &self.storage else { return };
        let owned: std::collections::HashSet<String> = self
            .defs
            .lock()
            .queues
            .values()
            .filter_map(|q| q.store_id())
            .map(|id| format!("{id:016x}"))
            .collect();
        let Ok(entries) = std::fs::read_dir(storage.dir.join("queues")) else {
            return;
        };
        for e in entries.flatten() {
            if !owned.contains(e.file_name().to_string_lossy().as_ref()) {
                let _ = std::fs::remove_dir_all(e.path());
            }
        }
    }
}
