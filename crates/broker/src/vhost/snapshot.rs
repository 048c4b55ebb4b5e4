//! The routing snapshot: reading it, republishing it after a change, and routing a publish
//! through it. Invariant: publishers read only the published [`Snapshot`] (no lock); it is
//! replaced whole from the definitions, by the holder of the definitions lock.

use std::sync::Arc;

use warren_protocol::ByteString;

use super::{Snapshot, VHost, DIRECT_REPLY_TO};
use crate::error::{AmqpError, AmqpResult};
use crate::message::Message;
use crate::queue::QueueRef;

impl VHost {
    pub fn snapshot(&self) -> arc_swap::Guard<Arc<Snapshot>> {
        self.snapshot.load()
    }

    pub(super) fn publish_snapshot(&self, defs: &Snapshot) {
        self.snapshot.store(Arc::new(defs.clone()));
    }

    /// The queues a message published to `exchange` with `routing_key` reaches. Errors if the
    /// exchange is missing (404) or internal (403). `properties` is decoded only for a headers
    /// exchange.
    pub fn route(
        &self,
        exchange: &str,
        routing_key: &str,
        properties: &bytes::Bytes,
        out: &mut Vec<QueueRef>,
    ) -> AmqpResult<()> {
        self.route_keys(exchange, routing_key, &[], properties, out)
            .map(|_| ())
    }

    /// [`VHost::route`] with the extra routing keys of the `CC` and `BCC` headers.
    pub fn route_keys(
        &self,
        exchange: &str,
        routing_key: &str,
        extra_keys: &[ByteString],
        properties: &bytes::Bytes,
        out: &mut Vec<QueueRef>,
    ) -> AmqpResult<Option<u64>> {
        let snap = self.snapshot.load();
        let before = out.len();
        if exchange.is_empty() {
            self.default_stats.publish_in.add(1);
            for key in std::iter::once(routing_key).chain(extra_keys.iter().map(|k| &**k)) {
                let q = if let Some(q) = snap.queues.get(key) {
                    q.clone()
                } else if key.starts_with(DIRECT_REPLY_TO) {
                    // A reply whose requester is gone is dropped, as in RabbitMQ.
                    match self.direct_reply.lock().get(key) {
                        Some(q) => q.clone(),
                        None => continue,
                    }
                } else {
                    continue;
                };
                if !out.iter().any(|x| x.ptr_eq(&q)) {
                    out.push(q);
                }
            }
            if out.len() > before {
                self.default_stats.publish_out.add(1);
            }
            return Ok(None);
        }
        let stats = match snap.table.exchanges.get(exchange) {
            None => return Err(self.no_exchange(exchange)),
            Some(x) if x.internal => {
                return Err(AmqpError::access_refused(format!(
                    "cannot publish to internal exchange '{exchange}' in vhost '{}'",
                    self.name
                )))
            }
            Some(x) if x.delayed => {
                if let Some(d) = crate::delayed::requested_delay(properties) {
                    x.stats.publish_in.add(1);
                    return Ok(Some(d));
                }
                &x.stats
            }
            Some(x) => &x.stats,
        };
        stats.publish_in.add(1);
        let mut props = || warren_protocol::properties::BasicProperties::decode(properties).ok();
        snap.table
            .route_keys(exchange, routing_key, extra_keys, &mut props, out);
        if out.len() > before {
            stats.publish_out.add(1);
        }
        Ok(None)
    }

    /// Routes a delayed message that is due: by the exchange's bindings as they are now.
    pub fn route_due(&self, exchange: &str, msg: &Message, out: &mut Vec<QueueRef>) {
        let snap = self.snapshot.load();
        let Some(x) = snap.table.exchanges.get(exchange) else {
            return;
        };
        let props = &msg.properties;
        let mut decoded = || warren_protocol::properties::BasicProperties::decode(props).ok();
        let cc = decoded()
            .and_then(|p| p.headers)
            .and_then(|h| crate::message::header_routes(&h).ok())
            .unwrap_or_default();
        snap.table
            .route_keys(exchange, &msg.routing_key, &cc, &mut decoded, out);
        if !out.is_empty() {
            x.stats.publish_out.add(1);
        }
    }

    pub fn queue(&self, name: &str) -> Option<QueueRef> {
        self.snapshot.load().queues.get(name).cloned()
    }

    /// Looks a queue up for use by `conn_id`: 404 if missing, 405 if another connection's
    /// exclusive queue.
    pub fn queue_for(&self, name: &str, conn_id: u64) -> AmqpResult<QueueRef> {
        let q = self.queue(name).ok_or_else(|| self.no_queue(name))?;
        match q.options().exclusive_owner {
            Some(owner) if owner != conn_id => Err(self.locked(name)),
            _ => Ok(q),
        }
    }

    /// Queues with messages that have deadlines, for the TTL sweeper.
    pub fn expiring_queues(&self) -> Vec<QueueRef> {
        self.snapshot
            .load()
            .queues
            .values()
            .filter(|q| q.may_expire())
            .cloned()
            .collect()
    }
}
