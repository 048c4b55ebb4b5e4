//! Records of a segment: encoding an entry, reading entries from a position, scanning a
//! segment at open.

use std::os::unix::fs::FileExt;

use bytes::{BufMut, Bytes, BytesMut};

use super::types::{
    Entry, IndexEntry, ReadPlan, Segment, INDEX_EVERY_BYTES, KIND_CHUNK, KIND_ENTRY, KIND_HEADER,
    READ_BYTES, SEGMENT_VERSION,
};
use crate::record::{self, Scan, HEADER_BYTES};

pub(super) fn ts_of(data: &[u8]) -> u64 {
    data.get(..8)
        .and_then(|b| b.try_into().ok())
        .map_or(0, u64::from_be_bytes)
}

/// [`record::encode`] of `ts_ms | data`, without first copying them into one buffer.
pub(super) fn encode_entry(buf: &mut BytesMut, kind: u8, offset: u64, ts_ms: u64, data: &[u8]) {
    let len = (1 + 8 + 8 + data.len()) as u32;
    let mut crc = crc32fast::Hasher::new();
    crc.update(&[kind]);
    crc.update(&offset.to_be_bytes());
    crc.update(&ts_ms.to_be_bytes());
    crc.update(data);
    buf.reserve(HEADER_BYTES + len as usize);
    buf.put_u32(record::MAGIC);
    buf.put_u32(len);
    buf.put_u32(crc.finalize());
    buf.put_u8(kind);
    buf.put_u64(offset);
    buf.put_u64(ts_ms);
    buf.put_slice(data);
}

/// Reads whole entries from `plan.pos` up to about `max_bytes` (at least one whole entry if
/// there is one), without any lock. Returns them and the position after the last one.
pub fn read(plan: &ReadPlan, max_bytes: u64) -> std::io::Result<(Vec<Entry>, u64)> {
    read_into(plan, max_bytes, None)
}

/// [`read`], with the offsets of the entries among them that start a chunk (a replicated
/// stream's member copies another's chunks as they are).
pub fn read_with_chunks(
    plan: &ReadPlan,
    max_bytes: u64,
) -> std::io::Result<(Vec<Entry>, Vec<u64>)> {
    let mut chunks = Vec::new();
    let (entries, _) = read_into(plan, max_bytes, Some(&mut chunks))?;
    Ok((entries, chunks))
}

fn read_into(
    plan: &ReadPlan,
    max_bytes: u64,
    mut chunks: Option<&mut Vec<u64>>,
) -> std::io::Result<(Vec<Entry>, u64)> {
    let mut out = Vec::new();
    let mut pos = plan.pos;
    if pos >= plan.end {
        return Ok((out, pos));
    }
    let mut want = max_bytes.max(HEADER_BYTES as u64).min(plan.end - pos);
    loop {
        let mut b = vec![0u8; want as usize];
        plan.file.read_exact_at(&mut b, pos)?;
        let bytes = Bytes::from(b);
        let mut at = 0;
        while at < bytes.len() {
            match record::scan(&bytes, at) {
                Scan::Record(r, next) if r.kind == KIND_HEADER => at = next,
                Scan::Record(r, next) => {
                    if let (KIND_CHUNK, Some(c)) = (r.kind, chunks.as_deref_mut()) {
                        c.push(r.seq);
                    }
                    out.push(Entry {
                        offset: r.seq,
                        ts_ms: ts_of(&r.data),
                        data: r.data.slice(8.min(r.data.len())..),
                    });
                    at = next;
                }
                Scan::Truncated => break,
                Scan::Corrupt => {
                    return Err(std::io::Error::new(
                        std::io::ErrorKind::InvalidData,
                        "corrupt stream record",
                    ))
                }
            }
        }
        pos += at as u64;
        if !out.is_empty() || pos >= plan.end {
            return Ok((out, pos));
        }
        // One entry bigger than the read: read exactly its length.
        if bytes.len() < HEADER_BYTES {
            return Ok((out, pos));
        }
        let len = u32::from_be_bytes(bytes[4..8].try_into().unwrap_or_default()) as u64;
        let need = (HEADER_BYTES as u64 + len).min(plan.end - pos);
        if need <= want {
            return Ok((out, pos));
        }
        want = need;
    }
}

/// Scans a segment in [`READ_BYTES`] reads, filling in its offsets, timestamps and index;
/// returns the length of its whole, valid records.
pub(super) fn scan_segment(
    seg: &mut Segment,
    size: u64,
    last_chunk: &mut u64,
) -> std::io::Result<u64> {
    let mut pos = 0u64;
    let mut last_index: Option<u64> = None;
    while pos < size {
        let want = READ_BYTES.min(size - pos);
        let mut b = vec![0u8; want as usize];
        seg.file.read_exact_at(&mut b, pos)?;
        let bytes = Bytes::from(b);
        let mut at = 0usize;
        let mut bad = false;
        while at < bytes.len() {
            match record::scan(&bytes, at) {
                Scan::Record(r, next) if r.kind == KIND_HEADER && pos + (at as u64) == 0 => {
                    let version = r.data.get(8).copied().unwrap_or(0);
                    if version > SEGMENT_VERSION {
                        return Err(std::io::Error::new(
                            std::io::ErrorKind::InvalidData,
                            format!(
                                "stream segment {} is of format version {version}, newer than this build reads ({SEGMENT_VERSION}): run the newer build",
                                seg.path.display()
                            ),
                        ));
                    }
                    at = next;
                }
                Scan::Record(r, next) => {
                    if !matches!(r.kind, KIND_CHUNK | KIND_ENTRY) || r.seq < seg.next {
                        bad = true;
                        break;
                    }
                    let rec_pos = pos + at as u64;
                    let ts = ts_of(&r.data);
                    if seg.next == seg.first {
                        seg.first_ts = ts;
                    }
                    if last_index.is_none_or(|l| rec_pos >= l + INDEX_EVERY_BYTES) {
                        seg.index.push(IndexEntry {
                            offset: r.seq,
                            pos: rec_pos,
                            ts_ms: ts,
                        });
                        last_index = Some(rec_pos);
                    }
                    if r.kind == KIND_CHUNK {
                        *last_chunk = r.seq;
                    }
                    seg.last_ts = ts;
                    seg.next = r.seq + 1;
                    at = next;
                }
                Scan::Truncated if at > 0 => break,
                // A record longer than the read: read it whole, if the file holds it.
                Scan::Truncated => {
                    if bytes.len() < HEADER_BYTES {
                        return Ok(pos);
                    }
                    let len = u32::from_be_bytes(bytes[4..8].try_into().unwrap_or_default());
                    let need = HEADER_BYTES as u64 + len as u64;
                    if len > record::MAX_PAYLOAD_BYTES || pos + need > size {
                        return Ok(pos);
                    }
                    let mut whole = vec![0u8; need as usize];
                    seg.file.read_exact_at(&mut whole, pos)?;
                    let whole = Bytes::from(whole);
                    match record::scan(&whole, 0) {
                        Scan::Record(r, _) if matches!(r.kind, KIND_CHUNK | KIND_ENTRY) => {
                            let ts = ts_of(&r.data);
                            if seg.next == seg.first {
                                seg.first_ts = ts;
                            }
                            seg.index.push(IndexEntry {
                                offset: r.seq,
                                pos,
                                ts_ms: ts,
                            });
                            last_index = Some(pos);
                            if r.kind == KIND_CHUNK {
                                *last_chunk = r.seq;
                            }
                            seg.last_ts = ts;
                            seg.next = r.seq + 1;
                            at = whole.len();
                        }
                        _ => return Ok(pos),
                    }
                    break;
                }
                Scan::Corrupt => {
                    bad = true;
                    break;
                }
            }
        }
        pos += at as u64;
        if bad || at == 0 {
            return Ok(pos);
        }
    }
    Ok(pos)
}
