//! A cluster node's vhost: a change asked for here is proposed to the cluster
//! (`VHost::replicated`), and every node makes it when the entry is applied
//! ([`VHost::apply_method`], given the entry as an [`Applying`], which the `*_at` methods it
//! calls pass on so they make the change rather than propose it); a Raft snapshot carries the
//! definitions as those entries.

use std::sync::Arc;

use warren_protocol::method::{
    ExchangeBind, ExchangeDeclare, ExchangeUnbind, QueueBind, QueueDeclare, QueueUnbind,
};
use warren_protocol::{FieldTable, Method};
use warren_routing::Destination;

use super::{ExchangeSpec, QueueSpec, VHost};
use crate::definitions::op::{Applying, QueueMeta};
use crate::definitions::proposer::Proposer;
use crate::error::{AmqpError, AmqpResult};

/// The method a cluster replicates for a bind or unbind of `dest` (a queue, or an exchange) to
/// `source`.
pub(super) fn bind_method(
    queue: bool,
    dest: &str,
    source: &str,
    key: &str,
    args: &FieldTable,
    add: bool,
) -> Method {
    let (d, x, k, a) = (dest.into(), source.into(), key.into(), args.clone());
    match (queue, add) {
        (true, true) => QueueBind {
            queue: d,
            exchange: x,
            routing_key: k,
            arguments: a,
            ..Default::default()
        }
        .into(),
        (true, false) => QueueUnbind {
            queue: d,
            exchange: x,
            routing_key: k,
            arguments: a,
            ..Default::default()
        }
        .into(),
        (false, true) => ExchangeBind {
            destination: d,
            source: x,
            routing_key: k,
            arguments: a,
            ..Default::default()
        }
        .into(),
        (false, false) => ExchangeUnbind {
            destination: d,
            source: x,
            routing_key: k,
            arguments: a,
            ..Default::default()
        }
        .into(),
    }
}

impl VHost {
    /// Where a change asked for here goes (the cluster, or a single node's applier), unless
    /// this is a change being applied (`at`), or one replayed while the vhost is recovered.
    pub(super) fn proposer(&self, at: Option<Applying>) -> Option<&dyn Proposer> {
        self.proposer.get().filter(|_| at.is_none()).map(|p| &**p)
    }

    /// Makes a change: every node of a cluster runs this for each committed vhost entry, and a
    /// single node for each change it makes (`at`: [`Applying::LOCAL`]). Returns the ready
    /// count of a queue that a queue.delete deleted.
    pub fn apply_method(
        self: &Arc<Self>,
        m: &Method,
        meta: Option<&QueueMeta>,
        at: Applying,
    ) -> AmqpResult<Option<u32>> {
        let (owner, at) = (meta.and_then(|q| q.owner), Some(at));
        if let Method::QueueDelete(q) = m {
            let d = self.delete_queue_at(&q.queue, false, false, owner, at)?;
            crate::queue::notify_cancelled(&d.consumers);
            return Ok(Some(d.message_count));
        }
        match m {
            Method::ExchangeDeclare(x) => self.declare_exchange_at(
                &ExchangeSpec {
                    name: &x.exchange,
                    kind: &x.kind,
                    passive: false,
                    durable: x.durable,
                    auto_delete: x.auto_delete,
                    internal: x.internal,
                    arguments: &x.arguments,
                },
                at,
            ),
            Method::ExchangeDelete(x) => self.delete_exchange_at(&x.exchange, x.if_unused, at),
            Method::QueueBind(b) => self.bind_queue_at(
                &b.queue,
                &b.exchange,
                &b.routing_key,
                &b.arguments,
                true,
                owner,
                at,
            ),
            Method::QueueUnbind(b) => self.bind_queue_at(
                &b.queue,
                &b.exchange,
                &b.routing_key,
                &b.arguments,
                false,
                owner,
                at,
            ),
            Method::ExchangeBind(b) => self.bind_exchange_at(
                &b.destination,
                &b.source,
                &b.routing_key,
                &b.arguments,
                true,
                at,
            ),
            Method::ExchangeUnbind(b) => self.bind_exchange_at(
                &b.destination,
                &b.source,
                &b.routing_key,
                &b.arguments,
                false,
                at,
            ),
            Method::QueueDeclare(q) => {
                let meta = meta.cloned().unwrap_or_default();
                self.declare_queue_at(
                    &QueueSpec {
                        name: &q.queue,
                        passive: false,
                        durable: q.durable,
                        exclusive: q.exclusive,
                        auto_delete: q.auto_delete,
                        arguments: &q.arguments,
                        conn_id: meta.owner.unwrap_or(0),
                        server_named: meta.server_named,
                        home: Some(&meta.home),
                        members: (!meta.members.is_empty())
                            .then_some((meta.group, &meta.members[..])),
                    },
                    at,
                )
                .map(|_| ())
            }
            other => Err(AmqpError::internal_error(format!(
                "not a definition: {other:?}"
            ))),
        }
        .map(|()| None)
    }

    /// Every exchange, queue and binding as the ops that recreate them (a Raft snapshot).
    pub fn replicated_definitions(&self) -> Vec<crate::definitions::op::DefOp> {
        let defs = self.defs.lock();
        let enc = |m: Method| {
            let mut b = bytes::BytesMut::new();
            m.encode_payload(&mut b);
            b.to_vec()
        };
        let op = |m: Method, queue: Option<QueueMeta>| crate::definitions::op::DefOp::Vhost {
            vhost: self.name.to_string(),
            method: enc(m),
            queue,
        };
        let mut out = Vec::new();
        let mut xs: Vec<_> = defs
            .table
            .exchanges
            .values()
            .filter(|x| !x.name.is_empty() && !x.name.starts_with("amq."))
            .collect();
        xs.sort_by(|a, b| a.name.cmp(&b.name));
        for x in xs {
            out.push(op(
                ExchangeDeclare {
                    exchange: (&*x.name).into(),
                    kind: x.type_name().into(),
                    durable: x.durable,
                    auto_delete: x.auto_delete,
                    internal: x.internal,
                    arguments: x.arguments.clone(),
                    ..Default::default()
                }
                .into(),
                None,
            ));
        }
        let me = self
            .cluster
            .as_ref()
            .map(|c| c.me().to_string())
            .unwrap_or_default();
        let mut qs: Vec<_> = defs.queues.values().collect();
        qs.sort_by(|a, b| a.name().cmp(b.name()));
        for q in qs {
            let o = q.options();
            out.push(op(
                QueueDeclare {
                    queue: (&**q.name()).into(),
                    durable: o.durable,
                    exclusive: o.exclusive_owner.is_some(),
                    auto_delete: o.auto_delete,
                    arguments: o.arguments.clone(),
                    ..Default::default()
                }
                .into(),
                Some(QueueMeta {
                    home: q.home().unwrap_or_else(|| me.clone()),
                    owner: o.exclusive_owner,
                    server_named: true,
                    group: q.group().map(|(g, _)| g),
                    members: q.group().map(|(_, m)| m).unwrap_or_default(),
                }),
            ));
        }
        let mut names: Vec<_> = defs.table.exchanges.keys().collect();
        names.sort();
        for name in names {
            for b in &defs.table.exchanges[name].bindings {
                let m: Method = match &b.destination {
                    Destination::Queue(q) => QueueBind {
                        queue: (&**q.name()).into(),
                        exchange: (&**name).into(),
                        routing_key: (&*b.routing_key).into(),
                        arguments: b.arguments.clone(),
                        ..Default::default()
                    }
                    .into(),
                    Destination::Exchange(d) => ExchangeBind {
                        destination: (&**d).into(),
                        source: (&**name).into(),
                        routing_key: (&*b.routing_key).into(),
                        arguments: b.arguments.clone(),
                        ..Default::default()
                    }
                    .into(),
                };
                let owner = match &b.destination {
                    Destination::Queue(q) => q.options().exclusive_owner,
                    _ => None,
                };
                out.push(op(
                    m,
                    owner.map(|o| QueueMeta {
                        owner: Some(o),
                        ..Default::default()
                    }),
                ));
            }
        }
        out
    }

    /// Deletes the queues and exchanges that `ops` (a snapshot's) do not declare, and every
    /// binding (the snapshot's are declared again after this); `at`: the restore.
    pub fn retain_only(self: &Arc<Self>, ops: &[crate::definitions::op::DefOp], at: Applying) {
        let mut queues = std::collections::HashSet::new();
        let mut exchanges = std::collections::HashSet::new();
        for op in ops {
            if let crate::definitions::op::DefOp::Vhost { method, .. } = op {
                match Method::decode(&bytes::Bytes::copy_from_slice(method)) {
                    Ok(Method::QueueDeclare(q)) => {
                        queues.insert(q.queue.to_string());
                    }
                    Ok(Method::ExchangeDeclare(x)) => {
                        exchanges.insert(x.exchange.to_string());
                    }
                    _ => {}
                }
            }
        }
        let snap = self.snapshot();
        for q in snap.queues.keys() {
            if !queues.contains(&**q) {
                if let Ok(d) = self.delete_queue_at(q, false, false, None, Some(at)) {
                    crate::queue::notify_cancelled(&d.consumers);
                }
            }
        }
        for x in snap.table.exchanges.keys() {
            if !x.is_empty() && !x.starts_with("amq.") && !exchanges.contains(&**x) {
                let _ = self.delete_exchange_at(x, false, Some(at));
            }
        }
        let mut defs = self.defs.lock();
        for x in defs.table.exchanges.values_mut() {
            if !x.bindings.is_empty() {
                let xm = Arc::make_mut(x);
                xm.bindings.clear();
                xm.bindings_changed();
            }
        }
        self.publish_snapshot(&defs);
    }
}
