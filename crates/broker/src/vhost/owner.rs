//! The vhost as its queues' owner ([`crate::queue::QueueOwner`], the interface the queue layer
//! defines): their dead letters are routed by its exchanges and held by its delayed exchanges'
//! stores, and an auto-delete queue whose last consumer left from another node is deleted here.

use std::sync::Arc;

use warren_protocol::ByteString;

use crate::message::Message;
use crate::queue::{DeadRoute, QueueOwner, QueueRef};

use super::VHost;

impl QueueOwner for VHost {
    fn route_dead_letter(
        &self,
        m: &Message,
        extra_keys: &[ByteString],
        out: &mut Vec<QueueRef>,
    ) -> DeadRoute {
        match self.route_keys(&m.exchange, &m.routing_key, extra_keys, &m.properties, out) {
            Ok(None) => DeadRoute::Routed,
            Ok(Some(delay)) => DeadRoute::Delay(delay),
            Err(_) => DeadRoute::NoExchange,
        }
    }

    fn hold_dead_letter(
        self: Arc<Self>,
        m: &Message,
        delay_ms: u64,
        confirm: Option<&Arc<crate::confirm::ConfirmHandle>>,
    ) -> Option<bool> {
        let store = self.delay_store(&m.exchange)?;
        store.hold_dead_letter(m, delay_ms, confirm)
    }

    fn delete_unused_queue(&self, name: &str) {
        if let Ok(d) = self.delete_queue(name, false, false, None) {
            crate::queue::notify_cancelled(&d.consumers);
        }
    }
}
