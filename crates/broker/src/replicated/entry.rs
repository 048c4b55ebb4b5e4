//! A replicated queue's log entry: the leader's timestamp and a batch of operations (publishes,
//! carrying their stored messages, and the machine's other commands), and the reply an apply
//! hands back to the proposer.
//!
//! `[ENTRY_V1][timestamp u64][n u32]` then `n` operations, each `[kind u8][len u32][bytes]`:
//! kind 1 is a publish (a stored message, `persist::encode_message_into`), kind 2 a command
//! (`bincode` of `warren_queue::replicated::Cmd`), kind 3 an import of a message of the queue's
//! earlier form (`legacy.rs`): `[earlier id u64][redelivered u8][count u32]` then the stored
//! message, absent when nothing is imported (a kept dead letter sent instead). The first byte is the entry format's
//! version: an entry of a format this release does not know is refused with a clear error.
//!
//! A message's place in the log is `index << SLOT_BITS | slot`: the entry's index and the
//! publish's position in it ([`msg_index`]), so the machine's `MsgRef::index` names one body.

use bytes::{Buf, BufMut, Bytes, BytesMut};
use warren_queue::replicated::{Cmd, Out};

const ENTRY_V1: u8 = 0xC1;
const OP_PUBLISH: u8 = 1;
const OP_CMD: u8 = 2;
const OP_IMPORT: u8 = 3;

/// Bits of a message's log place that number it in its entry: at most 4096 publishes an entry.
pub const SLOT_BITS: u32 = 12;
pub const MAX_SLOTS: usize = 1 << SLOT_BITS;

/// The log place of the `slot`th publish of entry `index`.
pub fn msg_index(index: u64, slot: usize) -> u64 {
    (index << SLOT_BITS) | slot as u64
}

/// The entry and slot of a log place.
pub fn split_index(at: u64) -> (u64, usize) {
    (at >> SLOT_BITS, (at & ((1 << SLOT_BITS) - 1)) as usize)
}

/// One operation of an entry.
#[derive(Debug, Clone, PartialEq)]
pub enum Op {
    /// A stored message (`persist::encode_message_into`).
    Publish(Bytes),
    Cmd(Cmd),
    /// A message of the queue's earlier form carried over (`legacy.rs`): earlier id `old`,
    /// its delivery count and redelivered flag, and its stored form (none: `old` is forgotten
    /// and nothing imported). An import with a stored message takes a slot, as a publish does.
    Import {
        old: u64,
        redelivered: bool,
        count: u32,
        stored: Option<Bytes>,
    },
}

pub struct Entry {
    /// The leader's Unix time in ms when it proposed the entry: every member applies the
    /// entry's commands at this time.
    pub ts: u64,
    pub ops: Vec<Op>,
}

/// Builds an entry as its operations are added.
pub struct Builder {
    b: BytesMut,
    n: u32,
}

impl Builder {
    pub fn new(ts: u64) -> Builder {
        let mut b = BytesMut::with_capacity(4096);
        b.put_u8(ENTRY_V1);
        b.put_u64(ts);
        b.put_u32(0);
        Builder { b, n: 0 }
    }

    pub fn publish(&mut self, m: &crate::message::Message) {
        self.b.put_u8(OP_PUBLISH);
        let at = self.b.len();
        self.b.put_u32(0);
        crate::persist::encode_message_into(&mut self.b, m, None);
        let len = (self.b.len() - at - 4) as u32;
        self.b[at..at + 4].copy_from_slice(&len.to_be_bytes());
        self.n += 1;
    }

    pub fn cmd(&mut self, c: &Cmd) {
        // A command of the machine's own types always encodes.
        let Ok(data) = bincode::serialize(c) else {
            return;
        };
        self.b.put_u8(OP_CMD);
        self.b.put_u32(data.len() as u32);
        self.b.put_slice(&data);
        self.n += 1;
    }

    pub fn import(&mut self, op: &Op) {
        let Op::Import {
            old,
            redelivered,
            count,
            stored,
        } = op
        else {
            return;
        };
        let data = stored.as_deref().unwrap_or_default();
        self.b.put_u8(OP_IMPORT);
        self.b.put_u32((13 + data.len()) as u32);
        self.b.put_u64(*old);
        self.b.put_u8(u8::from(*redelivered));
        self.b.put_u32(*count);
        self.b.put_slice(data);
        self.n += 1;
    }

    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.n as usize
    }

    pub fn finish(mut self) -> Vec<u8> {
        self.b[9..13].copy_from_slice(&self.n.to_be_bytes());
        self.b.to_vec()
    }
}

pub fn decode(mut b: Bytes) -> Result<Entry, String> {
    if b.remaining() < 13 {
        return Err("a short entry".into());
    }
    let v = b.get_u8();
    if v != ENTRY_V1 {
        return Err(format!(
            "an entry of unknown format {v:#04x} (a newer release's?)"
        ));
    }
    let ts = b.get_u64();
    let n = b.get_u32() as usize;
    let mut ops = Vec::with_capacity(n.min(MAX_SLOTS));
    for i in 0..n {
        if b.remaining() < 5 {
            return Err(format!("operation {i} of {n} is cut short"));
        }
        let kind = b.get_u8();
        let len = b.get_u32() as usize;
        if b.remaining() < len {
            return Err(format!("operation {i} of {n} is cut short"));
        }
        let data = b.split_to(len);
        ops.push(match kind {
            OP_PUBLISH => Op::Publish(data),
            OP_CMD => Op::Cmd(
                bincode::deserialize(&data)
                    .map_err(|e| format!("operation {i}: undecodable command: {e}"))?,
            ),
            OP_IMPORT => {
                let mut d = data;
                if d.remaining() < 13 {
                    return Err(format!("operation {i}: a short import"));
                }
                let (old, redelivered, count) = (d.get_u64(), d.get_u8() == 1, d.get_u32());
                Op::Import {
                    old,
                    redelivered,
                    count,
                    stored: (!d.is_empty()).then_some(d),
                }
            }
            k => return Err(format!("operation {i}: unknown kind {k}")),
        });
    }
    Ok(Entry { ts, ops })
}

/// What an apply answers its proposer: per operation, the outputs that answer it (a publish's
/// `Accepted`/`Rejected`, an attach's, a get's, a purge's), and the stored bodies of the
/// messages gets took, by seq (the proposer may be a node without the log). Deliveries and
/// dead letters are not in it: the leader acts on those itself.
pub struct Reply {
    pub outs: Vec<Vec<Out>>,
    pub got: Vec<(u64, Vec<u8>)>,
}

pub fn encode_reply(outs: &[Vec<Out>], got: &[(u64, Bytes)]) -> Vec<u8> {
    let got: Vec<(u64, &[u8])> = got.iter().map(|(s, b)| (*s, &b[..])).collect();
    bincode::serialize(&(outs, got)).unwrap_or_default()
}

pub fn decode_reply(b: &[u8]) -> Option<Reply> {
    let (outs, got) = bincode::deserialize(b).ok()?;
    Some(Reply { outs, got })
}

/// Whether an output answers the operation's proposer (else the member acts on it).
pub fn answers(o: &Out) -> bool {
    matches!(
        o,
        Out::Accepted { .. }
            | Out::Rejected
            | Out::Attached(_)
            | Out::Got(_)
            | Out::Purged(_)
            | Out::Detached { .. }
    )
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use warren_queue::replicated::ReturnKind;

    fn message(body: &'static [u8]) -> crate::message::Message {
        crate::message::Message {
            exchange: "x".into(),
            routing_key: "k".into(),
            properties: warren_protocol::properties::BasicProperties::default().to_bytes(),
            body: Bytes::from_static(body),
            persistent: true,
            priority: None,
            expiration_ms: None,
            forwarded: crate::message::Forwarded::NONE,
        }
    }

    #[test]
    fn an_entry_round_trips() {
        let mut b = Builder::new(42);
        b.publish(&message(b"hello"));
        b.cmd(&Cmd::Return {
            consumer: 7,
            seqs: vec![1, 2],
            kind: ReturnKind::Nacked,
        });
        b.publish(&message(b""));
        assert_eq!(b.len(), 3);
        let e = decode(Bytes::from(b.finish())).unwrap();
        assert_eq!(e.ts, 42);
        assert_eq!(e.ops.len(), 3);
        let Op::Publish(data) = &e.ops[0] else {
            panic!("not a publish: {:?}", e.ops[0])
        };
        let (m, _) = crate::persist::decode_message(data).unwrap();
        assert_eq!(&m.body[..], b"hello");
        assert_eq!(
            e.ops[1],
            Op::Cmd(Cmd::Return {
                consumer: 7,
                seqs: vec![1, 2],
                kind: ReturnKind::Nacked
            })
        );
    }

    #[test]
    fn a_cut_or_unknown_entry_is_refused_with_a_reason() {
        let mut b = Builder::new(1);
        b.publish(&message(b"hello"));
        let whole = b.finish();
        let cut = decode(Bytes::copy_from_slice(&whole[..whole.len() - 2]));
        assert!(cut.err().unwrap().contains("cut short"));
        let mut newer = whole.clone();
        newer[0] = 0xC2;
        assert!(decode(Bytes::from(newer))
            .err()
            .unwrap()
            .contains("unknown format"));
    }

    #[test]
    fn a_log_place_names_an_entry_and_a_slot() {
        let at = msg_index(123_456, MAX_SLOTS - 1);
        assert_eq!(split_index(at), (123_456, MAX_SLOTS - 1));
        assert!(msg_index(2, 0) > msg_index(1, MAX_SLOTS - 1));
    }
}
