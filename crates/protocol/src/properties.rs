//! Content headers. The broker keeps the property bytes (flags included) as received and sends
//! them back verbatim; [`BasicProperties::decode`] reads them only when a feature needs a field.

use bytes::{BufMut, Bytes, BytesMut};
use bytestring::ByteString;

use crate::codec::{Reader, Writer};
use crate::error::DecodeError;
use crate::table::FieldTable;

/// A decoded content header frame.
#[derive(Debug, Clone, PartialEq)]
pub struct ContentHeader {
    pub class_id: u16,
    pub body_size: u64,
    /// Property flags and property values, exactly as on the wire.
    pub raw_properties: Bytes,
}

impl ContentHeader {
    pub fn decode(payload: &Bytes) -> Result<ContentHeader, DecodeError> {
        let mut r = Reader::new(payload);
        let class_id = r.u16()?;
        let _weight = r.u16()?;
        let body_size = r.u64()?;
        let n = r.remaining();
        if n < 2 {
            return Err(DecodeError::Truncated("property flags"));
        }
        let raw_properties = r.raw(n, "properties")?;
        Ok(ContentHeader {
            class_id,
            body_size,
            raw_properties,
        })
    }
}

const CONTENT_TYPE: u16 = 1 << 15;
const CONTENT_ENCODING: u16 = 1 << 14;
const HEADERS: u16 = 1 << 13;
const DELIVERY_MODE: u16 = 1 << 12;
const PRIORITY: u16 = 1 << 11;
const CORRELATION_ID: u16 = 1 << 10;
const REPLY_TO: u16 = 1 << 9;
const EXPIRATION: u16 = 1 << 8;
const MESSAGE_ID: u16 = 1 << 7;
const TIMESTAMP: u16 = 1 << 6;
const KIND: u16 = 1 << 5;
const USER_ID: u16 = 1 << 4;
const APP_ID: u16 = 1 << 3;
const CLUSTER_ID: u16 = 1 << 2;

/// The basic class's properties. Strings are zero-copy slices of the raw header.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct BasicProperties {
    pub content_type: Option<ByteString>,
    pub content_encoding: Option<ByteString>,
    pub headers: Option<FieldTable>,
    pub delivery_mode: Option<u8>,
    pub priority: Option<u8>,
    pub correlation_id: Option<ByteString>,
    pub reply_to: Option<ByteString>,
    pub expiration: Option<ByteString>,
    pub message_id: Option<ByteString>,
    pub timestamp: Option<u64>,
    pub kind: Option<ByteString>,
    pub user_id: Option<ByteString>,
    pub app_id: Option<ByteString>,
    pub cluster_id: Option<ByteString>,
}

impl BasicProperties {
    pub fn decode(raw: &Bytes) -> Result<BasicProperties, DecodeError> {
        let mut r = Reader::new(raw);
        let flags = r.u16()?;
        // Continuation flag words carry no basic-class properties; skip them.
        let mut more = flags & 1 != 0;
        while more {
            more = r.u16()? & 1 != 0;
        }
        let mut p = BasicProperties::default();
        let has = |bit: u16| flags & bit != 0;
        if has(CONTENT_TYPE) {
            p.content_type = Some(r.short_str()?);
        }
        if has(CONTENT_ENCODING) {
            p.content_encoding = Some(r.short_str()?);
        }
        if has(HEADERS) {
            p.headers = Some(r.table()?);
        }
        if has(DELIVERY_MODE) {
            p.delivery_mode = Some(r.u8()?);
        }
        if has(PRIORITY) {
            p.priority = Some(r.u8()?);
        }
        if has(CORRELATION_ID) {
            p.correlation_id = Some(r.short_str()?);
        }
        if has(REPLY_TO) {
            p.reply_to = Some(r.short_str()?);
        }
        if has(EXPIRATION) {
            p.expiration = Some(r.short_str()?);
        }
        if has(MESSAGE_ID) {
            p.message_id = Some(r.short_str()?);
        }
        if has(TIMESTAMP) {
            p.timestamp = Some(r.u64()?);
        }
        if has(KIND) {
            p.kind = Some(r.short_str()?);
        }
        if has(USER_ID) {
            p.user_id = Some(r.short_str()?);
        }
        if has(APP_ID) {
            p.app_id = Some(r.short_str()?);
        }
        if has(CLUSTER_ID) {
            p.cluster_id = Some(r.short_str()?);
        }
        Ok(p)
    }

    /// Encodes flags and values, as they go after body_size in a content header.
    pub fn encode(&self, buf: &mut BytesMut) {
        let mut flags = 0u16;
        let mut set = |present: bool, bit: u16| {
            if present {
                flags |= bit
            }
        };
        set(self.content_type.is_some(), CONTENT_TYPE);
        set(self.content_encoding.is_some(), CONTENT_ENCODING);
        set(self.headers.is_some(), HEADERS);
        set(self.delivery_mode.is_some(), DELIVERY_MODE);
        set(self.priority.is_some(), PRIORITY);
        set(self.correlation_id.is_some(), CORRELATION_ID);
        set(self.reply_to.is_some(), REPLY_TO);
        set(self.expiration.is_some(), EXPIRATION);
        set(self.message_id.is_some(), MESSAGE_ID);
        set(self.timestamp.is_some(), TIMESTAMP);
        set(self.kind.is_some(), KIND);
        set(self.user_id.is_some(), USER_ID);
        set(self.app_id.is_some(), APP_ID);
        set(self.cluster_id.is_some(), CLUSTER_ID);
        buf.put_u16(flags);
        let mut w = Writer::new(buf);
        let s = |w: &mut Writer<'_>, v: &Option<ByteString>| {
            if let Some(v) = v {
                w.short_str(v)
            }
        };
        s(&mut w, &self.content_type);
        s(&mut w, &self.content_encoding);
        if let Some(h) = &self.headers {
            w.table(h);
        }
        if let Some(v) = self.delivery_mode {
            w.u8(v);
        }
        if let Some(v) = self.priority {
            w.u8(v);
        }
        s(&mut w, &self.correlation_id);
        s(&mut w, &self.reply_to);
        s(&mut w, &self.expiration);
        s(&mut w, &self.message_id);
        if let Some(v) = self.timestamp {
            w.u64(v);
        }
        s(&mut w, &self.kind);
        s(&mut w, &self.user_id);
        s(&mut w, &self.app_id);
        s(&mut w, &self.cluster_id);
        w.finish();
    }

    pub fn to_bytes(&self) -> Bytes {
        let mut b = BytesMut::new();
        self.encode(&mut b);
        b.freeze()
    }
}

/// Whether the headers may hold the key `key`: headers are present and the key's shortstr bytes
/// (length, then name) occur somewhere in `raw`. False means certainly absent, so a publish is
/// decoded to look for a rarely used header only when its bytes are there.
pub fn may_have_header(raw: &[u8], key: &str) -> bool {
    if raw.len() < 2 || u16::from_be_bytes([raw[0], raw[1]]) & HEADERS == 0 {
        return false;
    }
    let n = key.len();
    raw.windows(n + 1)
        .any(|w| w[0] as usize == n && &w[1..] == key.as_bytes())
}

/// Reads delivery_mode without decoding the rest: it sits after content-type, content-encoding and
/// headers, each skippable in O(1). Used on every publish to tell persistent messages apart.
pub fn delivery_mode(raw: &[u8]) -> Option<u8> {
    if raw.len() < 2 {
        return None;
    }
    let flags = u16::from_be_bytes([raw[0], raw[1]]);
    if flags & DELIVERY_MODE == 0 || flags & 1 != 0 {
        return if flags & 1 != 0 {
            BasicProperties::decode(&Bytes::copy_from_slice(raw))
                .ok()?
                .delivery_mode
        } else {
            None
        };
    }
    let mut pos = 2usize;
    for bit in [CONTENT_TYPE, CONTENT_ENCODING] {
        if flags & bit != 0 {
            pos += 1 + *raw.get(pos)? as usize;
        }
    }
    if flags & HEADERS != 0 {
        let b = raw.get(pos..pos + 4)?;
        pos += 4 + u32::from_be_bytes([b[0], b[1], b[2], b[3]]) as usize;
    }
    raw.get(pos).copied()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::table::FieldValue;

    #[test]
    fn round_trip_and_fast_delivery_mode() {
        let mut h = FieldTable::new();
        h.insert("x", FieldValue::I32(1));
        let p = BasicProperties {
            content_type: Some("text/plain".into()),
            headers: Some(h),
            delivery_mode: Some(2),
            priority: Some(3),
            expiration: Some("1000".into()),
            timestamp: Some(42),
            user_id: Some("guest".into()),
            ..Default::default()
        };
        let raw = p.to_bytes();
        assert_eq!(BasicProperties::decode(&raw).expect("decodes"), p);
        assert_eq!(delivery_mode(&raw), Some(2));
        assert_eq!(delivery_mode(&BasicProperties::default().to_bytes()), None);
    }

    #[test]
    fn header_precheck() {
        let mut h = FieldTable::new();
        h.insert("BCC", FieldValue::Array(vec![FieldValue::str("k")]));
        let with = BasicProperties {
            headers: Some(h),
            ..Default::default()
        }
        .to_bytes();
        assert!(may_have_header(&with, "BCC"));
        assert!(
            !may_have_header(&with, "CC"),
            "'BCC' is not the shortstr 'CC'"
        );
        let without = BasicProperties {
            content_type: Some("CC".into()),
            ..Default::default()
        }
        .to_bytes();
        assert!(
            !may_have_header(&without, "CC"),
            "no headers, whatever the bytes"
        );
    }

    #[test]
    fn truncated_properties_error() {
        let raw = Bytes::from_static(&[0x80, 0, 5, b'a']);
        assert!(BasicProperties::decode(&raw).is_err());
    }
}

#[cfg(test)]
mod props {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// Properties round-trip, inside a content header too, and the fast delivery_mode
        /// reader agrees with the full decoder.
        #[test]
        fn any_properties_round_trip(p in crate::arb::properties(), size in any::<u64>()) {
            let raw = p.to_bytes();
            prop_assert_eq!(BasicProperties::decode(&raw).expect("decodes"), p.clone());
            prop_assert_eq!(delivery_mode(&raw), p.delivery_mode);
            // The header pre-check never misses a key that is there.
            for (k, _) in p.headers.iter().flat_map(|h| h.0.iter()) {
                prop_assert!(may_have_header(&raw, k));
            }
            let mut framed = BytesMut::new();
            crate::frame::write_content_header(&mut framed, 1, 60, size, &raw);
            let f = crate::FrameDecoder::new(0).decode(&mut framed).expect("frames").expect("whole");
            let h = ContentHeader::decode(&f.payload).expect("decodes");
            prop_assert_eq!((h.class_id, h.body_size), (60, size));
            prop_assert_eq!(BasicProperties::decode(&h.raw_properties).expect("decodes"), p);
        }
    }
}
