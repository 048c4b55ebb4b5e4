//! A link's downstream half, the same for exchange and queue links: each upstream delivery is
//! published through the broker API (`warren_shovel::local::LocalDest`) and settled upstream
//! by the link's `ack-mode`: after the local confirm (`on-confirm`), at once (`on-publish`),
//! or never (`no-ack`, consumed without acks). A publish the broker refuses is nacked back to
//! the upstream queue.

use std::collections::BTreeMap;

use bytes::Bytes;
use bytestring::ByteString;
use lapin::Channel;
use warren_broker::server::Broker;
use warren_shovel::local::LocalDest;
use warren_shovel::params::AckMode;
use warren_shovel::remote::settle;

pub struct Forwarder {
    dest: LocalDest,
    ack_mode: AckMode,
    /// Publishes waiting for their confirm: seq -> the upstream delivery tag.
    waiting: BTreeMap<u64, u64>,
    seq: u64,
}

impl Forwarder {
    pub fn open(broker: &Broker, vhost: &str, ack_mode: AckMode) -> Result<Forwarder, String> {
        Ok(Forwarder {
            dest: LocalDest::open(broker, vhost, None)?,
            ack_mode,
            waiting: BTreeMap::new(),
            seq: 0,
        })
    }

    /// Whether a confirm is awaited (for a `select!` guard on [`Forwarder::confirmed`]).
    pub fn waiting(&self) -> bool {
        !self.waiting.is_empty()
    }

    /// The next local confirm: (seq, stored).
    pub async fn confirmed(&mut self) -> (u64, bool) {
        self.dest.confirmed().await
    }

    /// Settles upstream the delivery whose publish `c` confirms.
    pub async fn settle(&mut self, ch: &Channel, c: (u64, bool)) -> Result<(), String> {
        match self.waiting.remove(&c.0) {
            Some(tag) => settle(ch, tag, c.1).await,
            None => Ok(()),
        }
    }

    /// Publishes one upstream delivery (`tag`) downstream and settles it as the ack mode says.
    pub async fn forward(
        &mut self,
        ch: &Channel,
        tag: u64,
        exchange: &str,
        routing_key: &str,
        properties: Bytes,
        body: Bytes,
    ) -> Result<(), String> {
        self.seq += 1;
        let at_once = self
            .dest
            .publish(
                self.seq,
                ByteString::from(exchange),
                ByteString::from(routing_key),
                properties,
                body,
            )
            .await?;
        match (self.ack_mode, at_once) {
            (AckMode::NoAck, _) => Ok(()),
            (AckMode::OnConfirm, None) => {
                self.waiting.insert(self.seq, tag);
                Ok(())
            }
            (AckMode::OnConfirm, Some(ok)) => settle(ch, tag, ok).await,
            (AckMode::OnPublish, _) => settle(ch, tag, true).await,
        }
    }
}
