//! The close sequence: connection.close sent on a hard error and close-ok awaited (or the
//! deadline), the drain after the client's close, and the cleanup when the task ends
//! (channels released, exclusive queues deleted, the registry left).

use std::sync::atomic::Ordering;
use std::time::Duration;

use tokio::time::Instant;
use warren_protocol::method::ConnectionClose;
use warren_protocol::Method;

use super::{Conn, Phase, Slot};
use crate::error::AmqpError;
use crate::limits;
use crate::queue::notify_cancelled;

impl Conn {
    pub(super) fn drain(&mut self) {
        self.phase = Phase::Draining;
        self.deadline = Instant::now() + Duration::from_millis(limits::CLOSE_OK_TIMEOUT_MS);
    }

    /// Sends connection.close and waits for close-ok.
    pub(super) fn close_connection(&mut self, e: AmqpError) {
        if matches!(self.phase, Phase::CloseSent | Phase::Done | Phase::Draining) {
            return;
        }
        tracing::info!(peer = %self.peer, conn = self.id, code = e.code, text = %e.text, "closing connection on error");
        self.reason = e.text.clone();
        self.outbox.method(
            0,
            &Method::ConnectionClose(ConnectionClose {
                reply_code: e.code,
                reply_text: e.text.into(),
                class_id: e.class_id,
                method_id: e.method_id,
            }),
        );
        self.phase = Phase::CloseSent;
        self.deadline = Instant::now() + Duration::from_millis(limits::CLOSE_OK_TIMEOUT_MS);
    }

    /// Releases channels and exclusive queues, then leaves the registry: once the management
    /// API no longer lists a connection, its channels no longer count against any limit.
    pub(super) fn cleanup(&mut self) {
        self.release();
        if self.info.take().is_some() {
            self.broker.connections.lock().remove(&self.id);
            self.broker
                .churn
                .connection_closed
                .fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Releases what the connection holds: its channels (their unacked deliveries back in their
    /// queues, their consumers removed, on other nodes too) and its exclusive queues (deleted).
    /// Done before connection.close-ok, as RabbitMQ does, so the next connection finds the
    /// queues released; again (a no-op then) when the task ends.
    pub(super) fn release(&mut self) {
        if let Some(vhost) = self.vhost.clone() {
            for (_, slot) in self.channels.drain() {
                if let Slot::Open(mut ch) = slot {
                    ch.close(&vhost);
                }
            }
            for q in std::mem::take(&mut self.exclusive_queues) {
                if let Ok(d) = vhost.delete_queue(q.name(), false, false, None) {
                    notify_cancelled(&d.consumers);
                }
            }
        }
    }
}
