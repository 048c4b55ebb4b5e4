//! One shovel at work: connect its ends, move messages until a connection fails or it reaches
//! its `delete-after`, and settle the source by its ack mode:
//!
//! - `on-confirm`: the destination confirms each publish (the broker API's confirm for a local
//!   end, publisher confirms for a remote one); the source delivery is acked then, or put
//!   back (requeued) when the destination refuses it. Nothing is acked before it is stored.
//! - `on-publish`: acked once handed to the destination.
//! - `no-ack`: a remote source consumes with no-ack; a local one is settled on arrival.
//!
//! The source's prefetch bounds what is in flight for the first two.

use std::collections::BTreeMap;
use std::sync::Arc;

use bytes::Bytes;
use bytestring::ByteString;
use parking_lot::Mutex;
use rand::seq::SliceRandom;
use warren_broker::server::Broker;

use crate::delivery::Delivery;
use crate::local::{LocalDest, LocalSource};
use crate::params::{AckMode, DeleteAfter, Dest, ShovelDef, Source};
use crate::props::{forward_entry, Amend};
use crate::remote::{RemoteDest, RemoteSource};
use crate::status::Status;
use crate::uri::{Endpoint, Target};

enum SourceEnd {
    Local(LocalSource),
    Remote(Box<RemoteSource>),
}

impl SourceEnd {
    async fn next(&mut self) -> Result<Delivery, String> {
        match self {
            SourceEnd::Local(s) => s.next().await,
            SourceEnd::Remote(s) => s.next().await,
        }
    }

    async fn ack(&mut self, tag: u64) -> Result<(), String> {
        match self {
            SourceEnd::Local(s) => {
                s.ack(tag);
                Ok(())
            }
            SourceEnd::Remote(s) => s.ack(tag).await,
        }
    }

    async fn requeue(&mut self, tag: u64) -> Result<(), String> {
        match self {
            SourceEnd::Local(s) => {
                s.requeue(tag);
                Ok(())
            }
            SourceEnd::Remote(s) => s.requeue(tag).await,
        }
    }

    fn initial_len(&self) -> u64 {
        match self {
            SourceEnd::Local(s) => s.initial_len,
            SourceEnd::Remote(s) => s.initial_len,
        }
    }

    async fn close(self) {
        match self {
            SourceEnd::Local(s) => drop(s),
            SourceEnd::Remote(s) => s.close().await,
        }
    }
}

enum DestEnd {
    Local(LocalDest),
    Remote(Box<RemoteDest>),
}

impl DestEnd {
    /// Publishes; `Some(ok)` if it is settled at once, else its confirm comes later (or,
    /// without confirms, never: the caller does not wait).
    async fn publish(
        &mut self,
        seq: u64,
        exchange: ByteString,
        routing_key: ByteString,
        properties: Bytes,
        body: Bytes,
    ) -> Result<Option<bool>, String> {
        match self {
            DestEnd::Local(d) => {
                d.publish(seq, exchange, routing_key, properties, body)
                    .await
            }
            DestEnd::Remote(d) => {
                d.publish(seq, &exchange, &routing_key, &properties, &body)
                    .await?;
                Ok(None)
            }
        }
    }

    async fn confirmed(&mut self) -> Result<(u64, bool), String> {
        match self {
            DestEnd::Local(d) => Ok(d.confirmed().await),
            DestEnd::Remote(d) => d.confirmed().await,
        }
    }

    async fn close(self) {
        match self {
            DestEnd::Local(_) => {}
            DestEnd::Remote(d) => d.close().await,
        }
    }
}

/// What a run ended with when no connection failed.
pub enum Finished {
    /// It moved what `delete-after` allows: the shovel deletes itself.
    DeleteAfter,
}

/// Who the shovel is, for its connections, headers and status.
pub struct Ctx {
    pub broker: Arc<Broker>,
    pub vhost: String,
    pub name: String,
    pub status: Arc<Mutex<Status>>,
}

/// RabbitMQ picks one of an end's URIs at random each time it connects.
fn pick(uris: &[Endpoint]) -> &Endpoint {
    uris.choose(&mut rand::thread_rng()).unwrap_or(&uris[0])
}

/// Runs the shovel until it fails (`Err`, the reason) or finishes.
pub async fn run(ctx: &Ctx, def: &ShovelDef) -> Result<Finished, String> {
    let (src_uri, dest_uri) = (pick(&def.src_uris), pick(&def.dest_uris));
    let dest_queue = match &def.dest {
        Dest::Queue { name, args } => Some((name.as_str(), args)),
        Dest::Exchange { .. } => None,
    };
    let mut dest = match &dest_uri.target {
        Target::Local { vhost } => DestEnd::Local(LocalDest::open(&ctx.broker, vhost, dest_queue)?),
        Target::Remote(r) => {
            let conn = crate::remote::connect(r, &format!("Shovel {}", ctx.name)).await?;
            DestEnd::Remote(Box::new(
                RemoteDest::open(conn, dest_queue, def.ack_mode == AckMode::OnConfirm).await?,
            ))
        }
    };
    let source = match &src_uri.target {
        Target::Local { vhost } => LocalSource::open(
            &ctx.broker,
            vhost,
            &def.source,
            def.prefetch,
            &def.consumer_args,
        )
        .map(SourceEnd::Local),
        Target::Remote(r) => match crate::remote::connect(r, &format!("Shovel {}", ctx.name)).await
        {
            Ok(conn) => RemoteSource::open(
                conn,
                &def.source,
                def.prefetch,
                def.ack_mode == AckMode::NoAck,
                &def.consumer_args,
            )
            .await
            .map(|s| SourceEnd::Remote(Box::new(s))),
            Err(e) => Err(e),
        },
    };
    let mut source = match source {
        Ok(s) => s,
        Err(e) => {
            dest.close().await;
            return Err(e);
        }
    };
    let amend = amend(ctx, def, src_uri, dest_uri);
    ctx.status
        .lock()
        .running(src_uri.redacted(), dest_uri.redacted());
    let r = pump(ctx, def, &amend, &mut source, &mut dest).await;
    source.close().await;
    dest.close().await;
    r
}

/// What the destination changes in each message.
fn amend(ctx: &Ctx, def: &ShovelDef, src: &Endpoint, dest: &Endpoint) -> Amend {
    let forward = def.add_forward_headers.then(|| {
        let mut ends: Vec<(&str, String)> = Vec::new();
        match &def.source {
            Source::Queue { name, .. } => ends.push(("src-queue", name.clone())),
            Source::Exchange { name, key } => {
                ends.push(("src-exchange", name.clone()));
                ends.push(("src-exchange-key", key.clone()));
            }
        }
        match &def.dest {
            Dest::Queue { name, .. } => ends.push(("dest-queue", name.clone())),
            Dest::Exchange { name, key } => {
                if let Some(x) = name {
                    ends.push(("dest-exchange", x.clone()));
                }
                if let Some(k) = key {
                    ends.push(("dest-exchange-key", k.clone()));
                }
            }
        }
        forward_entry(
            &ctx.broker.cluster_name(),
            &ctx.vhost,
            &ctx.name,
            &src.uri,
            &dest.uri,
            &ends,
        )
    });
    Amend {
        set: def.publish_properties.clone(),
        forward,
        timestamp: def.add_timestamp_header,
    }
}

fn now_secs() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

async fn pump(
    ctx: &Ctx,
    def: &ShovelDef,
    amend: &Amend,
    source: &mut SourceEnd,
    dest: &mut DestEnd,
) -> Result<Finished, String> {
    let limit = match def.delete_after {
        DeleteAfter::Never => None,
        DeleteAfter::QueueLength => Some(source.initial_len()),
        DeleteAfter::Count(n) => Some(n),
    };
    ctx.status.lock().remaining = limit;
    if limit == Some(0) {
        return Ok(Finished::DeleteAfter);
    }
    // Publishes awaiting their confirm: seq -> the source's tag.
    let mut waiting: BTreeMap<u64, u64> = BTreeMap::new();
    let (mut seq, mut taken, mut done) = (0u64, 0u64, 0u64);
    loop {
        if limit.is_some_and(|l| done >= l) && waiting.is_empty() {
            return Ok(Finished::DeleteAfter);
        }
        let more = limit.is_none_or(|l| taken < l);
        tokio::select! {
            biased;
            c = dest.confirmed(), if !waiting.is_empty() => {
                let (s, ok) = c?;
                if let Some(tag) = waiting.remove(&s) {
                    settle(source, tag, ok).await?;
                    if ok {
                        done += 1;
                    }
                }
                ctx.status.lock().settled(waiting.len(), limit.map(|l| l - done));
            }
            d = source.next(), if more => {
                let d = d?;
                taken += 1;
                if def.ack_mode == AckMode::NoAck {
                    // A local source is settled on arrival (a remote one consumed no-ack).
                    source.ack(d.tag).await?;
                }
                let (exchange, key) = route(&def.dest, &d);
                let props = amend.apply(d.properties, now_secs());
                seq += 1;
                let at_once = dest.publish(seq, exchange, key, props, d.body).await?;
                match (def.ack_mode, at_once) {
                    (AckMode::OnConfirm, None) => {
                        waiting.insert(seq, d.tag);
                    }
                    (AckMode::OnConfirm, Some(ok)) => {
                        settle(source, d.tag, ok).await?;
                        done += ok as u64;
                    }
                    (AckMode::OnPublish, _) => {
                        source.ack(d.tag).await?;
                        done += 1;
                    }
                    (AckMode::NoAck, _) => done += 1,
                }
                ctx.status
                    .lock()
                    .forwarded(waiting.len(), limit.map(|l| l.saturating_sub(done)));
            }
        }
    }
}

/// Acks the source's delivery once the destination stored it, else puts it back.
async fn settle(source: &mut SourceEnd, tag: u64, ok: bool) -> Result<(), String> {
    if ok {
        source.ack(tag).await
    } else {
        source.requeue(tag).await
    }
}

/// The exchange and routing key a message is published with: the destination's queue by the
/// default exchange, or its exchange and key where set, else the message's own.
fn route(dest: &Dest, d: &Delivery) -> (ByteString, ByteString) {
    match dest {
        Dest::Queue { name, .. } => (ByteString::new(), ByteString::from(name.as_str())),
        Dest::Exchange { name, key } => (
            name.as_deref()
                .map(ByteString::from)
                .unwrap_or_else(|| d.exchange.clone()),
            key.as_deref()
                .map(ByteString::from)
                .unwrap_or_else(|| d.routing_key.clone()),
        ),
    }
}
