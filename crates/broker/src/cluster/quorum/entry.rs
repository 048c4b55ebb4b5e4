//! A group log entry's encoding: a batch of enqueued messages, settled ids and runs, kept dead
//! letters, returns and claims, and the proposing leader's epoch (read back by older formats).

use bytes::{BufMut, BytesMut};

use super::{Batch, OP_ENQUEUE};

/// An entry: `[OP_ENQUEUE][n u32]([len u32][stored message])*n`, then the settled, returned
/// and claimed ids, each as `[m u32]([id u64])*m`, then `[claim_new u32][epoch u64]`, then the
/// settled runs `[r u32]([first u64][last u64])*r` and the kept dead letters
/// `[d u32]([id u64][len u32][stored message][k u16]([len u16][routing key])*k)*d` (both absent
/// from entries of earlier versions).
pub(super) fn encode(batch: &Batch) -> Vec<u8> {
    let mut b = BytesMut::with_capacity(batch.bytes + 16 + batch.settled.len() * 8);
    b.put_u8(OP_ENQUEUE);
    b.put_u32(batch.msgs.len() as u32);
    for (m, _) in &batch.msgs {
        let at = b.len();
        b.put_u32(0);
        crate::persist::encode_message_into(&mut b, m, None);
        let len = (b.len() - at - 4) as u32;
        b[at..at + 4].copy_from_slice(&len.to_be_bytes());
    }
    for ids in [&batch.settled, &batch.returned, &batch.claimed] {
        b.put_u32(ids.len() as u32);
        for id in ids {
            b.put_u64(*id);
        }
    }
    b.put_u32(batch.claim_new);
    b.put_u64(batch.epoch);
    b.put_u32(batch.settled_runs.len() as u32);
    for (first, last) in &batch.settled_runs {
        b.put_u64(*first);
        b.put_u64(*last);
    }
    b.put_u32(batch.dead.len() as u32);
    for (id, m, cc) in &batch.dead {
        b.put_u64(*id);
        let at = b.len();
        b.put_u32(0);
        crate::persist::encode_message_into(&mut b, m, None);
        let len = (b.len() - at - 4) as u32;
        b[at..at + 4].copy_from_slice(&len.to_be_bytes());
        b.put_u16(cc.len() as u16);
        for k in cc {
            b.put_u16(k.len() as u16);
            b.put_slice(k.as_bytes());
        }
    }
    b.to_vec()
}

// Read back by `replicated/legacy.rs`, which carries groups of this format over to the queue
// machine; the same decoder serves here.
pub(super) use crate::replicated::legacy::decode;
