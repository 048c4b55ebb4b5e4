//! Publishing into a vhost, whatever the protocol: route by exchange and keys, hold in a
//! delayed exchange's store, or publish to the routed queues with one confirm
//! (`queue::fan_out`). The AMQP 0-9-1 channel is one client (`channel/mod.rs`, `route`); a front
//! end for another protocol publishes the same way and keeps only its own replies (an AMQP
//! basic.return for an unroutable mandatory message).

use std::sync::Arc;

use bytes::Bytes;
use warren_protocol::properties::{self, BasicProperties};
use warren_protocol::ByteString;

use super::VHost;
use crate::confirm::ConfirmTarget;
use crate::error::{AmqpError, AmqpResult};
use crate::message::{Forwarded, Message};
use crate::queue::args::parse_expiration;
use crate::queue::{fan_out, ConfirmTo, FannedOut, QueueRef};

/// A message to publish from its exchange, routing key, encoded properties and body, with
/// what the broker reads from the properties (persistent, priority, expiration) read as a
/// publish's are; a bad `expiration` is the publisher's error (406).
pub fn message(
    exchange: ByteString,
    routing_key: ByteString,
    raw: Bytes,
    body: Bytes,
) -> AmqpResult<Message> {
    let persistent = properties::delivery_mode(&raw) == Some(2);
    let (priority, expiration_ms) = priority_and_expiration(&raw)?;
    Ok(Message {
        exchange,
        routing_key,
        properties: raw,
        body,
        persistent,
        priority,
        expiration_ms,
        forwarded: Forwarded::NONE,
    })
}

/// The `priority` and `expiration` (ms) properties, decoded only when either flag is set
/// (bits 11 and 8).
#[inline]
pub fn priority_and_expiration(raw: &Bytes) -> AmqpResult<(Option<u8>, Option<u64>)> {
    if raw.len() < 2 || raw[0] & 0x09 == 0 {
        return Ok((None, None));
    }
    let props = BasicProperties::decode(raw)
        .map_err(|e| AmqpError::frame_error(format!("cannot decode properties: {e}")))?;
    let expiration_ms = match props.expiration {
        Some(e) => Some(parse_expiration(&e)?),
        None => None,
    };
    Ok((props.priority, expiration_ms))
}

/// What became of a publish.
pub enum Published {
    /// It went to the queues it was routed to.
    Routed(FannedOut),
    /// No queue takes it: the message comes back (a wanted confirm is the caller's to send:
    /// an unroutable message is confirmed, as RabbitMQ does).
    Unroutable(Message),
    /// A delayed exchange's store holds it; its confirm follows the store's write.
    Held,
}

impl VHost {
    /// Publishes `msg` by its exchange and routing key plus `extra_keys` (CC and BCC), with
    /// `confirm` if one is wanted. A delayed exchange holds it, unless `must_route` (AMQP's
    /// mandatory) and nothing would take it now: then it is unroutable now, like any other.
    /// `each` sees every queue it went to (the channel collects the pressured ones); `targets`
    /// is the caller's buffer, left empty.
    #[inline]
    pub fn publish(
        self: &Arc<Self>,
        msg: Message,
        extra_keys: &[ByteString],
        must_route: bool,
        confirm: Option<ConfirmTo<'_>>,
        targets: &mut Vec<QueueRef>,
        each: impl FnMut(&QueueRef),
    ) -> AmqpResult<Published> {
        targets.clear();
        let delay = self.route_keys(
            &msg.exchange,
            &msg.routing_key,
            extra_keys,
            &msg.properties,
            targets,
        )?;
        if let Some(delay) = delay {
            if !(must_route && self.unroutable_now(&msg, targets)) {
                targets.clear();
                self.hold_delayed(msg, delay, confirm);
                return Ok(Published::Held);
            }
        }
        if targets.is_empty() {
            return Ok(Published::Unroutable(msg));
        }
        let out = fan_out(&Arc::new(msg), targets, confirm, each);
        targets.clear();
        Ok(Published::Routed(out))
    }

    /// [`VHost::publish`] for a front end that confirms every publish (a shovel's or federation
    /// link's local end, a stream-protocol publisher): `seq` is confirmed to `target`, and the
    /// queues it went to that are falling behind are added to `pressured` (the caller waits
    /// for them before it takes more). What it came to: `None` while its confirm is to come,
    /// `Some(stored)` when it is settled now (no write to wait for, or unroutable, which
    /// RabbitMQ confirms).
    pub fn publish_confirmed(
        self: &Arc<Self>,
        msg: Message,
        target: &Arc<dyn ConfirmTarget>,
        seq: u64,
        targets: &mut Vec<QueueRef>,
        pressured: &mut Vec<QueueRef>,
    ) -> AmqpResult<Option<bool>> {
        let r = self.publish(
            msg,
            &[],
            false,
            Some(ConfirmTo::Target(target, seq)),
            targets,
            |q| {
                if q.pressured() {
                    pressured.push(q.clone());
                }
            },
        )?;
        Ok(match r {
            Published::Routed(FannedOut::Pending) | Published::Held => None,
            Published::Routed(FannedOut::Settled { accepted }) => Some(accepted),
            Published::Unroutable(_) => Some(true),
        })
    }

    /// Whether no binding of a delayed exchange would take `msg` now (`targets` is left empty).
    #[cold]
    #[inline(never)]
    fn unroutable_now(&self, msg: &Message, targets: &mut Vec<QueueRef>) -> bool {
        targets.clear();
        self.route_due(&msg.exchange, msg, targets);
        let none = targets.is_empty();
        targets.clear();
        none
    }

    /// Hands `msg` to its delayed exchange's store; `confirm` is done once the store has it
    /// (on disk for a persistent message in a durable store), or nacked if the store could not
    /// be opened.
    #[cold]
    #[inline(never)]
    fn hold_delayed(self: &Arc<Self>, msg: Message, delay: u64, confirm: Option<ConfirmTo<'_>>) {
        let handle = confirm.map(|c| c.pending(1));
        let took = self
            .delay_store(&msg.exchange)
            .map(|store| store.hold(msg, delay, handle.as_ref()));
        if let Some(h) = handle {
            match took {
                Some(true) => {}
                // Held without a write to wait for.
                Some(false) => {
                    h.done(true);
                }
                // The store could not be opened: the publisher gets a nack.
                None => {
                    h.done(false);
                }
            }
        }
    }
}
