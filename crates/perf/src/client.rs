//! A lean AMQP 0-9-1 client over `warren-protocol`: the handshake and the synchronous methods a
//! load generator needs before its hot loop (declare, bind, qos, consume, confirm.select).
//! The hot loops (`producer.rs`, `consumer.rs`) take the socket over afterwards.
//!
//! Why not lapin: measured hot path. A generator must cost less per message than the broker it
//! loads; here a publish is one `memcpy` of a pre-encoded frame template plus a 12-byte patch, a
//! delivery is parsed in place from the read buffer, and a whole read's worth of acks goes out
//! in one write. lapin allocates per message and hops through its own I/O loop and channels.

use std::time::Duration;

use bytes::BytesMut;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use warren_protocol::frame::{write_method, FRAME_MIN_SIZE};
use warren_protocol::method::*;
use warren_protocol::{DecodeError, FieldTable, FieldValue, FrameDecoder, FrameKind, Method};

use crate::uri::AmqpUri;

/// Channel used for all traffic of a client (one channel per connection, as PerfTest does).
pub const CHANNEL: u16 = 1;
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
const RPC_TIMEOUT: Duration = Duration::from_secs(30);

#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("I/O error: {0}")]
    Io(#[from] std::io::Error),
    #[error("protocol error: {0}")]
    Decode(#[from] DecodeError),
    #[error("{what} closed by the broker: {code} {text}")]
    Closed {
        what: &'static str,
        code: u16,
        text: String,
    },
    #[error("{0}")]
    Protocol(String),
}

/// A connection during setup: owns the socket and its buffers.
pub struct Conn {
    pub stream: TcpStream,
    /// Bytes read but not yet parsed; the hot loop continues from here.
    pub rbuf: BytesMut,
    wbuf: BytesMut,
    decoder: FrameDecoder,
    pub frame_max: u32,
    pub peer: String,
}

impl Conn {
    /// Connects and runs the handshake (PLAIN, no heartbeats, frame_max as the server offers).
    pub async fn open(uri: &AmqpUri, name: &str) -> Result<Conn, ClientError> {
        let peer = format!("{}:{}", uri.host, uri.port);
        let stream = tokio::time::timeout(
            CONNECT_TIMEOUT,
            TcpStream::connect((uri.host.as_str(), uri.port)),
        )
        .await
        .map_err(|_| ClientError::Protocol(format!("connect to {peer} timed out")))?
        .map_err(|e| ClientError::Protocol(format!("cannot connect to {peer}: {e}")))?;
        stream.set_nodelay(true)?;
        let mut c = Conn {
            stream,
            rbuf: BytesMut::with_capacity(64 * 1024),
            wbuf: BytesMut::with_capacity(4096),
            decoder: FrameDecoder::new(0),
            frame_max: FRAME_MIN_SIZE,
            peer,
        };
        tokio::time::timeout(RPC_TIMEOUT, c.handshake(uri, name))
            .await
            .map_err(|_| ClientError::Protocol(format!("handshake with {} timed out", c.peer)))??;
        Ok(c)
    }

    async fn handshake(&mut self, uri: &AmqpUri, name: &str) -> Result<(), ClientError> {
        self.stream
            .write_all(warren_protocol::PROTOCOL_HEADER)
            .await?;
        match self.next_method(0).await? {
            Method::ConnectionStart(s) => {
                if !s.mechanisms.split(|b| *b == b' ').any(|m| m == b"PLAIN") {
                    return Err(ClientError::Protocol(format!(
                        "{} does not offer PLAIN authentication",
                        self.peer
                    )));
                }
            }
            m => return Err(unexpected(&m, "connection.start")),
        }
        let mut caps = FieldTable::new();
        for c in [
            "publisher_confirms",
            "basic.nack",
            "consumer_cancel_notify",
            "connection.blocked",
            "authentication_failure_close",
        ] {
            caps.insert(c, FieldValue::Bool(true));
        }
        let mut props = FieldTable::new();
        props.insert("product", long_str("warren-perf"));
        props.insert("version", long_str(env!("CARGO_PKG_VERSION")));
        props.insert("connection_name", long_str(name));
        props.insert("capabilities", FieldValue::Table(caps));
        let response = format!("\0{}\0{}", uri.user, uri.password);
        self.send(
            0,
            ConnectionStartOk {
                client_properties: props,
                mechanism: "PLAIN".into(),
                response: response.into_bytes().into(),
                locale: "en_US".into(),
            }
            .into(),
        )
        .await?;
        let tune = match self.next_method(0).await {
            Ok(Method::ConnectionTune(t)) => t,
            Ok(m) => return Err(unexpected(&m, "connection.tune")),
            Err(ClientError::Io(e)) if e.kind() == std::io::ErrorKind::UnexpectedEof => {
                return Err(ClientError::Protocol(format!(
                    "{} closed the connection during login (wrong user or password for '{}'?)",
                    self.peer, uri.user
                )))
            }
            Err(e) => return Err(e),
        };
        self.frame_max = match tune.frame_max {
            0 => 131_072,
            n => n.max(FRAME_MIN_SIZE),
        };
        self.send(
            0,
            ConnectionTuneOk {
                channel_max: tune.channel_max,
                frame_max: self.frame_max,
                heartbeat: 0,
            }
            .into(),
        )
        .await?;
        self.decoder = FrameDecoder::new(self.frame_max);
        self.send(
            0,
            ConnectionOpen {
                virtual_host: uri.vhost.as_str().into(),
                ..Default::default()
            }
            .into(),
        )
        .await?;
        match self.next_method(0).await? {
            Method::ConnectionOpenOk(_) => Ok(()),
            m => Err(unexpected(&m, "connection.open-ok")),
        }
    }

    pub async fn send(&mut self, channel: u16, m: Method) -> Result<(), ClientError> {
        self.wbuf.clear();
        write_method(&mut self.wbuf, channel, &m);
        self.stream.write_all(&self.wbuf).await?;
        Ok(())
    }

    /// The next method frame on `channel` (or channel 0). Closes from the broker become errors
    /// (after answering them); content frames and heartbeats are skipped.
    async fn next_method(&mut self, channel: u16) -> Result<Method, ClientError> {
        loop {
            let frame = loop {
                if let Some(f) = self.decoder.decode(&mut self.rbuf)? {
                    break f;
                }
                if self.stream.read_buf(&mut self.rbuf).await? == 0 {
                    return Err(std::io::Error::from(std::io::ErrorKind::UnexpectedEof).into());
                }
            };
            if frame.kind != FrameKind::Method || (frame.channel != channel && frame.channel != 0) {
                continue;
            }
            match Method::decode(&frame.payload)? {
                Method::ConnectionClose(c) => {
                    let _ = self.send(0, ConnectionCloseOk {}.into()).await;
                    return Err(ClientError::Closed {
                        what: "connection",
                        code: c.reply_code,
                        text: c.reply_text.to_string(),
                    });
                }
                Method::ChannelClose(c) => {
                    let _ = self.send(frame.channel, ChannelCloseOk {}.into()).await;
                    return Err(ClientError::Closed {
                        what: "channel",
                        code: c.reply_code,
                        text: c.reply_text.to_string(),
                    });
                }
                Method::ConnectionBlocked(_) | Method::ConnectionUnblocked(_) => continue,
                m => return Ok(m),
            }
        }
    }

    /// Sends a synchronous method and waits for its reply.
    async fn rpc(&mut self, channel: u16, m: Method) -> Result<Method, ClientError> {
        let name = m.name();
        self.send(channel, m).await?;
        tokio::time::timeout(RPC_TIMEOUT, self.next_method(channel))
            .await
            .map_err(|_| ClientError::Protocol(format!("no reply to {name} from {}", self.peer)))?
    }

    pub async fn channel_open(&mut self, channel: u16) -> Result<(), ClientError> {
        match self.rpc(channel, ChannelOpen::default().into()).await? {
            Method::ChannelOpenOk(_) => Ok(()),
            m => Err(unexpected(&m, "channel.open-ok")),
        }
    }

    pub async fn exchange_declare(&mut self, name: &str, kind: &str) -> Result<(), ClientError> {
        // Durable, as PerfTest declares it: a redeclare with other flags fails with 406.
        let m = ExchangeDeclare {
            exchange: name.into(),
            kind: kind.into(),
            durable: true,
            ..Default::default()
        };
        match self.rpc(CHANNEL, m.into()).await? {
            Method::ExchangeDeclareOk(_) => Ok(()),
            m => Err(unexpected(&m, "exchange.declare-ok")),
        }
    }

    /// Declares a queue; returns its name (the server's for `""`).
    pub async fn queue_declare(
        &mut self,
        name: &str,
        durable: bool,
        auto_delete: bool,
        arguments: &FieldTable,
    ) -> Result<String, ClientError> {
        let m = QueueDeclare {
            queue: name.into(),
            durable,
            auto_delete,
            arguments: arguments.clone(),
            ..Default::default()
        };
        match self.rpc(CHANNEL, m.into()).await? {
            Method::QueueDeclareOk(ok) => Ok(ok.queue.to_string()),
            m => Err(unexpected(&m, "queue.declare-ok")),
        }
    }

    /// Whether a queue (or exchange) exists: a passive declare; a 404 closes the channel, which
    /// is reopened.
    pub async fn exists(
        &mut self,
        queue: Option<&str>,
        exchange: Option<&str>,
    ) -> Result<bool, ClientError> {
        let m: Method = match (queue, exchange) {
            (Some(q), _) => QueueDeclare {
                queue: q.into(),
                passive: true,
                ..Default::default()
            }
            .into(),
            (None, Some(e)) => ExchangeDeclare {
                exchange: e.into(),
                passive: true,
                ..Default::default()
            }
            .into(),
            (None, None) => return Ok(false),
        };
        match self.rpc(CHANNEL, m).await {
            Ok(_) => Ok(true),
            Err(ClientError::Closed {
                what: "channel",
                code: 404,
                ..
            }) => {
                self.channel_open(CHANNEL).await?;
                Ok(false)
            }
            Err(e) => Err(e),
        }
    }

    pub async fn queue_bind(
        &mut self,
        queue: &str,
        exchange: &str,
        routing_key: &str,
    ) -> Result<(), ClientError> {
        let m = QueueBind {
            queue: queue.into(),
            exchange: exchange.into(),
            routing_key: routing_key.into(),
            ..Default::default()
        };
        match self.rpc(CHANNEL, m.into()).await? {
            Method::QueueBindOk(_) => Ok(()),
            m => Err(unexpected(&m, "queue.bind-ok")),
        }
    }

    pub async fn basic_qos(&mut self, prefetch_count: u16) -> Result<(), ClientError> {
        let m = BasicQos {
            prefetch_count,
            ..Default::default()
        };
        match self.rpc(CHANNEL, m.into()).await? {
            Method::BasicQosOk(_) => Ok(()),
            m => Err(unexpected(&m, "basic.qos-ok")),
        }
    }

    pub async fn confirm_select(&mut self) -> Result<(), ClientError> {
        match self.rpc(CHANNEL, ConfirmSelect::default().into()).await? {
            Method::ConfirmSelectOk(_) => Ok(()),
            m => Err(unexpected(&m, "confirm.select-ok")),
        }
    }

    /// Starts a consumer. Deliveries may follow consume-ok in the same read; they stay in `rbuf`.
    pub async fn basic_consume(
        &mut self,
        queue: &str,
        no_ack: bool,
        arguments: &FieldTable,
    ) -> Result<(), ClientError> {
        let m = BasicConsume {
            queue: queue.into(),
            no_ack,
            arguments: arguments.clone(),
            ..Default::default()
        };
        match self.rpc(CHANNEL, m.into()).await? {
            Method::BasicConsumeOk(_) => Ok(()),
            m => Err(unexpected(&m, "basic.consume-ok")),
        }
    }

    /// connection.close, then waits (bounded) for close-ok, discarding anything else.
    pub async fn close(mut self) {
        if self.send(0, close_method()).await.is_err() {
            return;
        }
        let _ = tokio::time::timeout(Duration::from_secs(2), async {
            loop {
                match self.next_method(0).await {
                    Ok(Method::ConnectionCloseOk(_)) | Err(_) => return,
                    Ok(_) => {}
                }
            }
        })
        .await;
    }
}

pub fn close_method() -> Method {
    ConnectionClose {
        reply_code: 200,
        reply_text: "OK".into(),
        class_id: 0,
        method_id: 0,
    }
    .into()
}

/// Reads `connection.close`/`channel.close` payloads out of a method frame that is not hot.
pub fn decode_method(payload: &[u8]) -> Result<Method, ClientError> {
    Ok(Method::decode(&bytes::Bytes::copy_from_slice(payload))?)
}

fn long_str(s: &str) -> FieldValue {
    FieldValue::LongStr(bytes::Bytes::copy_from_slice(s.as_bytes()))
}

fn unexpected(m: &Method, wanted: &str) -> ClientError {
    ClientError::Protocol(format!("expected {wanted}, got {}", m.name()))
}
