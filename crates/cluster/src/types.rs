//! openraft's type configuration and the wire messages between nodes.

use std::fmt;
use std::io::Cursor;

use bytes::Bytes;
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, SnapshotResponse, VoteRequest, VoteResponse,
};
use openraft::{SnapshotMeta, Vote};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::api::{Node, NodeId};

openraft::declare_raft_types!(
    /// The Raft types of the metadata group.
    pub(crate) TypeConfig:
        D = Blob,
        R = Blob,
        NodeId = NodeId,
        Node = Node,
        Entry = openraft::Entry<TypeConfig>,
        SnapshotData = Cursor<Vec<u8>>,
        AsyncRuntime = crate::runtime::WarrenRuntime,
);

/// Opaque bytes, serialized as a hex string: serde_json would write a `Vec<u8>` as an array of
/// numbers, about twice the size. Shared (`Bytes`): openraft clones each entry's payload on its
/// way to the log, the state machine and every follower, and a replicated queue's entries carry
/// message bodies (memcpy was a quarter of a follower's CPU with a `Vec` here, measured with perf).
#[derive(Clone, Default, PartialEq, Eq)]
pub(crate) struct Blob(pub Bytes);

impl fmt::Debug for Blob {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Blob({} bytes)", self.0.len())
    }
}

impl fmt::Display for Blob {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self, f)
    }
}

const HEX: &[u8; 16] = b"0123456789abcdef";

impl Serialize for Blob {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        // The wire and the log are binary (`wire`): the bytes as they are.
        if !s.is_human_readable() {
            return s.serialize_bytes(&self.0);
        }
        let mut out = String::with_capacity(self.0.len() * 2);
        for b in &self.0 {
            out.push(HEX[(b >> 4) as usize] as char);
            out.push(HEX[(b & 0xf) as usize] as char);
        }
        s.serialize_str(&out)
    }
}

struct BytesVisitor;

impl<'de> serde::de::Visitor<'de> for BytesVisitor {
    type Value = Blob;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("bytes")
    }
    fn visit_bytes<E: serde::de::Error>(self, v: &[u8]) -> Result<Blob, E> {
        Ok(Blob(Bytes::copy_from_slice(v)))
    }
    fn visit_borrowed_bytes<E: serde::de::Error>(self, v: &'de [u8]) -> Result<Blob, E> {
        Ok(Blob(wire::share(v)))
    }
    fn visit_byte_buf<E: serde::de::Error>(self, v: Vec<u8>) -> Result<Blob, E> {
        Ok(Blob(Bytes::from(v)))
    }
}

impl<'de> Deserialize<'de> for Blob {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        if !d.is_human_readable() {
            // Borrowed from the input where it can be: `wire::decode_shared` then hands out
            // slices of its buffer rather than copies.
            return d.deserialize_bytes(BytesVisitor);
        }
        let s: std::borrow::Cow<'de, str> = Deserialize::deserialize(d)?;
        let digit = |c: u8| match c {
            b'0'..=b'9' => Ok(c - b'0'),
            b'a'..=b'f' => Ok(c - b'a' + 10),
            _ => Err(serde::de::Error::custom("bad hex digit")),
        };
        let s = s.as_bytes();
        if s.len() & 1 == 1 {
            return Err(serde::de::Error::custom("odd hex length"));
        }
        s.chunks(2)
            .map(|p| Ok(digit(p[0])? << 4 | digit(p[1])?))
            .collect::<Result<Vec<u8>, D::Error>>()
            .map(|v| Blob(Bytes::from(v)))
    }
}

/// The encoding of requests, replies and log entries: bincode. serde_json spent a quarter of
/// a replicated queue's leader CPU writing message bodies as hex strings (measured with perf).
pub(crate) mod wire {
    pub(crate) fn encode<T: serde::Serialize>(v: &T) -> Vec<u8> {
        bincode::serialize(v).unwrap_or_default()
    }

    use std::cell::RefCell;

    use bytes::Bytes;

    /// As [`encode`], into the end of `buf`.
    pub(crate) fn encode_into<T: serde::Serialize>(buf: &mut bytes::BytesMut, v: &T) {
        use bytes::BufMut;
        let _ = bincode::serialize_into(buf.writer(), v);
    }

    pub(crate) fn decode<T: serde::de::DeserializeOwned>(b: &[u8]) -> Result<T, String> {
        bincode::deserialize(b).map_err(|e| e.to_string())
    }

    thread_local! {
        /// The buffer `decode_shared` is decoding, while it does.
        static SOURCE: RefCell<Option<Bytes>> = const { RefCell::new(None) };
    }

    /// As [`decode`], with each [`Blob`](super::Blob) in `b` a slice of `b` rather than a copy:
    /// a request carrying entries hands their bodies on without copying them again.
    pub(crate) fn decode_shared<T: serde::de::DeserializeOwned>(b: &Bytes) -> Result<T, String> {
        SOURCE.with(|s| *s.borrow_mut() = Some(b.clone()));
        let out = decode(b);
        SOURCE.with(|s| *s.borrow_mut() = None);
        out
    }

    /// `v`, borrowed from what is being decoded: a slice of `decode_shared`'s buffer when it is
    /// one, else a copy.
    pub(super) fn share(v: &[u8]) -> Bytes {
        SOURCE.with(|s| match &*s.borrow() {
            Some(src) if contains(src, v) => src.slice_ref(v),
            _ => Bytes::copy_from_slice(v),
        })
    }

    fn contains(src: &[u8], v: &[u8]) -> bool {
        let (s, p) = (src.as_ptr() as usize, v.as_ptr() as usize);
        p >= s && p + v.len() <= s + src.len()
    }
}

/// Whether `request` (a [`Transport::call`](crate::Transport::call)'s) is one of Raft's own
/// messages between members (a vote, entries, a snapshot), which Raft takes twice harmlessly,
/// rather than a proposal or a membership change, which it would carry out twice. (bincode
/// writes the variant's index first, as a little-endian u32.)
pub fn is_raft_message(request: &[u8]) -> bool {
    matches!(request.get(..4), Some([0..=2, 0, 0, 0]))
}

/// A request to another node's `Meta::handle_rpc`.
#[derive(Serialize, Deserialize)]
pub(crate) enum Rpc {
    Vote(VoteRequest<NodeId>),
    Append(AppendEntriesRequest<TypeConfig>),
    Snapshot {
        vote: Vote<NodeId>,
        meta: SnapshotMeta<NodeId, Node>,
        data: Blob,
    },
    /// A command to commit; served by the leader only.
    Propose(Blob),
    /// Add a node as a learner; served by the leader only.
    Join(Node),
    /// Make a learner a voter; served by the leader only.
    Promote(NodeId),
    /// Remove a node from the membership; served by the leader only.
    Remove(NodeId),
}

#[derive(Serialize, Deserialize)]
pub(crate) enum Reply {
    Vote(VoteResponse<NodeId>),
    Append(AppendEntriesResponse<NodeId>),
    Snapshot(SnapshotResponse<NodeId>),
    /// The command was committed and applied on the leader: its reply and log index.
    Proposed {
        reply: Blob,
        index: u64,
    },
    /// The membership change is committed at this log index.
    Changed {
        index: u64,
    },
    /// The serving node is not the leader; the leader it knows of, if any. The request was not
    /// accepted, so the sender may retry it elsewhere.
    NotLeader(Option<(NodeId, Node)>),
    /// A membership change is in progress: retry shortly.
    Busy(String),
    /// The leader accepted the request but could not commit it in time. It may still commit.
    Unavailable(String),
    /// The request was refused for good (e.g. removing the last voter).
    Rejected(String),
    /// The serving node failed (Raft stopped, undecodable request).
    Error(String),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blob_hex_round_trip() {
        let b = Blob(vec![0, 1, 0xab, 0xff, 0x10].into());
        let s = serde_json::to_string(&b).expect("encode");
        assert_eq!(s, "\"0001abff10\"");
        let back: Blob = serde_json::from_str(&s).expect("decode");
        assert_eq!(back, b);
        assert!(serde_json::from_str::<Blob>("\"abc\"").is_err());
        assert!(serde_json::from_str::<Blob>("\"zz\"").is_err());
        let bin = wire::encode(&b);
        assert_eq!(bin.len(), 8 + 5, "length and the bytes, nothing more");
        assert_eq!(wire::decode::<Blob>(&bin).expect("decode"), b);
    }
}

#[cfg(test)]
mod raft_message_tests {
    use super::*;

    #[test]
    fn encode_into_appends_what_encode_gives() {
        let rpc = Rpc::Propose(Blob(vec![3u8; 100].into()));
        let mut buf = bytes::BytesMut::from(&b"head"[..]);
        wire::encode_into(&mut buf, &rpc);
        assert_eq!(&buf[..4], b"head");
        assert_eq!(buf[4..], wire::encode(&rpc)[..]);
    }

    #[test]
    fn decode_shared_hands_out_slices_of_its_buffer_and_decode_copies() {
        let body = vec![7u8; 4000];
        let frame = bytes::Bytes::from(wire::encode(&Rpc::Propose(Blob(body.clone().into()))));
        let within = |b: &Blob| {
            let (s, p) = (frame.as_ptr() as usize, b.0.as_ptr() as usize);
            p >= s && p + b.0.len() <= s + frame.len()
        };
        let Ok(Rpc::Propose(shared)) = wire::decode_shared::<Rpc>(&frame) else {
            panic!("not a proposal");
        };
        assert_eq!(shared.0[..], body[..]);
        assert!(within(&shared), "decode_shared shares the frame");
        let Ok(Rpc::Propose(copied)) = wire::decode::<Rpc>(&frame) else {
            panic!("not a proposal");
        };
        assert_eq!(copied.0[..], body[..]);
        assert!(
            !within(&copied),
            "decode copies: nothing pins the buffer it read"
        );
    }

    #[test]
    fn proposals_and_membership_changes_are_not_raft_messages() {
        let vote = wire::encode(&Rpc::Vote(VoteRequest::new(Vote::new(1, 1), None)));
        let propose = wire::encode(&Rpc::Propose(Blob(vec![1, 2, 3].into())));
        let join = wire::encode(&Rpc::Join(Node::default()));
        assert!(is_raft_message(&vote));
        assert!(!is_raft_message(&propose));
        assert!(!is_raft_message(&join));
        assert!(!is_raft_message(&[]));
    }
}
