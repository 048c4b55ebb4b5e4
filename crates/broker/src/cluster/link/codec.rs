//! Strings in link payloads: a `u16` length, then the bytes.

use bytes::{Buf, BufMut, Bytes, BytesMut};

pub fn put_str(b: &mut BytesMut, s: &str) {
    b.put_u16(s.len() as u16);
    b.put_slice(s.as_bytes());
}

/// Reads what [`put_str`] wrote.
pub fn get_str(b: &mut Bytes) -> Option<String> {
    if b.len() < 2 {
        return None;
    }
    let n = b.get_u16() as usize;
    if b.len() < n {
        return None;
    }
    String::from_utf8(b.split_to(n).to_vec()).ok()
}
