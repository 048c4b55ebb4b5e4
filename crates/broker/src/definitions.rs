//! The durable definitions of a vhost (exchanges, queues, bindings), kept as one file of
//! checksummed records whose payloads are the AMQP methods that recreate them (lavinmq keeps its
//! definitions as AMQP frames too): the codec we already trust, exact field tables, no second
//! schema. The file is rewritten atomically on each change to a durable definition.

use bytes::{Bytes, BytesMut};
use warren_protocol::method::{ExchangeBind, ExchangeDeclare, QueueBind, QueueDeclare};
use warren_protocol::Method;
use warren_store::record::{self, Scan};

const KIND_EXCHANGE: u8 = 10;
const KIND_QUEUE: u8 = 11;
const KIND_QUEUE_BIND: u8 = 12;
const KIND_EXCHANGE_BIND: u8 = 13;

#[derive(Debug, Clone, PartialEq)]
pub enum Definition {
    Exchange(ExchangeDeclare),
    /// A durable queue and the id of its log directory.
    Queue(u64, QueueDeclare),
    QueueBind(QueueBind),
    ExchangeBind(ExchangeBind),
}

pub fn encode(defs: &[Definition]) -> Vec<u8> {
    let mut out = BytesMut::new();
    let mut payload = BytesMut::new();
    for d in defs {
        payload.clear();
        let (kind, seq, m): (u8, u64, Method) = match d {
            Definition::Exchange(x) => (KIND_EXCHANGE, 0, x.clone().into()),
            Definition::Queue(id, q) => (KIND_QUEUE, *id, q.clone().into()),
            Definition::QueueBind(b) => (KIND_QUEUE_BIND, 0, b.clone().into()),
            Definition::ExchangeBind(b) => (KIND_EXCHANGE_BIND, 0, b.clone().into()),
        };
        m.encode_payload(&mut payload);
        record::encode(&mut out, kind, seq, &payload);
    }
    out.to_vec()
}

/// Decodes what it can; a damaged record is logged and skipped.
pub fn decode(bytes: Vec<u8>) -> Vec<Definition> {
    let file = Bytes::from(bytes);
    let mut out = Vec::new();
    let mut at = 0;
    while at < file.len() {
        let (r, next) = match record::scan(&file, at) {
            Scan::Record(r, next) => (r, next),
            _ => {
                tracing::warn!(offset = at, "damaged record in the definitions file");
                match record::resync(&file, at) {
                    Some(n) => {
                        at = n;
                        continue;
                    }
                    None => break,
                }
            }
        };
        at = next;
        let d = match (r.kind, Method::decode(&r.data)) {
            (KIND_EXCHANGE, Ok(Method::ExchangeDeclare(x))) => Definition::Exchange(x),
            (KIND_QUEUE, Ok(Method::QueueDeclare(q))) => Definition::Queue(r.seq, q),
            (KIND_QUEUE_BIND, Ok(Method::QueueBind(b))) => Definition::QueueBind(b),
            (KIND_EXCHANGE_BIND, Ok(Method::ExchangeBind(b))) => Definition::ExchangeBind(b),
            (kind, _) => {
                tracing::warn!(kind, "unknown record in the definitions file");
                continue;
            }
        };
        out.push(d);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use warren_protocol::{FieldTable, FieldValue};

    #[test]
    fn round_trip() {
        let mut args = FieldTable::new();
        args.insert("x-max-length", FieldValue::I32(5));
        let defs = vec![
            Definition::Exchange(ExchangeDeclare {
                exchange: "x".into(),
                kind: "topic".into(),
                durable: true,
                ..Default::default()
            }),
            Definition::Queue(
                42,
                QueueDeclare {
                    queue: "q".into(),
                    durable: true,
                    arguments: args,
                    ..Default::default()
                },
            ),
            Definition::QueueBind(QueueBind {
                queue: "q".into(),
                exchange: "x".into(),
                routing_key: "a.#".into(),
                ..Default::default()
            }),
        ];
        assert_eq!(decode(encode(&defs)), defs);
    }
}
