//! A group log entry's encoding: a batch of enqueued messages, settled ids and runs, kept dead
//! letters, returns and claims, and the proposing leader's epoch (read back by older formats).

use bytes::{Buf, BufMut, Bytes, BytesMut};
use warren_protocol::ByteString;

use super::{Batch, BATCH_MSGS, OP_ENQUEUE};

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

pub(super) struct Decoded {
    pub(super) msgs: Vec<Bytes>,
    pub(super) settled: Vec<u64>,
    pub(super) settled_runs: Vec<(u64, u64)>,
    pub(super) dead: Vec<(u64, Bytes, Vec<ByteString>)>,
    pub(super) returned: Vec<u64>,
    pub(super) claimed: Vec<u64>,
    pub(super) claim_new: u32,
    pub(super) epoch: u64,
}

pub(super) fn decode(command: Bytes) -> Option<Decoded> {
    let mut b = command;
    if b.remaining() < 5 || b.get_u8() != OP_ENQUEUE {
        return None;
    }
    let n = b.get_u32() as usize;
    let mut msgs = Vec::with_capacity(n.min(BATCH_MSGS * 2));
    for _ in 0..n {
        if b.remaining() < 4 {
            return None;
        }
        let len = b.get_u32() as usize;
        if b.remaining() < len {
            return None;
        }
        msgs.push(b.split_to(len));
    }
    let mut ids = || -> Option<Vec<u64>> {
        if b.remaining() < 4 {
            return None;
        }
        let m = b.get_u32() as usize;
        if b.remaining() < m * 8 {
            return None;
        }
        Some((0..m).map(|_| b.get_u64()).collect())
    };
    let settled = ids()?;
    let returned = ids()?;
    let claimed = ids()?;
    if b.remaining() < 12 {
        return None;
    }
    let claim_new = b.get_u32();
    let epoch = b.get_u64();
    let mut settled_runs = Vec::new();
    if b.remaining() >= 4 {
        let r = b.get_u32() as usize;
        if b.remaining() < r * 16 {
            return None;
        }
        settled_runs = (0..r).map(|_| (b.get_u64(), b.get_u64())).collect();
    }
    let mut dead = Vec::new();
    if b.remaining() >= 4 {
        let d = b.get_u32() as usize;
        for _ in 0..d {
            if b.remaining() < 12 {
                return None;
            }
            let id = b.get_u64();
            let len = b.get_u32() as usize;
            if b.remaining() < len + 2 {
                return None;
            }
            let data = b.split_to(len);
            let k = b.get_u16() as usize;
            let mut cc = Vec::with_capacity(k);
            for _ in 0..k {
                if b.remaining() < 2 {
                    return None;
                }
                let n = b.get_u16() as usize;
                if b.remaining() < n {
                    return None;
                }
                cc.push(ByteString::try_from(b.split_to(n)).ok()?);
            }
            dead.push((id, data, cc));
        }
    }
    Some(Decoded {
        msgs,
        settled,
        settled_runs,
        dead,
        returned,
        claimed,
        claim_new,
        epoch,
    })
}
