//! The durable definitions of a vhost (exchanges, queues, bindings), kept as one file of
//! checksummed records whose payloads are the AMQP methods that recreate them (lavinmq keeps its
//! definitions as AMQP frames too): the codec we already trust, exact field tables, no second
//! schema.
//!
//! Two files per vhost: `definitions`, a snapshot rewritten atomically, and `definitions.log`,
//! a journal that each change to a durable definition appends one record to (and fsyncs), so a
//! change costs one small write, not a rewrite of every definition. Both start with a
//! generation record; the journal is replayed over the snapshot only if their generations
//! match. Compaction writes the snapshot with the next generation first, then resets the
//! journal: a crash between the two leaves a journal that is ignored, its changes already in
//! the snapshot.

use bytes::{Bytes, BytesMut};
use warren_protocol::method::{
    ExchangeBind, ExchangeDeclare, ExchangeDelete, ExchangeUnbind, QueueBind, QueueDeclare,
    QueueDelete, QueueUnbind,
};
use warren_protocol::Method;
use warren_store::record::{self, Scan};

const KIND_EXCHANGE: u8 = 10;
const KIND_QUEUE: u8 = 11;
const KIND_QUEUE_BIND: u8 = 12;
const KIND_EXCHANGE_BIND: u8 = 13;
const KIND_EXCHANGE_DELETE: u8 = 14;
const KIND_QUEUE_DELETE: u8 = 15;
const KIND_QUEUE_UNBIND: u8 = 16;
const KIND_EXCHANGE_UNBIND: u8 = 17;
const KIND_GENERATION: u8 = 18;

#[derive(Debug, Clone, PartialEq)]
pub enum Definition {
    Exchange(ExchangeDeclare),
    /// A durable queue and the id of its log directory.
    Queue(u64, QueueDeclare),
    QueueBind(QueueBind),
    ExchangeBind(ExchangeBind),
    // Journal only: changes replayed through the same calls that made them.
    ExchangeDelete(ExchangeDelete),
    QueueDelete(QueueDelete),
    QueueUnbind(QueueUnbind),
    ExchangeUnbind(ExchangeUnbind),
    /// The first record of both files.
    Generation(u64),
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
            Definition::ExchangeDelete(x) => (KIND_EXCHANGE_DELETE, 0, x.clone().into()),
            Definition::QueueDelete(q) => (KIND_QUEUE_DELETE, 0, q.clone().into()),
            Definition::QueueUnbind(b) => (KIND_QUEUE_UNBIND, 0, b.clone().into()),
            Definition::ExchangeUnbind(b) => (KIND_EXCHANGE_UNBIND, 0, b.clone().into()),
            Definition::Generation(g) => {
                record::encode(&mut out, KIND_GENERATION, *g, &[]);
                continue;
            }
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
        if r.kind == KIND_GENERATION {
            out.push(Definition::Generation(r.seq));
            continue;
        }
        let d = match (r.kind, Method::decode(&r.data)) {
            (KIND_EXCHANGE, Ok(Method::ExchangeDeclare(x))) => Definition::Exchange(x),
            (KIND_QUEUE, Ok(Method::QueueDeclare(q))) => Definition::Queue(r.seq, q),
            (KIND_QUEUE_BIND, Ok(Method::QueueBind(b))) => Definition::QueueBind(b),
            (KIND_EXCHANGE_BIND, Ok(Method::ExchangeBind(b))) => Definition::ExchangeBind(b),
            (KIND_EXCHANGE_DELETE, Ok(Method::ExchangeDelete(x))) => Definition::ExchangeDelete(x),
            (KIND_QUEUE_DELETE, Ok(Method::QueueDelete(q))) => Definition::QueueDelete(q),
            (KIND_QUEUE_UNBIND, Ok(Method::QueueUnbind(b))) => Definition::QueueUnbind(b),
            (KIND_EXCHANGE_UNBIND, Ok(Method::ExchangeUnbind(b))) => Definition::ExchangeUnbind(b),
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
        let mut defs = defs;
        defs.insert(0, Definition::Generation(7));
        defs.extend([
            Definition::QueueUnbind(QueueUnbind {
                queue: "q".into(),
                exchange: "x".into(),
                routing_key: "a.#".into(),
                ..Default::default()
            }),
            Definition::ExchangeUnbind(ExchangeUnbind {
                destination: "y".into(),
                source: "x".into(),
                ..Default::default()
            }),
            Definition::QueueDelete(QueueDelete {
                queue: "q".into(),
                ..Default::default()
            }),
            Definition::ExchangeDelete(ExchangeDelete {
                exchange: "x".into(),
                ..Default::default()
            }),
        ]);
        assert_eq!(decode(encode(&defs)), defs);
    }
}
