//! One federated exchange's link to one upstream, as RabbitMQ's
//! `rabbit_federation_exchange_link` sets it up on the upstream broker (docs/design/
//! federation.md has the plan this follows):
//!
//! 1. the upstream exchange, declared as the downstream one is if it is missing;
//! 2. the queue `federation: X -> CLUSTER`, durable, with the upstream's `expires` and
//!    `message-ttl`;
//! 3. an internal exchange `federation: X -> CLUSTER A` (or `B`: a fresh one each time the
//!    link starts, the other deleted once the new one is bound) of type
//!    `x-federation-upstream` (a fanout if the upstream refuses that type), bound to the
//!    queue, and bound from the upstream exchange with each binding the downstream exchange
//!    has, followed as they change;
//! 4. the queue consumed with the upstream's prefetch, each message published to the
//!    downstream exchange (through the broker API) with an `x-received-from` entry prepended,
//!    and acked upstream once stored downstream (`on-confirm`).

use std::collections::BTreeMap;
use std::future::poll_fn;
use std::time::Duration;

use bytes::Bytes;
use futures_core::Stream;
use lapin::options::{
    BasicConsumeOptions, BasicQosOptions, ExchangeBindOptions, ExchangeDeclareOptions,
    ExchangeDeleteOptions, ExchangeUnbindOptions, QueueBindOptions, QueueDeclareOptions,
    QueueDeleteOptions,
};
use lapin::types::{AMQPValue, FieldTable as ClientTable, LongString, ShortString};
use lapin::{Channel, Connection, ExchangeKind};
use warren_protocol::{FieldTable, FieldValue};
use warren_routing::federation::{
    DOWNSTREAM_NAME_ARG, DOWNSTREAM_VHOST_ARG, MAX_HOPS_ARG, RECEIVED_FROM,
};
use warren_shovel::params::AckMode;
use warren_shovel::uri::{Endpoint, Remote, Target};

use crate::ctx::LinkCtx;
use crate::forward::Forwarder;
use crate::probe::ServerInfo;

/// RabbitMQ's binding header: where a binding came from, hop by hop.
const BOUND_FROM: &str = "x-bound-from";
/// How often the downstream exchange's bindings are compared with those made upstream.
const BINDINGS_CHECK: Duration = Duration::from_secs(1);

fn err(e: lapin::Error) -> String {
    e.to_string()
}

/// RabbitMQ's `upstream_queue_name`: `federation: UX -> CLUSTER`, with `:X` when the
/// downstream exchange has another name, `:VHOST:X` when it lives in another vhost.
pub fn queue_name(
    up_x: &str,
    up_vhost: &str,
    down_vhost: &str,
    down_x: &str,
    cluster: &str,
) -> String {
    let down = if down_vhost != up_vhost {
        format!(":{down_vhost}:{down_x}")
    } else if down_x != up_x {
        format!(":{down_x}")
    } else {
        String::new()
    };
    format!("federation: {up_x} -> {cluster}{down}")
}

fn long_string(s: &str) -> AMQPValue {
    AMQPValue::LongString(LongString::from(s))
}

/// A downstream binding's key and arguments, its arguments in their encoded form so that
/// bindings compare.
type Bound = (String, Vec<u8>);

fn encoded(t: &FieldTable) -> Vec<u8> {
    let mut b = bytes::BytesMut::new();
    warren_protocol::properties::BasicProperties {
        headers: Some(t.clone()),
        ..Default::default()
    }
    .encode(&mut b);
    b.to_vec()
}

/// The downstream exchange's bindings: (key, arguments).
fn downstream_bindings(ctx: &LinkCtx) -> BTreeMap<Bound, FieldTable> {
    let Some(v) = ctx.broker.vhost(&ctx.vhost) else {
        return BTreeMap::new();
    };
    let snap = v.snapshot();
    let Some(x) = snap.table.exchanges.get(ctx.name.as_str()) else {
        return BTreeMap::new();
    };
    x.bindings
        .iter()
        .map(|b| {
            (
                (b.routing_key.to_string(), encoded(&b.arguments)),
                b.arguments.clone(),
            )
        })
        .collect()
}

/// The upstream as its server properties name it (`probe.rs`) and the vhost the link uses.
pub struct Peer {
    pub cluster_name: Option<String>,
    pub vhost: String,
}

/// RabbitMQ's `already_seen`: an entry of `x-bound-from` (or `x-received-from`) names the
/// upstream's cluster and vhost.
fn seen(entries: &[FieldValue], peer: &Peer) -> bool {
    let Some(name) = &peer.cluster_name else {
        return false;
    };
    let is = |t: &FieldTable, k: &str, v: &str| matches!(t.get(k), Some(FieldValue::LongStr(b)) if b.as_ref() == v.as_bytes());
    entries.iter().any(|e| match e {
        FieldValue::Table(t) => is(t, "cluster-name", name) && is(t, "vhost", &peer.vhost),
        _ => false,
    })
}

/// RabbitMQ's `update_binding`: the binding's arguments with this hop prepended to
/// `x-bound-from`, or `None` when it is to go no further: no hops left, or it came from the
/// upstream in the first place (a cycle, known by the upstream's cluster name).
fn bound_from(ctx: &LinkCtx, peer: &Peer, suffix: char, args: &FieldTable) -> Option<FieldTable> {
    let max_hops = ctx.upstream.max_hops as i64;
    let hops = match args.get(BOUND_FROM) {
        Some(FieldValue::Array(all)) if seen(all, peer) => 0,
        Some(FieldValue::Array(all)) => {
            let prev = all.first().and_then(|h| match h {
                FieldValue::Table(t) => t.get("hops").and_then(FieldValue::as_i64),
                _ => None,
            });
            prev.map_or(max_hops, |p| (p - 1).min(max_hops))
        }
        _ => max_hops,
    };
    if hops <= 0 {
        return None;
    }
    let cluster = ctx.broker.cluster_name();
    let long = |s: &str| FieldValue::LongStr(Bytes::copy_from_slice(s.as_bytes()));
    let entry = FieldTable(vec![
        ("cluster-name".into(), long(&cluster)),
        ("vhost".into(), long(&ctx.vhost)),
        (
            "exchange".into(),
            long(&format!("{}:{} {suffix}", ctx.vhost, ctx.name)),
        ),
        (
            "hops".into(),
            FieldValue::I16(hops.min(i16::MAX as i64) as i16),
        ),
    ]);
    let mut out = args.clone();
    match out.0.iter_mut().find(|(k, _)| &**k == BOUND_FROM) {
        Some((_, FieldValue::Array(a))) => a.insert(0, FieldValue::Table(entry)),
        _ => {
            out.0.retain(|(k, _)| &**k != BOUND_FROM);
            out.0.push((
                BOUND_FROM.into(),
                FieldValue::Array(vec![FieldValue::Table(entry)]),
            ))
        }
    }
    Some(out)
}

/// A channel for one command that may close it (a passive declare's 404, a refused type).
async fn on_fresh_channel<T>(
    conn: &Connection,
    f: impl AsyncFnOnce(&Channel) -> lapin::Result<T>,
) -> Result<lapin::Result<T>, String> {
    let ch = conn.create_channel().await.map_err(err)?;
    let r = f(&ch).await;
    if r.is_ok() {
        let _ = ch.close(200, "OK".into()).await;
    }
    Ok(r)
}

fn client_kind(kind: &str) -> ExchangeKind {
    match kind {
        "direct" => ExchangeKind::Direct,
        "fanout" => ExchangeKind::Fanout,
        "topic" => ExchangeKind::Topic,
        "headers" => ExchangeKind::Headers,
        other => ExchangeKind::Custom(other.to_string()),
    }
}

/// Runs the link until a connection or channel fails (`Err`, the reason). `suffix` is the
/// internal exchange's last suffix, flipped each start.
pub async fn run(ctx: &LinkCtx, suffix: &mut char) -> Result<(), String> {
    let up = &ctx.upstream;
    let ep: &Endpoint = up
        .uris
        .get(rand::random::<usize>() % up.uris.len().max(1))
        .ok_or("the upstream has no uri")?;
    let Target::Remote(r) = &ep.target else {
        return Err("an upstream on this broker (amqp:// without a host) is not supported".into());
    };
    let (kind, durable, auto_delete, internal, xargs) = {
        let v = ctx
            .broker
            .vhost(&ctx.vhost)
            .ok_or_else(|| format!("vhost '{}' does not exist", ctx.vhost))?;
        let snap = v.snapshot();
        let x = snap
            .table
            .exchanges
            .get(ctx.name.as_str())
            .ok_or_else(|| format!("no exchange '{}' in vhost '{}'", ctx.name, ctx.vhost))?;
        (
            x.type_name().to_string(),
            x.durable,
            x.auto_delete,
            x.internal,
            x.arguments.clone(),
        )
    };
    let cluster = ctx.broker.cluster_name();
    let up_x = up.exchange.clone().unwrap_or_else(|| ctx.name.clone());
    let peer = Peer {
        cluster_name: crate::probe::server_info(r)
            .await?
            .and_then(|i: ServerInfo| i.cluster_name),
        vhost: r.vhost.clone(),
    };
    let conn = warren_shovel::remote::connect(
        r,
        &format!(
            "Federation link (upstream: {}, policy: {})",
            up.name, ctx.policy
        ),
    )
    .await?;
    // 1. The upstream exchange, as the downstream one is, unless it exists.
    let passive = ExchangeDeclareOptions {
        passive: true,
        ..Default::default()
    };
    let exists = on_fresh_channel(&conn, async |ch| {
        ch.exchange_declare(
            up_x.as_str().into(),
            client_kind(&kind),
            passive,
            ClientTable::default(),
        )
        .await
    })
    .await?
    .is_ok();
    if !exists {
        let decl = ExchangeDeclareOptions {
            durable,
            auto_delete,
            internal,
            ..Default::default()
        };
        let args = warren_shovel::props::table_to_client(&xargs);
        on_fresh_channel(&conn, async |ch| {
            ch.exchange_declare(up_x.as_str().into(), client_kind(&kind), decl, args)
                .await
        })
        .await?
        .map_err(err)?;
    }
    let ch = conn.create_channel().await.map_err(err)?;
    // 2. The queue.
    let q = queue_name(&up_x, &r.vhost, &ctx.vhost, &ctx.name, &cluster);
    let mut qargs = ClientTable::default();
    if let Some(e) = up.expires {
        qargs.insert(
            "x-expires".into(),
            AMQPValue::LongInt(e.clamp(1, i32::MAX as i64) as i32),
        );
    }
    if let Some(t) = up.message_ttl {
        qargs.insert(
            "x-message-ttl".into(),
            AMQPValue::LongInt(t.clamp(0, i32::MAX as i64) as i32),
        );
    }
    qargs.insert("x-internal-purpose".into(), long_string("federation"));
    ch.queue_declare(
        q.as_str().into(),
        QueueDeclareOptions {
            durable: true,
            ..Default::default()
        },
        qargs,
    )
    .await
    .map_err(err)?;
    // 3. A fresh internal exchange, bound to the queue and from the upstream exchange.
    let old = *suffix;
    let new = if old == 'A' { 'B' } else { 'A' };
    let int_x = format!("{q} {new}");
    let _ = on_fresh_channel(&conn, async |c| {
        c.exchange_delete(int_x.as_str().into(), ExchangeDeleteOptions::default())
            .await
    })
    .await;
    let mut xfu = ClientTable::default();
    xfu.insert(
        MAX_HOPS_ARG.into(),
        AMQPValue::LongLongInt(up.max_hops as i64),
    );
    xfu.insert(DOWNSTREAM_NAME_ARG.into(), long_string(&cluster));
    xfu.insert(DOWNSTREAM_VHOST_ARG.into(), long_string(&ctx.vhost));
    xfu.insert("x-internal-purpose".into(), long_string("federation"));
    let int_decl = ExchangeDeclareOptions {
        durable: true,
        internal: true,
        auto_delete: true,
        ..Default::default()
    };
    let typed = on_fresh_channel(&conn, async |c| {
        c.exchange_declare(
            int_x.as_str().into(),
            ExchangeKind::Custom("x-federation-upstream".into()),
            int_decl,
            xfu,
        )
        .await
    })
    .await?;
    if typed.is_err() {
        // A broker without the type (503 COMMAND_INVALID): a fanout, as RabbitMQ falls back.
        let mut purpose = ClientTable::default();
        purpose.insert("x-internal-purpose".into(), long_string("federation"));
        ch.exchange_declare(
            int_x.as_str().into(),
            ExchangeKind::Fanout,
            int_decl,
            purpose,
        )
        .await
        .map_err(err)?;
    }
    ch.queue_bind(
        q.as_str().into(),
        int_x.as_str().into(),
        "".into(),
        QueueBindOptions::default(),
        ClientTable::default(),
    )
    .await
    .map_err(err)?;
    let mut bound: BTreeMap<Bound, Option<FieldTable>> = BTreeMap::new();
    sync_bindings(ctx, &peer, &ch, &up_x, &int_x, new, &mut bound).await?;
    let _ = on_fresh_channel(&conn, async |c| {
        c.exchange_delete(
            format!("{q} {old}").as_str().into(),
            ExchangeDeleteOptions::default(),
        )
        .await
    })
    .await;
    *suffix = new;
    // 4. Consume and republish downstream.
    let no_ack = up.ack_mode == AckMode::NoAck;
    if !no_ack {
        ch.basic_qos(up.prefetch, BasicQosOptions::default())
            .await
            .map_err(err)?;
    }
    let mut consumer = ch
        .basic_consume(
            q.as_str().into(),
            "".into(),
            BasicConsumeOptions {
                no_ack,
                ..Default::default()
            },
            ClientTable::default(),
        )
        .await
        .map_err(err)?;
    let mut fwd = Forwarder::open(&ctx.broker, &ctx.vhost, up.ack_mode)?;
    {
        let mut st = ctx.status.lock();
        st.running(ep.redacted(), up_x.clone(), q.clone(), int_x.clone());
        st.made_upstream = Some((r.clone(), q.clone(), int_x.clone()));
    }
    let received_from = |redelivered: bool| received_from(ep, &ctx.name, &peer, redelivered);
    let mut tick = tokio::time::interval(BINDINGS_CHECK);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            biased;
            c = fwd.confirmed(), if fwd.waiting() => fwd.settle(&ch, c).await?,
            d = poll_fn(|cx| std::pin::Pin::new(&mut consumer).poll_next(cx)) => {
                let d = match d {
                    Some(Ok(d)) => d,
                    Some(Err(e)) => return Err(err(e)),
                    None => return Err("the upstream cancelled the link's consumer".into()),
                };
                let props = warren_shovel::props::from_client(&d.properties);
                let props = warren_shovel::props::prepend_header_table(
                    props,
                    RECEIVED_FROM,
                    received_from(d.redelivered),
                );
                fwd.forward(&ch, d.delivery_tag, &ctx.name, d.routing_key.as_str(), props, Bytes::from(d.data)).await?;
                ctx.status.lock().forwarded += 1;
            }
            _ = tick.tick() => {
                sync_bindings(ctx, &peer, &ch, &up_x, &int_x, new, &mut bound).await?;
            }
        }
    }
}

/// Deletes what a link made on its upstream (its queue and internal exchange), as RabbitMQ's
/// link does when it stops for good (`resource-cleanup-mode` `default`).
pub async fn clean_up(r: &Remote, queue: &str, internal: &str) -> Result<(), String> {
    let conn = warren_shovel::remote::connect(r, "Federation link clean-up").await?;
    let _ = on_fresh_channel(&conn, async |c| {
        c.exchange_delete(internal.into(), ExchangeDeleteOptions::default())
            .await
    })
    .await?;
    let _ = on_fresh_channel(&conn, async |c| {
        c.queue_delete(queue.into(), QueueDeleteOptions::default())
            .await
    })
    .await?;
    let _ = conn.close(200, "OK".into()).await;
    Ok(())
}

/// The `x-received-from` entry for a message from this upstream, as RabbitMQ's
/// `update_routing_headers` writes it: its URI (without credentials), the (downstream)
/// exchange, redelivered
/// flag, cluster name (when the upstream sent one) and vhost. The upstream's
/// `x-federation-upstream` exchange drops a message that already names the downstream there.
fn received_from(ep: &Endpoint, x: &str, peer: &Peer, redelivered: bool) -> FieldTable {
    let long = |s: &str| FieldValue::LongStr(Bytes::copy_from_slice(s.as_bytes()));
    let mut t = vec![
        ("uri".into(), long(&ep.redacted())),
        ("exchange".into(), long(x)),
        ("redelivered".into(), FieldValue::Bool(redelivered)),
    ];
    if let Some(n) = &peer.cluster_name {
        t.push(("cluster-name".into(), long(n)));
    }
    t.push(("vhost".into(), long(&peer.vhost)));
    FieldTable(t)
}

/// Binds the upstream exchange to the internal one with each binding the downstream exchange
/// has now, and unbinds those it no longer has. `bound` keeps the arguments each was bound with
/// (`None`: not bound upstream, its hops used up).
async fn sync_bindings(
    ctx: &LinkCtx,
    peer: &Peer,
    ch: &Channel,
    up_x: &str,
    int_x: &str,
    suffix: char,
    bound: &mut BTreeMap<Bound, Option<FieldTable>>,
) -> Result<(), String> {
    let want = downstream_bindings(ctx);
    for (key, args) in &want {
        if bound.contains_key(key) {
            continue;
        }
        let with = bound_from(ctx, peer, suffix, args);
        if let Some(a) = &with {
            ch.exchange_bind(
                int_x.into(),
                up_x.into(),
                ShortString::from(key.0.as_str()),
                ExchangeBindOptions::default(),
                warren_shovel::props::table_to_client(a),
            )
            .await
            .map_err(err)?;
        }
        bound.insert(key.clone(), with);
    }
    let gone: Vec<Bound> = bound
        .keys()
        .filter(|k| !want.contains_key(*k))
        .cloned()
        .collect();
    for key in gone {
        if let Some(Some(a)) = bound.remove(&key) {
            ch.exchange_unbind(
                int_x.into(),
                up_x.into(),
                ShortString::from(key.0.as_str()),
                ExchangeUnbindOptions::default(),
                warren_shovel::props::table_to_client(&a),
            )
            .await
            .map_err(err)?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn queue_names_as_rabbitmq_writes_them() {
        assert_eq!(queue_name("x", "/", "/", "x", "c1"), "federation: x -> c1");
        assert_eq!(
            queue_name("up", "/", "/", "x", "c1"),
            "federation: up -> c1:x"
        );
        assert_eq!(
            queue_name("x", "/", "v", "x", "c1"),
            "federation: x -> c1:v:x"
        );
    }
}
