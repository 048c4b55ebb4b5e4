//! What the definitions store records: the durable definitions a change adds or removes, and
//! the whole set for a compaction. Invariant: a change is journaled before its snapshot is
//! published, and refused (541) when it cannot be, so a client never gets an ok for a
//! definition a restart would lose.

use warren_protocol::method::{
    ExchangeBind, ExchangeDeclare, ExchangeUnbind, QueueBind, QueueDeclare, QueueUnbind,
};
use warren_protocol::FieldTable;
use warren_routing::{Destination, Exchange};

use super::{Snapshot, VHost};
use crate::definitions::Definition;
use crate::error::{AmqpError, AmqpResult};
use crate::queue::QueueRef;

impl VHost {
    /// Journals the changes to durable definitions (`ops`), then publishes the new snapshot.
    /// When they cannot be written, `defs` goes back to the published snapshot and the change
    /// fails with 541: a client never gets an ok for a definition a restart would lose.
    pub(super) fn changed(&self, defs: &mut Snapshot, ops: Vec<Definition>) -> AmqpResult<()> {
        if !ops.is_empty() {
            if let Err(e) = self.journal(defs, &ops) {
                tracing::error!(vhost = %self.name, error = %e, "cannot write the definitions; change refused");
                *defs = Snapshot::clone(&self.snapshot.load());
                return Err(AmqpError::internal_error(format!(
                    "cannot write the definitions of vhost '{}': {e}",
                    self.name
                )));
            }
        }
        self.publish_snapshot(defs);
        self.prune_delayed(defs);
        Ok(())
    }

    /// Records changes to durable definitions in the store (not while replaying it at boot).
    fn journal(&self, defs: &Snapshot, ops: &[Definition]) -> std::io::Result<()> {
        if self.loading.load(std::sync::atomic::Ordering::Relaxed) {
            return Ok(());
        }
        match &self.store {
            Some(store) => store.append(ops, &|| Self::all_definitions(defs)),
            None => Ok(()),
        }
    }

    /// Queues whose definition is kept across restarts (RabbitMQ drops exclusive ones).
    pub(super) fn kept(q: &QueueRef) -> bool {
        q.options().durable && q.options().exclusive_owner.is_none()
    }

    /// Replaces what the store holds with every durable definition (a compaction).
    pub(super) fn save(&self, defs: &Snapshot) -> std::io::Result<()> {
        if self.loading.load(std::sync::atomic::Ordering::Relaxed) {
            return Ok(());
        }
        match &self.store {
            Some(store) => store.compact(Self::all_definitions(defs)),
            None => Ok(()),
        }
    }

    /// Every durable definition, in the order recovery replays them: exchanges, queues, then
    /// bindings (each sorted by name, so equal states write equal files).
    fn all_definitions(defs: &Snapshot) -> Vec<Definition> {
        let mut out = Vec::new();
        let mut xs: Vec<_> = defs.table.exchanges.values().collect();
        xs.sort_by(|a, b| a.name.cmp(&b.name));
        out.extend(xs.into_iter().filter_map(|x| Self::exchange_def(x)));
        let mut qs: Vec<_> = defs.queues.values().collect();
        qs.sort_by(|a, b| a.name().cmp(b.name()));
        out.extend(qs.into_iter().filter_map(Self::queue_def));
        let mut names: Vec<_> = defs.table.exchanges.keys().collect();
        names.sort();
        for name in names {
            let x = &defs.table.exchanges[name];
            if !x.durable {
                continue;
            }
            for b in &x.bindings {
                if Self::dest_kept(defs, &b.destination) {
                    let (key, args) = (&b.routing_key, &b.arguments);
                    out.push(Self::binding_op(name, &b.destination, key, args, true));
                }
            }
        }
        out
    }

    /// How the definitions files keep an exchange; `None` for one they do not keep.
    pub(super) fn exchange_def(x: &Exchange<QueueRef>) -> Option<Definition> {
        (x.durable && !x.name.is_empty() && !x.name.starts_with("amq.")).then(|| {
            Definition::Exchange(ExchangeDeclare {
                exchange: (&*x.name).into(),
                kind: x.type_name().into(),
                durable: true,
                auto_delete: x.auto_delete,
                internal: x.internal,
                arguments: x.arguments.clone(),
                ..Default::default()
            })
        })
    }

    /// How the definitions files keep a queue (with its log's id); `None` for one they do not.
    pub(super) fn queue_def(q: &QueueRef) -> Option<Definition> {
        let id = q.store_id().filter(|_| Self::kept(q))?;
        Some(Definition::Queue(
            id,
            QueueDeclare {
                queue: (&**q.name()).into(),
                durable: true,
                auto_delete: q.options().auto_delete,
                arguments: q.options().arguments.clone(),
                ..Default::default()
            },
        ))
    }

    /// Whether a binding from a durable exchange to `dest` is kept: to a kept queue, or to a
    /// durable exchange.
    pub(super) fn dest_kept(defs: &Snapshot, dest: &Destination<QueueRef>) -> bool {
        match dest {
            Destination::Queue(q) => Self::kept(q),
            Destination::Exchange(d) => defs.table.exchanges.get(d).is_some_and(|dx| dx.durable),
        }
    }

    /// The record of a binding added or removed.
    pub(super) fn binding_op(
        source: &str,
        dest: &Destination<QueueRef>,
        key: &str,
        args: &FieldTable,
        add: bool,
    ) -> Definition {
        let (source, key, arguments) = (source.into(), key.into(), args.clone());
        match (dest, add) {
            (Destination::Queue(q), true) => Definition::QueueBind(QueueBind {
                queue: (&**q.name()).into(),
                exchange: source,
                routing_key: key,
                arguments,
                ..Default::default()
            }),
            (Destination::Queue(q), false) => Definition::QueueUnbind(QueueUnbind {
                queue: (&**q.name()).into(),
                exchange: source,
                routing_key: key,
                arguments,
                ..Default::default()
            }),
            (Destination::Exchange(d), true) => Definition::ExchangeBind(ExchangeBind {
                destination: (&**d).into(),
                source,
                routing_key: key,
                arguments,
                ..Default::default()
            }),
            (Destination::Exchange(d), false) => Definition::ExchangeUnbind(ExchangeUnbind {
                destination: (&**d).into(),
                source,
                routing_key: key,
                arguments,
                ..Default::default()
            }),
        }
    }
}
