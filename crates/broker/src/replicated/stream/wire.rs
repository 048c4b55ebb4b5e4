//! A replicated stream's bytes on the wire: its Raft entries (messages and tracking records,
//! the state machine's version first) and a fetch's answer (entries copied from a member's
//! segments, with where their chunks start).

use bytes::{Buf, BufMut, Bytes, BytesMut};

use super::MACHINE_VERSION;
use crate::queue::stream::Track;

/// How many of `msgs` asked for a confirm (marked [`CONFIRMED`] in `Batch::msgs`).
pub(super) fn confirmed_among(msgs: &[(Bytes, u32)]) -> usize {
    msgs.iter().filter(|(_, p)| *p & CONFIRMED != 0).count()
}

/// The top bit of a message's patch position in `Batch::msgs`: it has a confirm.
pub(super) const CONFIRMED: u32 = 1 << 31;

/// `[version][ts u64][n u32]{[len u32][patch u32][stored]}[t u32]{[kind u8][len u16][ref]
/// [value u64]}`.
pub(super) fn encode_entry(ts: u64, msgs: &[(Bytes, u32)], tracks: &[Track]) -> Bytes {
    let size: usize = msgs.iter().map(|(m, _)| 8 + m.len()).sum();
    let mut b = BytesMut::with_capacity(1 + 8 + 4 + size + 4 + tracks.len() * 32);
    b.put_u8(MACHINE_VERSION);
    b.put_u64(ts);
    b.put_u32(msgs.len() as u32);
    for (m, patch) in msgs {
        b.put_u32(m.len() as u32);
        b.put_u32(patch & !CONFIRMED);
        b.put_slice(m);
    }
    b.put_u32(tracks.len() as u32);
    for t in tracks {
        let (kind, r, v) = match t {
            Track::Offset(r, v) => (1u8, r, *v),
            Track::Publisher(r, v) => (2u8, r, *v),
        };
        let r = &r.as_bytes()[..r.len().min(u16::MAX as usize)];
        b.put_u8(kind);
        b.put_u16(r.len() as u16);
        b.put_slice(r);
        b.put_u64(v);
    }
    b.freeze()
}

/// An entry's time, its messages (stored form, patch position) and its tracking records.
pub(super) type Decoded<'a> = (u64, Vec<(&'a [u8], usize)>, Vec<Track>);

pub(super) fn decode_entry(e: &[u8]) -> Result<Decoded<'_>, String> {
    let mut b = e;
    let short = || "a short stream entry".to_string();
    if b.remaining() < 13 {
        return Err(short());
    }
    let v = b.get_u8();
    if v > MACHINE_VERSION {
        return Err(format!(
            "a stream entry of version {v}, newer than this build applies ({MACHINE_VERSION})"
        ));
    }
    let ts = b.get_u64();
    let n = b.get_u32() as usize;
    let mut msgs = Vec::with_capacity(n.min(65_536));
    for _ in 0..n {
        if b.remaining() < 8 {
            return Err(short());
        }
        let (len, patch) = (b.get_u32() as usize, b.get_u32() as usize);
        if b.remaining() < len {
            return Err(short());
        }
        msgs.push((&b[..len], patch));
        b.advance(len);
    }
    let mut tracks = Vec::new();
    if b.remaining() >= 4 {
        for _ in 0..b.get_u32() {
            if b.remaining() < 3 {
                return Err(short());
            }
            let (kind, len) = (b.get_u8(), b.get_u16() as usize);
            if b.remaining() < len + 8 {
                return Err(short());
            }
            let r = String::from_utf8_lossy(&b[..len]).into_owned();
            b.advance(len);
            let v = b.get_u64();
            tracks.push(match kind {
                1 => Track::Offset(r, v),
                _ => Track::Publisher(r, v),
            });
        }
    }
    Ok((ts, msgs, tracks))
}

/// A fetch's answer: `[n u32]{[offset u64][ts u64][chunk u8][len u32][data]}`.
pub fn encode_fetched(entries: &[warren_store::stream::Entry], chunks: &[u64]) -> Bytes {
    let size: usize = entries.iter().map(|e| 21 + e.data.len()).sum();
    let mut b = BytesMut::with_capacity(4 + size);
    b.put_u32(entries.len() as u32);
    for e in entries {
        b.put_u64(e.offset);
        b.put_u64(e.ts_ms);
        b.put_u8(chunks.contains(&e.offset) as u8);
        b.put_u32(e.data.len() as u32);
        b.put_slice(&e.data);
    }
    b.freeze()
}

pub(super) fn decode_fetched(mut b: Bytes) -> Option<(Vec<warren_store::stream::Entry>, Vec<u64>)> {
    if b.remaining() < 4 {
        return None;
    }
    let n = b.get_u32();
    let (mut entries, mut chunks) = (Vec::new(), Vec::new());
    for _ in 0..n {
        if b.remaining() < 21 {
            return None;
        }
        let (offset, ts_ms, chunk, len) = (b.get_u64(), b.get_u64(), b.get_u8(), b.get_u32());
        if b.remaining() < len as usize {
            return None;
        }
        if chunk == 1 {
            chunks.push(offset);
        }
        entries.push(warren_store::stream::Entry {
            offset,
            ts_ms,
            data: b.split_to(len as usize),
        });
    }
    Some((entries, chunks))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_and_fetches_round_trip() {
        let msgs = vec![
            (Bytes::from_static(b"one"), 1 | CONFIRMED),
            (Bytes::from_static(b"two!"), 2),
        ];
        let tracks = vec![
            Track::Offset("c".into(), 7),
            Track::Publisher("p".into(), 9),
        ];
        let e = encode_entry(42, &msgs, &tracks);
        let (ts, got, t) = decode_entry(&e).expect("decodes");
        assert_eq!(ts, 42);
        assert_eq!(got, vec![(&b"one"[..], 1), (&b"two!"[..], 2)]);
        assert_eq!(t, tracks);
        assert_eq!(confirmed_among(&msgs), 1);
        let mut newer = e.to_vec();
        newer[0] = MACHINE_VERSION + 1;
        assert!(decode_entry(&newer).unwrap_err().contains("newer"));
        assert!(decode_entry(&e[..20]).is_err());

        let entries = vec![
            warren_store::stream::Entry {
                offset: 5,
                ts_ms: 1,
                data: Bytes::from_static(b"a"),
            },
            warren_store::stream::Entry {
                offset: 6,
                ts_ms: 2,
                data: Bytes::from_static(b"bc"),
            },
        ];
        let (back, chunks) = decode_fetched(encode_fetched(&entries, &[6])).expect("decodes");
        assert_eq!(back, entries);
        assert_eq!(chunks, vec![6]);
    }
}
