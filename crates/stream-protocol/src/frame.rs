//! The stream protocol's frames, as RabbitMQ's `rabbit_stream_core` reads and writes them: a
//! 4-byte size, then a key (the top bit set on a response), a version and the command's
//! fields, big-endian; strings with an `i16` length (-1: null), bytes with an `i32` one,
//! arrays with an `i32` count. [`Request`] is every command a client sends; [`Writer`] builds
//! what the server sends.

use bytes::{BufMut, Bytes, BytesMut};

pub const DECLARE_PUBLISHER: u16 = 0x01;
pub const PUBLISH: u16 = 0x02;
pub const PUBLISH_CONFIRM: u16 = 0x03;
pub const PUBLISH_ERROR: u16 = 0x04;
pub const QUERY_PUBLISHER_SEQUENCE: u16 = 0x05;
pub const DELETE_PUBLISHER: u16 = 0x06;
pub const SUBSCRIBE: u16 = 0x07;
pub const DELIVER: u16 = 0x08;
pub const CREDIT: u16 = 0x09;
pub const STORE_OFFSET: u16 = 0x0a;
pub const QUERY_OFFSET: u16 = 0x0b;
pub const UNSUBSCRIBE: u16 = 0x0c;
pub const CREATE: u16 = 0x0d;
pub const DELETE: u16 = 0x0e;
pub const METADATA: u16 = 0x0f;
pub const METADATA_UPDATE: u16 = 0x10;
pub const PEER_PROPERTIES: u16 = 0x11;
pub const SASL_HANDSHAKE: u16 = 0x12;
pub const SASL_AUTHENTICATE: u16 = 0x13;
pub const TUNE: u16 = 0x14;
pub const OPEN: u16 = 0x15;
pub const CLOSE: u16 = 0x16;
pub const HEARTBEAT: u16 = 0x17;
pub const ROUTE: u16 = 0x18;
pub const PARTITIONS: u16 = 0x19;
pub const CONSUMER_UPDATE: u16 = 0x1a;
pub const EXCHANGE_COMMAND_VERSIONS: u16 = 0x1b;
pub const STREAM_STATS: u16 = 0x1c;
pub const CREATE_SUPER_STREAM: u16 = 0x1d;
pub const DELETE_SUPER_STREAM: u16 = 0x1e;
/// The key's top bit marks a response.
pub const RESPONSE: u16 = 0x8000;

/// Response codes (RabbitMQ's `?RESPONSE_CODE_*`).
pub mod code {
    pub const OK: u16 = 0x01;
    pub const STREAM_DOES_NOT_EXIST: u16 = 0x02;
    pub const SUBSCRIPTION_ID_ALREADY_EXISTS: u16 = 0x03;
    pub const SUBSCRIPTION_ID_DOES_NOT_EXIST: u16 = 0x04;
    pub const STREAM_ALREADY_EXISTS: u16 = 0x05;
    pub const STREAM_NOT_AVAILABLE: u16 = 0x06;
    pub const SASL_MECHANISM_NOT_SUPPORTED: u16 = 0x07;
    pub const AUTHENTICATION_FAILURE: u16 = 0x08;
    pub const SASL_ERROR: u16 = 0x09;
    pub const SASL_CHALLENGE: u16 = 0x0a;
    pub const SASL_AUTHENTICATION_FAILURE_LOOPBACK: u16 = 0x0b;
    pub const VIRTUAL_HOST_ACCESS_FAILURE: u16 = 0x0c;
    pub const UNKNOWN_FRAME: u16 = 0x0d;
    pub const FRAME_TOO_LARGE: u16 = 0x0e;
    pub const INTERNAL_ERROR: u16 = 0x0f;
    pub const ACCESS_REFUSED: u16 = 0x10;
    pub const PRECONDITION_FAILED: u16 = 0x11;
    pub const PUBLISHER_DOES_NOT_EXIST: u16 = 0x12;
    pub const NO_OFFSET: u16 = 0x13;
}

/// Offset specifications of a subscribe.
pub mod offset_type {
    pub const FIRST: u16 = 1;
    pub const LAST: u16 = 2;
    pub const NEXT: u16 = 3;
    pub const OFFSET: u16 = 4;
    pub const TIMESTAMP: u16 = 5;
}

/// A frame the server cannot read: its key and version when they were read.
#[derive(Debug, Clone, PartialEq)]
pub struct Malformed(pub String);

/// Reads a frame's fields in order.
pub struct Reader<'a> {
    b: &'a [u8],
    /// The frame the fields are taken from (so bytes fields are slices of it, not copies).
    whole: &'a Bytes,
    at: usize,
}

type R<T> = Result<T, Malformed>;

impl<'a> Reader<'a> {
    pub fn new(whole: &'a Bytes) -> Reader<'a> {
        Reader {
            b: whole,
            whole,
            at: 0,
        }
    }

    fn take(&mut self, n: usize) -> R<&'a [u8]> {
        if self.b.len() - self.at < n {
            return Err(Malformed(format!(
                "frame ends after {} bytes, {} more expected",
                self.at, n
            )));
        }
        let s = &self.b[self.at..self.at + n];
        self.at += n;
        Ok(s)
    }

    pub fn u8(&mut self) -> R<u8> {
        Ok(self.take(1)?[0])
    }
    pub fn u16(&mut self) -> R<u16> {
        let s = self.take(2)?;
        Ok(u16::from_be_bytes([s[0], s[1]]))
    }
    pub fn u32(&mut self) -> R<u32> {
        let s = self.take(4)?;
        Ok(u32::from_be_bytes([s[0], s[1], s[2], s[3]]))
    }
    pub fn i32(&mut self) -> R<i32> {
        Ok(self.u32()? as i32)
    }
    pub fn u64(&mut self) -> R<u64> {
        let s = self.take(8)?;
        let mut a = [0u8; 8];
        a.copy_from_slice(s);
        Ok(u64::from_be_bytes(a))
    }
    pub fn i64(&mut self) -> R<i64> {
        Ok(self.u64()? as i64)
    }

    /// A string; null (length -1) reads as `None`.
    pub fn opt_string(&mut self) -> R<Option<String>> {
        let n = self.u16()? as i16;
        if n < 0 {
            return Ok(None);
        }
        let s = self.take(n as usize)?;
        String::from_utf8(s.to_vec())
            .map(Some)
            .map_err(|_| Malformed("a string is not UTF-8".into()))
    }

    pub fn string(&mut self) -> R<String> {
        Ok(self.opt_string()?.unwrap_or_default())
    }

    /// A bytes field, as a slice of the frame.
    pub fn bytes(&mut self) -> R<Bytes> {
        let n = self.i32()?;
        if n < 0 {
            return Ok(Bytes::new());
        }
        let start = self.at;
        self.take(n as usize)?;
        Ok(self.whole.slice(start..start + n as usize))
    }

    /// An array's element count, checked against what is left (each element takes a byte at
    /// least), so a forged count cannot make the caller reserve memory for nothing.
    pub fn count(&mut self) -> R<usize> {
        let n = self.i32()?;
        if n < 0 || n as usize > self.b.len() - self.at {
            return Err(Malformed(format!("array of {n} elements")));
        }
        Ok(n as usize)
    }

    /// `[string]`.
    pub fn strings(&mut self) -> R<Vec<String>> {
        let n = self.count()?;
        let mut out = Vec::with_capacity(n);
        for _ in 0..n {
            out.push(self.string()?);
        }
        Ok(out)
    }

    /// `[Key Value]` string pairs.
    pub fn properties(&mut self) -> R<Vec<(String, String)>> {
        let n = self.count()?;
        let mut out = Vec::with_capacity(n);
        for _ in 0..n {
            out.push((self.string()?, self.string()?));
        }
        Ok(out)
    }

    pub fn rest(&self) -> usize {
        self.b.len() - self.at
    }
}

/// A subscribe's starting point.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum OffsetSpec {
    First,
    Last,
    Next,
    Offset(u64),
    /// Milliseconds since the epoch.
    Timestamp(i64),
}

/// One message of a publish: its publishing id, filter value (version 2) and AMQP 1.0 bytes.
#[derive(Debug, Clone, PartialEq)]
pub struct Published {
    pub publishing_id: u64,
    pub filter: Option<String>,
    pub message: Bytes,
}

/// A command from the client.
#[derive(Debug, Clone, PartialEq)]
pub enum Request {
    PeerProperties {
        corr: u32,
        properties: Vec<(String, String)>,
    },
    SaslHandshake {
        corr: u32,
    },
    SaslAuthenticate {
        corr: u32,
        mechanism: String,
        data: Bytes,
    },
    /// The client's answer to the server's tune.
    Tune {
        frame_max: u32,
        heartbeat: u32,
    },
    Open {
        corr: u32,
        vhost: String,
    },
    Close {
        corr: u32,
        code: u16,
        reason: String,
    },
    /// The client answers the server's close.
    CloseOk {
        corr: u32,
    },
    Heartbeat,
    DeclarePublisher {
        corr: u32,
        id: u8,
        reference: Option<String>,
        stream: String,
    },
    Publish {
        publisher: u8,
        messages: Vec<Published>,
    },
    QueryPublisherSequence {
        corr: u32,
        reference: String,
        stream: String,
    },
    DeletePublisher {
        corr: u32,
        id: u8,
    },
    Subscribe {
        corr: u32,
        id: u8,
        stream: String,
        offset: OffsetSpec,
        credit: u16,
        properties: Vec<(String, String)>,
    },
    Credit {
        id: u8,
        credit: u16,
    },
    StoreOffset {
        reference: String,
        stream: String,
        offset: u64,
    },
    QueryOffset {
        corr: u32,
        reference: String,
        stream: String,
    },
    Unsubscribe {
        corr: u32,
        id: u8,
    },
    Create {
        corr: u32,
        stream: String,
        arguments: Vec<(String, String)>,
    },
    Delete {
        corr: u32,
        stream: String,
    },
    Metadata {
        corr: u32,
        streams: Vec<String>,
    },
    Route {
        corr: u32,
        routing_key: String,
        super_stream: String,
    },
    Partitions {
        corr: u32,
        super_stream: String,
    },
    /// The client's answer to a consumer update (single active consumer).
    ConsumerUpdateReply {
        corr: u32,
        code: u16,
        offset: Option<OffsetSpec>,
    },
    ExchangeCommandVersions {
        corr: u32,
        versions: Vec<(u16, u16, u16)>,
    },
    StreamStats {
        corr: u32,
        stream: String,
    },
    CreateSuperStream {
        corr: u32,
        name: String,
        partitions: Vec<String>,
        binding_keys: Vec<String>,
        arguments: Vec<(String, String)>,
    },
    DeleteSuperStream {
        corr: u32,
        name: String,
    },
    /// A command this server does not know (answered with `UNKNOWN_FRAME` where it has a
    /// correlation id).
    Unknown {
        key: u16,
        version: u16,
    },
}

fn offset_spec(r: &mut Reader<'_>) -> R<OffsetSpec> {
    Ok(match r.u16()? {
        offset_type::FIRST => OffsetSpec::First,
        offset_type::LAST => OffsetSpec::Last,
        offset_type::NEXT => OffsetSpec::Next,
        offset_type::OFFSET => OffsetSpec::Offset(r.u64()?),
        offset_type::TIMESTAMP => OffsetSpec::Timestamp(r.i64()?),
        t => return Err(Malformed(format!("unknown offset type {t}"))),
    })
}

impl Request {
    /// Reads one frame's content (after its size).
    pub fn parse(frame: &Bytes) -> R<Request> {
        let mut r = Reader::new(frame);
        let key = r.u16()?;
        let version = r.u16()?;
        let req = match key {
            PEER_PROPERTIES => Request::PeerProperties {
                corr: r.u32()?,
                properties: r.properties()?,
            },
            SASL_HANDSHAKE => Request::SaslHandshake { corr: r.u32()? },
            SASL_AUTHENTICATE => Request::SaslAuthenticate {
                corr: r.u32()?,
                mechanism: r.string()?,
                data: r.bytes()?,
            },
            // Some clients (the Go one) answer the server's tune as a response.
            k if k & !RESPONSE == TUNE => Request::Tune {
                frame_max: r.u32()?,
                heartbeat: r.u32()?,
            },
            OPEN => Request::Open {
                corr: r.u32()?,
                vhost: r.string()?,
            },
            CLOSE => Request::Close {
                corr: r.u32()?,
                code: r.u16()?,
                reason: r.string()?,
            },
            k if k == CLOSE | RESPONSE => Request::CloseOk { corr: r.u32()? },
            HEARTBEAT => Request::Heartbeat,
            DECLARE_PUBLISHER => Request::DeclarePublisher {
                corr: r.u32()?,
                id: r.u8()?,
                reference: r.opt_string()?.filter(|s| !s.is_empty()),
                stream: r.string()?,
            },
            PUBLISH => {
                let publisher = r.u8()?;
                let n = r.count()?;
                let mut messages = Vec::with_capacity(n.min(4096));
                for _ in 0..n {
                    let publishing_id = r.u64()?;
                    let filter = if version >= 2 { r.opt_string()? } else { None };
                    messages.push(Published {
                        publishing_id,
                        filter,
                        message: r.bytes()?,
                    });
                }
                Request::Publish {
                    publisher,
                    messages,
                }
            }
            QUERY_PUBLISHER_SEQUENCE => Request::QueryPublisherSequence {
                corr: r.u32()?,
                reference: r.string()?,
                stream: r.string()?,
            },
            DELETE_PUBLISHER => Request::DeletePublisher {
                corr: r.u32()?,
                id: r.u8()?,
            },
            SUBSCRIBE => {
                let corr = r.u32()?;
                let id = r.u8()?;
                let stream = r.string()?;
                let offset = offset_spec(&mut r)?;
                let credit = r.u16()?;
                // The properties are optional (older clients end the frame here).
                let properties = if r.rest() > 0 {
                    r.properties()?
                } else {
                    Vec::new()
                };
                Request::Subscribe {
                    corr,
                    id,
                    stream,
                    offset,
                    credit,
                    properties,
                }
            }
            CREDIT => Request::Credit {
                id: r.u8()?,
                credit: r.u16()?,
            },
            STORE_OFFSET => Request::StoreOffset {
                reference: r.string()?,
                stream: r.string()?,
                offset: r.u64()?,
            },
            QUERY_OFFSET => Request::QueryOffset {
                corr: r.u32()?,
                reference: r.string()?,
                stream: r.string()?,
            },
            UNSUBSCRIBE => Request::Unsubscribe {
                corr: r.u32()?,
                id: r.u8()?,
            },
            CREATE => Request::Create {
                corr: r.u32()?,
                stream: r.string()?,
                arguments: r.properties()?,
            },
            DELETE => Request::Delete {
                corr: r.u32()?,
                stream: r.string()?,
            },
            METADATA => Request::Metadata {
                corr: r.u32()?,
                streams: r.strings()?,
            },
            CREATE_SUPER_STREAM => Request::CreateSuperStream {
                corr: r.u32()?,
                name: r.string()?,
                partitions: r.strings()?,
                binding_keys: r.strings()?,
                arguments: r.properties()?,
            },
            DELETE_SUPER_STREAM => Request::DeleteSuperStream {
                corr: r.u32()?,
                name: r.string()?,
            },
            ROUTE => Request::Route {
                corr: r.u32()?,
                routing_key: r.string()?,
                super_stream: r.string()?,
            },
            PARTITIONS => Request::Partitions {
                corr: r.u32()?,
                super_stream: r.string()?,
            },
            k if k == CONSUMER_UPDATE | RESPONSE => {
                let corr = r.u32()?;
                let code = r.u16()?;
                let offset = if r.rest() > 0 {
                    Some(offset_spec(&mut r)?)
                } else {
                    None
                };
                Request::ConsumerUpdateReply { corr, code, offset }
            }
            EXCHANGE_COMMAND_VERSIONS => {
                let corr = r.u32()?;
                let n = r.count()?;
                let mut versions = Vec::with_capacity(n);
                for _ in 0..n {
                    versions.push((r.u16()?, r.u16()?, r.u16()?));
                }
                Request::ExchangeCommandVersions { corr, versions }
            }
            STREAM_STATS => Request::StreamStats {
                corr: r.u32()?,
                stream: r.string()?,
            },
            key => Request::Unknown { key, version },
        };
        Ok(req)
    }

    /// The correlation id, for the commands that expect a response.
    pub fn correlation(&self) -> Option<u32> {
        use Request::*;
        match self {
            PeerProperties { corr, .. }
            | SaslHandshake { corr }
            | SaslAuthenticate { corr, .. }
            | Open { corr, .. }
            | Close { corr, .. }
            | DeclarePublisher { corr, .. }
            | QueryPublisherSequence { corr, .. }
            | DeletePublisher { corr, .. }
            | Subscribe { corr, .. }
            | QueryOffset { corr, .. }
            | Unsubscribe { corr, .. }
            | Create { corr, .. }
            | Delete { corr, .. }
            | Metadata { corr, .. }
            | Route { corr, .. }
            | Partitions { corr, .. }
            | ExchangeCommandVersions { corr, .. }
            | StreamStats { corr, .. }
            | CreateSuperStream { corr, .. }
            | DeleteSuperStream { corr, .. } => Some(*corr),
            _ => None,
        }
    }
}

/// Builds frames into one buffer (several per socket write).
#[derive(Default)]
pub struct Writer {
    pub buf: BytesMut,
    /// Where the frame being written starts (its size is patched at `end`).
    start: usize,
}

impl Writer {
    /// Starts a frame with `key` and `version`; finish it with [`Writer::end`].
    pub fn begin(&mut self, key: u16, version: u16) -> &mut Self {
        self.start = self.buf.len();
        self.buf.put_u32(0);
        self.buf.put_u16(key);
        self.buf.put_u16(version);
        self
    }

    pub fn end(&mut self) {
        let size = (self.buf.len() - self.start - 4) as u32;
        self.buf[self.start..self.start + 4].copy_from_slice(&size.to_be_bytes());
    }

    /// A publish confirm for `publisher`'s `id`: added to the last frame when that is a confirm
    /// of the same publisher still waiting to be written (one frame then carries many ids, as
    /// RabbitMQ's do: a client handles a frame, not an id, at a time), else a frame of its own.
    pub fn confirm(&mut self, publisher: u8, id: u64) {
        // [size u32][key u16][version u16][publisher u8][count u32][ids u64...]
        const HEAD: usize = 13;
        const MAX_IDS: u32 = 8192;
        let s = self.start;
        let last_is_ours = s + HEAD <= self.buf.len()
            && self.buf[s + 4..s + 6] == PUBLISH_CONFIRM.to_be_bytes()
            && self.buf[s + 8] == publisher
            && {
                let size = u32::from_be_bytes([
                    self.buf[s],
                    self.buf[s + 1],
                    self.buf[s + 2],
                    self.buf[s + 3],
                ]) as usize;
                s + 4 + size == self.buf.len()
            };
        let count = if last_is_ours {
            u32::from_be_bytes([
                self.buf[s + 9],
                self.buf[s + 10],
                self.buf[s + 11],
                self.buf[s + 12],
            ])
        } else {
            MAX_IDS
        };
        if count >= MAX_IDS {
            self.begin(PUBLISH_CONFIRM, 1)
                .u8(publisher)
                .u32(1)
                .u64(id)
                .end();
            return;
        }
        self.buf.put_u64(id);
        self.buf[s + 9..s + HEAD].copy_from_slice(&(count + 1).to_be_bytes());
        self.end();
    }

    pub fn u8(&mut self, v: u8) -> &mut Self {
        self.buf.put_u8(v);
        self
    }
    pub fn u16(&mut self, v: u16) -> &mut Self {
        self.buf.put_u16(v);
        self
    }
    pub fn u32(&mut self, v: u32) -> &mut Self {
        self.buf.put_u32(v);
        self
    }
    pub fn u64(&mut self, v: u64) -> &mut Self {
        self.buf.put_u64(v);
        self
    }
    pub fn string(&mut self, s: &str) -> &mut Self {
        let s = &s.as_bytes()[..s.len().min(i16::MAX as usize)];
        self.buf.put_u16(s.len() as u16);
        self.buf.put_slice(s);
        self
    }
    pub fn bytes(&mut self, b: &[u8]) -> &mut Self {
        self.buf.put_u32(b.len() as u32);
        self.buf.put_slice(b);
        self
    }
    pub fn properties<'a>(
        &mut self,
        p: impl ExactSizeIterator<Item = (&'a str, &'a str)>,
    ) -> &mut Self {
        self.buf.put_u32(p.len() as u32);
        for (k, v) in p {
            self.string(k).string(v);
        }
        self
    }

    /// A response with only a code.
    pub fn response(&mut self, key: u16, corr: u32, code: u16) {
        self.begin(key | RESPONSE, 1).u32(corr).u16(code).end();
    }

    pub fn take(&mut self) -> Bytes {
        self.start = 0;
        self.buf.split().freeze()
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn frame(f: impl FnOnce(&mut Writer)) -> Bytes {
        let mut w = Writer::default();
        f(&mut w);
        let all = w.take();
        all.slice(4..)
    }

    #[test]
    fn reads_what_clients_send() {
        let f = frame(|w| {
            w.begin(SUBSCRIBE, 1)
                .u32(7)
                .u8(3)
                .string("s1")
                .u16(offset_type::OFFSET)
                .u64(42)
                .u16(10)
                .properties([("name", "c1")].into_iter())
                .end()
        });
        assert_eq!(
            Request::parse(&f).unwrap(),
            Request::Subscribe {
                corr: 7,
                id: 3,
                stream: "s1".into(),
                offset: OffsetSpec::Offset(42),
                credit: 10,
                properties: vec![("name".into(), "c1".into())],
            }
        );
        let f = frame(|w| {
            w.begin(PUBLISH, 1).u8(1).u32(2);
            w.u64(10).bytes(b"a").u64(11).bytes(b"bc").end()
        });
        let Request::Publish {
            publisher,
            messages,
        } = Request::parse(&f).unwrap()
        else {
            panic!("not a publish")
        };
        assert_eq!(publisher, 1);
        assert_eq!(messages[1].publishing_id, 11);
        assert_eq!(&messages[1].message[..], b"bc");
        // The Go client answers the server's tune as a response.
        let f = frame(|w| w.begin(TUNE | RESPONSE, 1).u32(1024).u32(30).end());
        assert_eq!(
            Request::parse(&f).unwrap(),
            Request::Tune {
                frame_max: 1024,
                heartbeat: 30
            }
        );
        // Version 2 carries a filter value per message.
        let f = frame(|w| {
            w.begin(PUBLISH, 2).u8(1).u32(1);
            w.u64(10).string("eu").bytes(b"a").end()
        });
        let Request::Publish { messages, .. } = Request::parse(&f).unwrap() else {
            panic!("not a publish")
        };
        assert_eq!(messages[0].filter.as_deref(), Some("eu"));
    }

    #[test]
    fn confirms_of_one_publisher_share_a_frame_until_it_is_taken() {
        let mut w = Writer::default();
        w.confirm(1, 10);
        w.confirm(1, 11);
        w.confirm(2, 12);
        w.confirm(2, 13);
        let b = w.take();
        // [size][key][version][publisher][count][ids]: two frames of two ids each.
        let frame = |b: &Bytes, at: usize| {
            let size = u32::from_be_bytes(b[at..at + 4].try_into().unwrap()) as usize;
            let publisher = b[at + 8];
            let count = u32::from_be_bytes(b[at + 9..at + 13].try_into().unwrap());
            let ids: Vec<u64> = (0..count as usize)
                .map(|i| {
                    u64::from_be_bytes(b[at + 13 + 8 * i..at + 21 + 8 * i].try_into().unwrap())
                })
                .collect();
            (at + 4 + size, publisher, ids)
        };
        let (next, p, ids) = frame(&b, 0);
        assert_eq!((p, ids), (1, vec![10, 11]));
        let (end, p, ids) = frame(&b, next);
        assert_eq!((p, ids), (2, vec![12, 13]));
        assert_eq!(end, b.len());
        // Once taken (being written), a confirm starts a frame of its own; so does one after
        // another frame.
        w.confirm(2, 14);
        w.begin(HEARTBEAT, 1).end();
        w.confirm(2, 15);
        let b = w.take();
        let (next, _, ids) = frame(&b, 0);
        assert_eq!(ids, vec![14]);
        let (_, _, ids) = frame(&b, next + 8);
        assert_eq!(ids, vec![15]);
    }

    #[test]
    fn a_short_or_forged_frame_is_malformed_not_a_panic() {
        let f = frame(|w| w.begin(OPEN, 1).u32(1).end());
        assert!(Request::parse(&f).is_err());
        let f = frame(|w| w.begin(METADATA, 1).u32(1).u32(1_000_000).end());
        assert!(Request::parse(&f).is_err());
        let f = frame(|w| w.begin(0x7777, 1).end());
        assert_eq!(
            Request::parse(&f).unwrap(),
            Request::Unknown {
                key: 0x7777,
                version: 1
            }
        );
    }
}
