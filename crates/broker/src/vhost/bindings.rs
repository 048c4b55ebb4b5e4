//! Binding and unbinding queues and exchanges, and removing the bindings to a deleted
//! destination (with the auto-delete exchanges that leaves without bindings).

use std::sync::Arc;

use warren_protocol::method::ExchangeDelete;
use warren_protocol::FieldTable;
use warren_routing::consistent_hash;
use warren_routing::{Binding, Destination, ExchangeKind};

use super::replication::bind_method;
use super::{Snapshot, VHost};
use crate::definitions::op::{Applying, QueueMeta};
use crate::definitions::Definition;
use crate::error::{AmqpError, AmqpResult};
use crate::queue::QueueRef;

/// Binding arguments are equal whatever their order (clients encode maps in any order).
fn same_args(a: &FieldTable, b: &FieldTable) -> bool {
    a.0.len() == b.0.len() && a.0.iter().all(|(k, v)| b.get(k) == Some(v))
}

fn validate_x_match(args: &FieldTable) -> AmqpResult<()> {
    match args.get("x-match") {
        None => Ok(()),
        Some(v) => match v.as_str() {
            Some("all" | "any" | "all-with-x" | "any-with-x") => Ok(()),
            Some(other) => Err(AmqpError::precondition_failed(format!("Invalid x-match field value <<\"{other}\">>; expected all, any, all-with-x, or any-with-x"))),
            None => Err(AmqpError::precondition_failed("Invalid x-match field type; expected longstr")),
        },
    }
}

impl VHost {
    /// Removes every binding whose destination matches; auto-delete exchanges left without
    /// bindings go too (repeatedly, since removing one can empty another).
    /// Durable exchanges that go this way are added to `ops` as deletions: the change that
    /// caused it may not be journaled itself (a transient queue's last binding).
    pub(super) fn remove_bindings_to(
        defs: &mut Snapshot,
        pred: &dyn Fn(&Destination<QueueRef>) -> bool,
        ops: &mut Vec<Definition>,
    ) {
        let mut emptied: Vec<Arc<str>> = Vec::new();
        for x in defs.table.exchanges.values_mut() {
            if x.bindings.iter().any(|b| pred(&b.destination)) {
                let xm = Arc::make_mut(x);
                xm.bindings.retain(|b| !pred(&b.destination));
                xm.bindings_changed();
                if xm.auto_delete && xm.bindings.is_empty() {
                    emptied.push(xm.name.clone());
                }
            }
        }
        for name in emptied {
            Self::auto_delete(defs, &name, ops);
        }
    }

    /// Removes an auto-delete exchange left without bindings, and what that empties in turn.
    fn auto_delete(defs: &mut Snapshot, name: &Arc<str>, ops: &mut Vec<Definition>) {
        if let Some(x) = defs.table.exchanges.remove(name) {
            if x.durable {
                ops.push(Definition::ExchangeDelete(ExchangeDelete {
                    exchange: (&**name).into(),
                    ..Default::default()
                }));
            }
        }
        Self::remove_bindings_to(
            defs,
            &|d| matches!(d, Destination::Exchange(e) if e == name),
            ops,
        );
    }

    fn same_binding(
        b: &Binding<QueueRef>,
        dest: &Destination<QueueRef>,
        key: &str,
        args: &FieldTable,
    ) -> bool {
        let same_dest = match (&b.destination, dest) {
            (Destination::Queue(a), Destination::Queue(c)) => a.ptr_eq(c),
            (Destination::Exchange(a), Destination::Exchange(c)) => a == c,
            _ => false,
        };
        same_dest && &*b.routing_key == key && same_args(&b.arguments, args)
    }

    fn bind(
        &self,
        source: &str,
        dest_name: &str,
        dest: impl FnOnce(&Snapshot) -> AmqpResult<Destination<QueueRef>>,
        key: &str,
        args: &FieldTable,
        add: bool,
        conn_id: Option<u64>,
    ) -> AmqpResult<()> {
        if source.is_empty() || (dest_name.is_empty() && add) {
            return Err(AmqpError::access_refused(
                "operation not permitted on the default exchange",
            ));
        }
        let mut defs = self.defs.lock();
        // RabbitMQ looks the source up before the destination: with both missing, the 404
        // names the source exchange.
        if add && !defs.table.exchanges.contains_key(source) {
            return Err(self.no_exchange(source));
        }
        // Unbinding what does not exist is not an error in RabbitMQ.
        let dest = match dest(&defs) {
            Ok(d) => d,
            Err(_) if !add => return Ok(()),
            Err(e) => return Err(e),
        };
        let dest_kept = Self::dest_kept(&defs, &dest);
        let Some(x) = defs.table.exchanges.get_mut(source) else {
            return if add {
                Err(self.no_exchange(source))
            } else {
                Ok(())
            };
        };
        if add && x.kind == ExchangeKind::Headers {
            validate_x_match(args)?;
        }
        if add && x.kind == ExchangeKind::ConsistentHash {
            consistent_hash::parse_weight(key).map_err(AmqpError::precondition_failed)?;
        }
        // Then, both found and the binding valid, another connection's exclusive queue: 405.
        if let (true, Some(me), Destination::Queue(q)) = (add, conn_id, &dest) {
            if q.options().exclusive_owner.is_some_and(|o| o != me) {
                return Err(self.locked(q.name()));
            }
        }
        let op = (x.durable && dest_kept).then(|| Self::binding_op(source, &dest, key, args, add));
        let exists = x
            .bindings
            .iter()
            .position(|b| Self::same_binding(b, &dest, key, args));
        let mut ops: Vec<Definition> = op.into_iter().collect();
        match (add, exists) {
            (true, None) => {
                let xm = Arc::make_mut(x);
                xm.bindings.push(Binding {
                    destination: dest,
                    routing_key: key.into(),
                    arguments: args.clone(),
                });
                xm.bindings_changed();
            }
            (false, Some(i)) => {
                let xm = Arc::make_mut(x);
                xm.bindings.remove(i);
                xm.bindings_changed();
                if xm.auto_delete && xm.bindings.is_empty() {
                    let name = xm.name.clone();
                    Self::auto_delete(&mut defs, &name, &mut ops);
                }
            }
            _ => return Ok(()),
        }
        self.changed(&mut defs, ops)
    }

    pub fn bind_queue(
        &self,
        queue: &str,
        exchange: &str,
        key: &str,
        args: &FieldTable,
        add: bool,
        conn_id: Option<u64>,
    ) -> AmqpResult<()> {
        self.bind_queue_at(queue, exchange, key, args, add, conn_id, None)
    }

    /// [`VHost::bind_queue`], or (`at`) the bind or unbind a committed entry carries.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn bind_queue_at(
        &self,
        queue: &str,
        exchange: &str,
        key: &str,
        args: &FieldTable,
        add: bool,
        conn_id: Option<u64>,
        at: Option<Applying>,
    ) -> AmqpResult<()> {
        if let Some(c) = self.proposer(at) {
            let m = bind_method(true, queue, exchange, key, args, add);
            let meta = conn_id.map(|o| QueueMeta {
                owner: Some(o),
                ..Default::default()
            });
            return c.vhost_change(&self.name, m, meta);
        }
        self.bind(
            exchange,
            "queue",
            |d| {
                d.queues
                    .get(queue)
                    .cloned()
                    .map(Destination::Queue)
                    .ok_or_else(|| self.no_queue(queue))
            },
            key,
            args,
            add,
            conn_id,
        )
    }

    pub fn bind_exchange(
        &self,
        destination: &str,
        source: &str,
        key: &str,
        args: &FieldTable,
        add: bool,
    ) -> AmqpResult<()> {
        self.bind_exchange_at(destination, source, key, args, add, None)
    }

    /// [`VHost::bind_exchange`], or (`at`) the bind or unbind a committed entry carries.
    pub(super) fn bind_exchange_at(
        &self,
        destination: &str,
        source: &str,
        key: &str,
        args: &FieldTable,
        add: bool,
        at: Option<Applying>,
    ) -> AmqpResult<()> {
        if let Some(c) = self.proposer(at) {
            let m = bind_method(false, destination, source, key, args, add);
            return c.vhost_change(&self.name, m, None);
        }
        self.bind(
            source,
            destination,
            |d| {
                if d.table.exchanges.contains_key(destination) {
                    Ok(Destination::Exchange(destination.into()))
                } else {
                    Err(self.no_exchange(destination))
                }
            },
            key,
            args,
            add,
            None,
        )
    }
}
