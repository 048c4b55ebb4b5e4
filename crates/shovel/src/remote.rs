//! A shovel's ends on another broker (a remote Warren, RabbitMQ, LavinMQ), over AMQP 0-9-1
//! with lapin: the source consumes with the shovel's prefetch, the destination publishes
//! (in confirm mode for `on-confirm`). Properties cross as AMQP encodes them (`props.rs`).

use std::collections::VecDeque;
use std::future::poll_fn;
use std::pin::Pin;
use std::time::Duration;

use bytes::Bytes;
use bytestring::ByteString;
use futures_core::Stream;
use lapin::options::{
    BasicAckOptions, BasicConsumeOptions, BasicNackOptions, BasicPublishOptions, BasicQosOptions,
    ConfirmSelectOptions, QueueBindOptions, QueueDeclareOptions, QueueDeleteOptions,
};
use lapin::tcp::{OwnedIdentity, OwnedTLSConfig};
use lapin::types::{AMQPValue, FieldArray, FieldTable, LongString, ShortString};
use lapin::uri::{AMQPAuthority, AMQPQueryString, AMQPScheme, AMQPUri, AMQPUserInfo};
use lapin::{Channel, Connection, ConnectionProperties, PublisherConfirm};
use serde_json::{Map, Value};

use crate::delivery::Delivery;
use crate::params::Source;
use crate::uri::Remote;

/// How long a connection attempt may take unless the URI says (`connection_timeout`, ms).
const CONNECT_TIMEOUT: Duration = Duration::from_secs(30);

fn err(e: lapin::Error) -> String {
    e.to_string()
}

/// A JSON table (queue or consumer arguments) as the client's type.
pub fn client_table(args: &Map<String, Value>) -> FieldTable {
    let mut t = FieldTable::default();
    for (k, v) in args {
        t.insert(ShortString::from(k.as_str()), client_value(v));
    }
    t
}

fn client_value(v: &Value) -> AMQPValue {
    match v {
        Value::Null => AMQPValue::Void,
        Value::Bool(b) => AMQPValue::Boolean(*b),
        Value::Number(n) => match n.as_i64() {
            Some(i) => AMQPValue::LongLongInt(i),
            None => AMQPValue::Double(n.as_f64().unwrap_or(0.0)),
        },
        Value::String(s) => AMQPValue::LongString(LongString::from(s.as_str())),
        Value::Array(a) => AMQPValue::FieldArray(FieldArray::from(
            a.iter().map(client_value).collect::<Vec<_>>(),
        )),
        Value::Object(o) => AMQPValue::FieldTable(client_table(o)),
    }
}

/// Opens a connection with the client-provided name `name` (RabbitMQ names a shovel's
/// `Shovel NAME`, a federation link's `Federation link (upstream: U, policy: P)`).
pub async fn connect(r: &Remote, name: &str) -> Result<Connection, String> {
    if r.tls && !r.verify_peer {
        return Err("verify_none is not supported: give the server's CA as cacertfile".into());
    }
    let uri = AMQPUri {
        scheme: if r.tls {
            AMQPScheme::AMQPS
        } else {
            AMQPScheme::AMQP
        },
        authority: AMQPAuthority {
            userinfo: AMQPUserInfo {
                username: r.user.clone(),
                password: r.password.clone(),
            },
            host: r.host.clone(),
            port: r.port,
        },
        vhost: r.vhost.clone(),
        query: AMQPQueryString {
            frame_max: r.frame_max,
            channel_max: r.channel_max,
            heartbeat: r.heartbeat,
            connection_timeout: r.connection_timeout,
            auth_mechanism: None,
        },
    };
    let read = |path: &str| std::fs::read(path).map_err(|e| format!("cannot read {path}: {e}"));
    let mut tls = OwnedTLSConfig::default();
    if r.tls {
        if let Some(ca) = &r.cacertfile {
            tls.cert_chain = Some(String::from_utf8_lossy(&read(ca)?).into_owned());
        }
        if let (Some(cert), Some(key)) = (&r.certfile, &r.keyfile) {
            tls.identity = Some(OwnedIdentity::PKCS8 {
                pem: read(cert)?,
                key: read(key)?,
            });
        }
    }
    let props = ConnectionProperties::default().with_connection_name(LongString::from(name));
    let runtime = lapin::runtime::default_runtime().map_err(err)?;
    let wait = r
        .connection_timeout
        .map(Duration::from_millis)
        .unwrap_or(CONNECT_TIMEOUT);
    tokio::time::timeout(
        wait,
        Connection::connect_uri_with_config(uri, props, tls, runtime),
    )
    .await
    .map_err(|_| format!("could not connect to {}:{} within {wait:?}", r.host, r.port))?
    .map_err(err)
}

/// RabbitMQ's `ensure_queue` over a connection: a passive declare, and a durable declare with
/// `args` if the queue is not there (the passive declare's 404 closed its channel). Returns its
/// message count.
async fn ensure_queue(
    conn: &Connection,
    name: &str,
    args: &Map<String, Value>,
) -> Result<u64, String> {
    let ch = conn.create_channel().await.map_err(err)?;
    let passive = QueueDeclareOptions {
        passive: true,
        ..Default::default()
    };
    match ch
        .queue_declare(name.into(), passive, FieldTable::default())
        .await
    {
        Ok(q) => {
            let _ = ch.close(200, "OK".into()).await;
            Ok(q.message_count() as u64)
        }
        Err(_) => {
            let ch = conn.create_channel().await.map_err(err)?;
            let durable = QueueDeclareOptions {
                durable: true,
                ..Default::default()
            };
            let q = ch
                .queue_declare(name.into(), durable, client_table(args))
                .await
                .map_err(err)?;
            let _ = ch.close(200, "OK".into()).await;
            Ok(q.message_count() as u64)
        }
    }
}

/// Acks a delivery (`ok`) or puts it back in its queue (a destination refused it).
pub async fn settle(ch: &Channel, tag: u64, ok: bool) -> Result<(), String> {
    if ok {
        ch.basic_ack(tag, BasicAckOptions::default()).await
    } else {
        ch.basic_nack(
            tag,
            BasicNackOptions {
                requeue: true,
                ..Default::default()
            },
        )
        .await
    }
    .map_err(err)
}

/// A queue on another broker that the shovel consumes.
pub struct RemoteSource {
    conn: Connection,
    ch: Channel,
    consumer: lapin::Consumer,
    no_ack: bool,
    /// The server-named queue it declared for `src-exchange` (exclusive: it goes with the
    /// connection, deleted at close all the same).
    own_queue: Option<String>,
    pub initial_len: u64,
}

impl RemoteSource {
    pub async fn open(
        conn: Connection,
        source: &Source,
        prefetch: u16,
        no_ack: bool,
        consumer_args: &Map<String, Value>,
    ) -> Result<RemoteSource, String> {
        let (queue, initial_len, own_queue) = match source {
            Source::Queue { name, args } => {
                let n = ensure_queue(&conn, name, args).await?;
                (name.clone(), n, None)
            }
            Source::Exchange { .. } => (String::new(), 0, None),
        };
        let ch = conn.create_channel().await.map_err(err)?;
        let (queue, own_queue) = match source {
            Source::Exchange { name, key } => {
                let exclusive = QueueDeclareOptions {
                    exclusive: true,
                    ..Default::default()
                };
                let q = ch
                    .queue_declare("".into(), exclusive, FieldTable::default())
                    .await
                    .map_err(err)?;
                let qname = q.name().to_string();
                ch.queue_bind(
                    qname.as_str().into(),
                    name.as_str().into(),
                    key.as_str().into(),
                    QueueBindOptions::default(),
                    FieldTable::default(),
                )
                .await
                .map_err(err)?;
                (qname.clone(), Some(qname))
            }
            Source::Queue { .. } => (queue, own_queue),
        };
        if !no_ack {
            ch.basic_qos(prefetch, BasicQosOptions::default())
                .await
                .map_err(err)?;
        }
        let consumer = ch
            .basic_consume(
                queue.as_str().into(),
                "".into(),
                BasicConsumeOptions {
                    no_ack,
                    ..Default::default()
                },
                client_table(consumer_args),
            )
            .await
            .map_err(err)?;
        Ok(RemoteSource {
            conn,
            ch,
            consumer,
            no_ack,
            own_queue,
            initial_len,
        })
    }

    pub async fn next(&mut self) -> Result<Delivery, String> {
        let c = &mut self.consumer;
        match poll_fn(|cx| Pin::new(&mut *c).poll_next(cx)).await {
            Some(Ok(d)) => Ok(Delivery {
                tag: d.delivery_tag,
                exchange: ByteString::from(d.exchange.as_str()),
                routing_key: ByteString::from(d.routing_key.as_str()),
                properties: crate::props::from_client(&d.properties),
                body: Bytes::from(d.data),
            }),
            Some(Err(e)) => Err(err(e)),
            None => Err("consumer cancelled by the source broker".into()),
        }
    }

    pub async fn ack(&mut self, tag: u64) -> Result<(), String> {
        if self.no_ack {
            return Ok(());
        }
        settle(&self.ch, tag, true).await
    }

    pub async fn requeue(&mut self, tag: u64) -> Result<(), String> {
        settle(&self.ch, tag, false).await
    }

    /// Closes the connection; unacked deliveries go back to their queue with it.
    pub async fn close(self) {
        if let Some(q) = &self.own_queue {
            let _ = self
                .ch
                .queue_delete(q.as_str().into(), QueueDeleteOptions::default())
                .await;
        }
        let _ = self.conn.close(200, "OK".into()).await;
    }
}

/// Another broker the shovel publishes to.
pub struct RemoteDest {
    conn: Connection,
    ch: Channel,
    confirm: bool,
    /// Publishes awaiting their confirm, oldest first.
    waiting: VecDeque<(u64, PublisherConfirm)>,
}

impl RemoteDest {
    pub async fn open(
        conn: Connection,
        dest_queue: Option<(&str, &Map<String, Value>)>,
        confirm: bool,
    ) -> Result<RemoteDest, String> {
        if let Some((name, args)) = dest_queue {
            ensure_queue(&conn, name, args).await?;
        }
        let ch = conn.create_channel().await.map_err(err)?;
        if confirm {
            ch.confirm_select(ConfirmSelectOptions::default())
                .await
                .map_err(err)?;
        }
        Ok(RemoteDest {
            conn,
            ch,
            confirm,
            waiting: VecDeque::new(),
        })
    }

    pub async fn publish(
        &mut self,
        seq: u64,
        exchange: &str,
        routing_key: &str,
        properties: &Bytes,
        body: &[u8],
    ) -> Result<(), String> {
        let props = crate::props::to_client(properties).unwrap_or_default();
        let c = self
            .ch
            .basic_publish(
                exchange.into(),
                routing_key.into(),
                BasicPublishOptions::default(),
                body,
                props,
            )
            .await
            .map_err(err)?;
        if self.confirm {
            self.waiting.push_back((seq, c));
        }
        Ok(())
    }

    /// The next confirm: (seq, acked). Pending forever while none is awaited.
    pub async fn confirmed(&mut self) -> Result<(u64, bool), String> {
        let Some((seq, front)) = self.waiting.front_mut() else {
            return std::future::pending().await;
        };
        let seq = *seq;
        let r = front.await;
        self.waiting.pop_front();
        Ok((seq, r.map_err(err)?.is_ack()))
    }

    pub async fn close(self) {
        let _ = self.conn.close(200, "OK".into()).await;
    }
}
