//! One federated queue's link to one upstream, as RabbitMQ's `rabbit_federation_queue_link`
//! runs it: messages move from the upstream queue to the downstream one only while the
//! downstream has consumers waiting and nothing to give them.
//!
//! 1. The upstream's `consumer_priorities` capability is checked (the link's consumer must
//!    stand behind the upstream's own consumers), and the upstream queue (the upstream's
//!    `queue`, or the downstream queue's name) declared as the downstream queue is: durable,
//!    auto-delete and arguments.
//! 2. While the downstream queue is *starving* (nothing ready, and a consumer of priority 0 or
//!    more has credit: [`warren_broker::queue::QueueRef::starving`], RabbitMQ's decorator's
//!    `is_empty` and `max_active_consumer_priority >= 0`), the link consumes the upstream
//!    queue with the upstream's prefetch and `x-priority` -1, so the upstream's own consumers
//!    come first and another federated queue's link does not count as demand there; otherwise
//!    it cancels that consumer. RabbitMQ's queue tells its decorator of every change; here the
//!    link looks every [`WATCH`], which keeps the publish and deliver paths free of any hook.
//! 3. Each message is published to the downstream queue (the default exchange, its name as
//!    the routing key) with an `x-received-from` entry prepended (the upstream's URI without
//!    credentials, the queue, `redelivered`, and `visit-count`, counting how often it came
//!    this way), its original exchange and routing key kept the first time in
//!    `x-original-exchange` and `x-original-routing-key` and a `CC` header renamed
//!    `x-original-cc`; and settled upstream by the ack mode (`forward.rs`).

use std::future::poll_fn;
use std::time::Duration;

use bytes::Bytes;
use futures_core::Stream;
use lapin::options::{
    BasicCancelOptions, BasicConsumeOptions, BasicQosOptions, QueueDeclareOptions,
};
use lapin::types::{AMQPValue, FieldTable as ClientTable};
use lapin::Channel;
use warren_protocol::properties::BasicProperties;
use warren_protocol::{FieldTable, FieldValue};
use warren_routing::federation::RECEIVED_FROM;
use warren_shovel::params::AckMode;
use warren_shovel::uri::Target;

use crate::ctx::LinkCtx;
use crate::forward::Forwarder;

/// How often the link looks at whether the downstream queue is starving.
const WATCH: Duration = Duration::from_millis(20);

fn err(e: lapin::Error) -> String {
    e.to_string()
}

/// RabbitMQ's `update_headers`: `raw` with this hop recorded. `table` is the link's entry
/// (uri, queue); an earlier visit by the same link (same uri and queue) is taken out and its
/// `visit-count` carried on.
pub fn update_headers(
    raw: Bytes,
    table: &FieldTable,
    redelivered: bool,
    exchange: &str,
    routing_key: &str,
) -> Bytes {
    let Ok(mut p) = BasicProperties::decode(&raw) else {
        return raw;
    };
    let headers = p.headers.get_or_insert_with(FieldTable::new);
    let long = |s: &str| FieldValue::LongStr(Bytes::copy_from_slice(s.as_bytes()));
    let (mut been, count) = match headers.get(RECEIVED_FROM) {
        Some(FieldValue::Array(been)) => {
            let same = |t: &FieldTable| {
                ["uri", "virtual_host", "queue"]
                    .iter()
                    .all(|k| t.get(k) == table.get(k))
            };
            let mut count = 0;
            let mut rest = Vec::with_capacity(been.len());
            for e in been {
                match e {
                    FieldValue::Table(t) if same(t) => {
                        count = t
                            .get("visit-count")
                            .and_then(FieldValue::as_i64)
                            .unwrap_or(0)
                    }
                    other => rest.push(other.clone()),
                }
            }
            (rest, count)
        }
        // The first hop (or a header a client set, which RabbitMQ ignores too).
        _ => {
            headers.insert("x-original-exchange", long(exchange));
            headers.insert("x-original-routing-key", long(routing_key));
            (Vec::new(), 0)
        }
    };
    let mut entry = table.clone();
    entry
        .0
        .push(("redelivered".into(), FieldValue::Bool(redelivered)));
    entry
        .0
        .push(("visit-count".into(), FieldValue::I64(count + 1)));
    been.insert(0, FieldValue::Table(entry));
    for (k, _) in headers.0.iter_mut() {
        if &**k == "CC" {
            *k = "x-original-cc".into();
        }
    }
    headers.insert(RECEIVED_FROM, FieldValue::Array(been));
    p.to_bytes()
}

/// Runs the link until a connection or channel fails (`Err`, the reason).
pub async fn run(ctx: &LinkCtx) -> Result<(), String> {
    let up = &ctx.upstream;
    let ep = up
        .uris
        .get(rand::random::<usize>() % up.uris.len().max(1))
        .ok_or("the upstream has no uri")?;
    let Target::Remote(r) = &ep.target else {
        return Err("an upstream on this broker (amqp:// without a host) is not supported".into());
    };
    let q = ctx
        .broker
        .vhost(&ctx.vhost)
        .ok_or_else(|| format!("vhost '{}' does not exist", ctx.vhost))?
        .queue(&ctx.name)
        .ok_or_else(|| format!("no queue '{}' in vhost '{}'", ctx.name, ctx.vhost))?;
    if let Some(info) = crate::probe::server_info(r).await? {
        if !info.consumer_priorities {
            return Err("upstream_lacks_consumer_priorities".into());
        }
    }
    let conn = warren_shovel::remote::connect(
        r,
        &format!(
            "Federation link (upstream: {}, policy: {})",
            up.name, ctx.policy
        ),
    )
    .await?;
    let ch = conn.create_channel().await.map_err(err)?;
    // 1. The upstream queue, as the downstream one is.
    let up_q = up.queue.clone().unwrap_or_else(|| ctx.name.clone());
    let opts = q.options();
    ch.queue_declare(
        up_q.as_str().into(),
        QueueDeclareOptions {
            durable: opts.durable,
            auto_delete: opts.auto_delete,
            ..Default::default()
        },
        warren_shovel::props::table_to_client(&opts.arguments),
    )
    .await
    .map_err(err)?;
    let no_ack = up.ack_mode == AckMode::NoAck;
    if !no_ack {
        ch.basic_qos(up.prefetch, BasicQosOptions::default())
            .await
            .map_err(err)?;
    }
    let mut fwd = Forwarder::open(&ctx.broker, &ctx.vhost, up.ack_mode)?;
    let long = |s: &str| FieldValue::LongStr(Bytes::copy_from_slice(s.as_bytes()));
    let table = FieldTable(vec![
        ("uri".into(), long(&ep.redacted())),
        ("queue".into(), long(&ctx.name)),
    ]);
    ctx.status
        .lock()
        .running(ep.redacted(), String::new(), up_q.clone(), String::new());
    // 2. Consume while the downstream starves.
    let mut consumer: Option<lapin::Consumer> = None;
    // The consumer was cancelled; its stream still hands over what came before cancel-ok.
    let mut cancelled = false;
    let mut watch = tokio::time::interval(WATCH);
    watch.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            biased;
            c = fwd.confirmed(), if fwd.waiting() => fwd.settle(&ch, c).await?,
            d = next(&mut consumer), if consumer.is_some() => {
                let d = match d {
                    Some(Ok(d)) => d,
                    Some(Err(e)) => return Err(err(e)),
                    None if cancelled => {
                        consumer = None;
                        cancelled = false;
                        continue;
                    }
                    None => return Err("the upstream cancelled the link's consumer".into()),
                };
                // 3. To the downstream queue, this hop recorded.
                let props = update_headers(
                    warren_shovel::props::from_client(&d.properties),
                    &table,
                    d.redelivered,
                    d.exchange.as_str(),
                    d.routing_key.as_str(),
                );
                fwd.forward(&ch, d.delivery_tag, "", &ctx.name, props, Bytes::from(d.data)).await?;
                ctx.status.lock().forwarded += 1;
            }
            _ = watch.tick() => {
                let starving = q.starving();
                if starving && consumer.is_none() {
                    consumer = Some(consume(&ch, &up_q, &up.consumer_tag, no_ack).await?);
                } else if !starving && consumer.is_some() && !cancelled {
                    ch.basic_cancel(up.consumer_tag.as_str().into(), BasicCancelOptions::default())
                        .await
                        .map_err(err)?;
                    cancelled = true;
                }
            }
        }
    }
}

async fn next(c: &mut Option<lapin::Consumer>) -> Option<lapin::Result<lapin::message::Delivery>> {
    match c {
        Some(c) => poll_fn(|cx| std::pin::Pin::new(&mut *c).poll_next(cx)).await,
        None => std::future::pending().await,
    }
}

/// The link's consumer upstream: behind every consumer of priority 0 or more there.
async fn consume(
    ch: &Channel,
    queue: &str,
    tag: &str,
    no_ack: bool,
) -> Result<lapin::Consumer, String> {
    let mut args = ClientTable::default();
    args.insert("x-priority".into(), AMQPValue::LongLongInt(-1));
    ch.basic_consume(
        queue.into(),
        tag.into(),
        BasicConsumeOptions {
            no_ack,
            ..Default::default()
        },
        args,
    )
    .await
    .map_err(err)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn headers(raw: &Bytes) -> FieldTable {
        BasicProperties::decode(raw).unwrap().headers.unwrap()
    }

    #[test]
    fn hops_are_recorded_as_rabbitmq_records_them() {
        let long = |s: &str| FieldValue::LongStr(Bytes::copy_from_slice(s.as_bytes()));
        let link = FieldTable(vec![
            ("uri".into(), long("amqp://a")),
            ("queue".into(), long("q")),
        ]);
        let other = FieldTable(vec![
            ("uri".into(), long("amqp://b")),
            ("queue".into(), long("q")),
        ]);
        let p = BasicProperties {
            headers: Some(FieldTable(vec![("CC".into(), long("k2"))])),
            ..Default::default()
        }
        .to_bytes();
        // First hop: the original exchange and key kept, CC renamed.
        let one = update_headers(p, &link, false, "x", "k");
        let h = headers(&one);
        assert_eq!(h.get("x-original-exchange"), Some(&long("x")));
        assert_eq!(h.get("x-original-routing-key"), Some(&long("k")));
        assert_eq!(h.get("x-original-cc"), Some(&long("k2")));
        assert!(h.get("CC").is_none());
        let Some(FieldValue::Array(been)) = h.get(RECEIVED_FROM) else {
            panic!("no {RECEIVED_FROM}");
        };
        let FieldValue::Table(e) = &been[0] else {
            panic!("not a table")
        };
        assert_eq!(e.get("visit-count"), Some(&FieldValue::I64(1)));
        assert_eq!(e.get("redelivered"), Some(&FieldValue::Bool(false)));
        // Through another link, then back through the first: its count goes on, its entry
        // moves to the front, the original exchange stays.
        let two = update_headers(one, &other, true, "", "q");
        let three = update_headers(two, &link, false, "", "q");
        let h = headers(&three);
        assert_eq!(h.get("x-original-exchange"), Some(&long("x")));
        let Some(FieldValue::Array(been)) = h.get(RECEIVED_FROM) else {
            panic!("no {RECEIVED_FROM}");
        };
        assert_eq!(been.len(), 2);
        let (FieldValue::Table(first), FieldValue::Table(second)) = (&been[0], &been[1]) else {
            panic!("not tables")
        };
        assert_eq!(first.get("uri"), Some(&long("amqp://a")));
        assert_eq!(first.get("visit-count"), Some(&FieldValue::I64(2)));
        assert_eq!(second.get("uri"), Some(&long("amqp://b")));
        assert_eq!(second.get("redelivered"), Some(&FieldValue::Bool(true)));
    }
}
