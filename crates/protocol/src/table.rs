//! Field tables (`F`) and field values, with the type tags RabbitMQ uses (0-9-1 errata, not the
//! original spec: `s` is a signed 16-bit int, `l` a signed 64-bit int, `x` a byte array).

use bytes::{BufMut, Bytes, BytesMut};
use bytestring::ByteString;

use crate::codec::Reader;
use crate::error::DecodeError;

/// How deeply tables and arrays may nest. Decoding recurses, so without a bound a frame of
/// nested `F` tags (6 octets a level) could overflow a worker's stack; real headers (x-death)
/// nest three levels.
pub const MAX_NESTING: usize = 64;

/// A field table, in wire order. Tables are small, so a vector beats a map and keeps the order.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct FieldTable(pub Vec<(ByteString, FieldValue)>);

#[derive(Debug, Clone, PartialEq)]
pub enum FieldValue {
    Bool(bool),
    I8(i8),
    U8(u8),
    I16(i16),
    U16(u16),
    I32(i32),
    U32(u32),
    I64(i64),
    U64(u64),
    F32(f32),
    F64(f64),
    Decimal(u8, u32),
    /// `S`: a long string (arbitrary octets).
    LongStr(Bytes),
    Array(Vec<FieldValue>),
    Timestamp(u64),
    Table(FieldTable),
    Void,
    /// `x`: a byte array.
    Bytes(Bytes),
}

impl FieldTable {
    pub fn new() -> Self {
        FieldTable(Vec::new())
    }

    pub fn get(&self, key: &str) -> Option<&FieldValue> {
        self.0.iter().find(|(k, _)| &**k == key).map(|(_, v)| v)
    }

    pub fn insert(&mut self, key: &str, value: FieldValue) {
        if let Some(slot) = self.0.iter_mut().find(|(k, _)| &**k == key) {
            slot.1 = value;
        } else {
            self.0.push((ByteString::from(key), value));
        }
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub(crate) fn decode(r: &mut Reader<'_>) -> Result<Self, DecodeError> {
        Self::decode_nested(r, 0)
    }

    fn decode_nested(r: &mut Reader<'_>, depth: usize) -> Result<Self, DecodeError> {
        if depth >= MAX_NESTING {
            return Err(DecodeError::TooDeep);
        }
        let n = r.u32()? as usize;
        let raw = r.raw(n, "table")?;
        let mut inner = Reader::new(&raw);
        let mut entries = Vec::new();
        while inner.remaining() > 0 {
            let k = inner.short_str()?;
            let v = FieldValue::decode(&mut inner, depth)?;
            entries.push((k, v));
        }
        Ok(FieldTable(entries))
    }

    pub fn encode(&self, buf: &mut BytesMut) {
        let start = buf.len();
        buf.put_u32(0);
        for (k, v) in &self.0 {
            let n = k.len().min(255);
            buf.put_u8(n as u8);
            buf.put_slice(&k.as_bytes()[..n]);
            v.encode(buf);
        }
        let len = (buf.len() - start - 4) as u32;
        buf[start..start + 4].copy_from_slice(&len.to_be_bytes());
    }
}

impl FieldValue {
    /// `depth`: how many tables and arrays enclose this value.
    fn decode(r: &mut Reader<'_>, depth: usize) -> Result<Self, DecodeError> {
        let tag = r.u8()?;
        Ok(match tag {
            b't' => FieldValue::Bool(r.u8()? != 0),
            b'b' => FieldValue::I8(r.u8()? as i8),
            b'B' => FieldValue::U8(r.u8()?),
            b's' => FieldValue::I16(r.u16()? as i16),
            b'u' => FieldValue::U16(r.u16()?),
            b'I' => FieldValue::I32(r.u32()? as i32),
            b'i' => FieldValue::U32(r.u32()?),
            b'l' => FieldValue::I64(r.u64()? as i64),
            b'L' => FieldValue::U64(r.u64()?),
            b'f' => FieldValue::F32(f32::from_bits(r.u32()?)),
            b'd' => FieldValue::F64(f64::from_bits(r.u64()?)),
            b'D' => FieldValue::Decimal(r.u8()?, r.u32()?),
            b'S' => FieldValue::LongStr(r.long_bytes()?),
            b'A' => {
                if depth + 1 >= MAX_NESTING {
                    return Err(DecodeError::TooDeep);
                }
                let n = r.u32()? as usize;
                let raw = r.raw(n, "array")?;
                let mut inner = Reader::new(&raw);
                let mut items = Vec::new();
                while inner.remaining() > 0 {
                    items.push(FieldValue::decode(&mut inner, depth + 1)?);
                }
                FieldValue::Array(items)
            }
            b'T' => FieldValue::Timestamp(r.u64()?),
            b'F' => FieldValue::Table(FieldTable::decode_nested(r, depth + 1)?),
            b'V' => FieldValue::Void,
            b'x' => FieldValue::Bytes(r.long_bytes()?),
            other => return Err(DecodeError::BadFieldType(other)),
        })
    }

    fn encode(&self, buf: &mut BytesMut) {
        match self {
            FieldValue::Bool(v) => {
                buf.put_u8(b't');
                buf.put_u8(*v as u8);
            }
            FieldValue::I8(v) => {
                buf.put_u8(b'b');
                buf.put_i8(*v);
            }
            FieldValue::U8(v) => {
                buf.put_u8(b'B');
                buf.put_u8(*v);
            }
            FieldValue::I16(v) => {
                buf.put_u8(b's');
                buf.put_i16(*v);
            }
            FieldValue::U16(v) => {
                buf.put_u8(b'u');
                buf.put_u16(*v);
            }
            FieldValue::I32(v) => {
                buf.put_u8(b'I');
                buf.put_i32(*v);
            }
            FieldValue::U32(v) => {
                buf.put_u8(b'i');
                buf.put_u32(*v);
            }
            FieldValue::I64(v) => {
                buf.put_u8(b'l');
                buf.put_i64(*v);
            }
            FieldValue::U64(v) => {
                buf.put_u8(b'L');
                buf.put_u64(*v);
            }
            FieldValue::F32(v) => {
                buf.put_u8(b'f');
                buf.put_f32(*v);
            }
            FieldValue::F64(v) => {
                buf.put_u8(b'd');
                buf.put_f64(*v);
            }
            FieldValue::Decimal(s, v) => {
                buf.put_u8(b'D');
                buf.put_u8(*s);
                buf.put_u32(*v);
            }
            FieldValue::LongStr(v) => {
                buf.put_u8(b'S');
                buf.put_u32(v.len() as u32);
                buf.put_slice(v);
            }
            FieldValue::Array(items) => {
                buf.put_u8(b'A');
                let start = buf.len();
                buf.put_u32(0);
                for i in items {
                    i.encode(buf);
                }
                let len = (buf.len() - start - 4) as u32;
                buf[start..start + 4].copy_from_slice(&len.to_be_bytes());
            }
            FieldValue::Timestamp(v) => {
                buf.put_u8(b'T');
                buf.put_u64(*v);
            }
            FieldValue::Table(t) => {
                buf.put_u8(b'F');
                t.encode(buf);
            }
            FieldValue::Void => buf.put_u8(b'V'),
            FieldValue::Bytes(v) => {
                buf.put_u8(b'x');
                buf.put_u32(v.len() as u32);
                buf.put_slice(v);
            }
        }
    }

    /// A long string value from text (the common case when building server properties).
    pub fn str(s: &str) -> FieldValue {
        FieldValue::LongStr(Bytes::copy_from_slice(s.as_bytes()))
    }

    /// The value as text when it is a long string of UTF-8.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            FieldValue::LongStr(b) | FieldValue::Bytes(b) => std::str::from_utf8(b).ok(),
            _ => None,
        }
    }

    /// The value as a signed integer when it is any integer type.
    pub fn as_i64(&self) -> Option<i64> {
        Some(match *self {
            FieldValue::I8(v) => v as i64,
            FieldValue::U8(v) => v as i64,
            FieldValue::I16(v) => v as i64,
            FieldValue::U16(v) => v as i64,
            FieldValue::I32(v) => v as i64,
            FieldValue::U32(v) => v as i64,
            FieldValue::I64(v) => v,
            FieldValue::U64(v) => i64::try_from(v).ok()?,
            _ => return None,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nested_round_trip() {
        let mut inner = FieldTable::new();
        inner.insert("n", FieldValue::I64(-5));
        let mut t = FieldTable::new();
        t.insert("a", FieldValue::str("x"));
        t.insert(
            "b",
            FieldValue::Array(vec![FieldValue::Bool(true), FieldValue::Void]),
        );
        t.insert("c", FieldValue::Table(inner));
        t.insert("d", FieldValue::Decimal(2, 314));
        let mut buf = BytesMut::new();
        t.encode(&mut buf);
        let b = buf.freeze();
        let mut r = Reader::new(&b);
        assert_eq!(FieldTable::decode(&mut r).expect("decodes"), t);
        assert_eq!(r.remaining(), 0);
    }

    #[test]
    fn unknown_tag_is_an_error() {
        let b = Bytes::from_static(&[0, 0, 0, 3, 1, b'k', b'?']);
        assert_eq!(
            FieldTable::decode(&mut Reader::new(&b)),
            Err(DecodeError::BadFieldType(b'?'))
        );
    }

    #[test]
    fn truncated_table_is_an_error() {
        let b = Bytes::from_static(&[0, 0, 0, 9, 1, b'k']);
        assert!(matches!(
            FieldTable::decode(&mut Reader::new(&b)),
            Err(DecodeError::Truncated(_))
        ));
    }
}

#[cfg(test)]
mod props {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn any_table_round_trips(t in crate::arb::table()) {
            let mut buf = BytesMut::new();
            t.encode(&mut buf);
            let b = buf.freeze();
            let mut r = Reader::new(&b);
            prop_assert_eq!(FieldTable::decode(&mut r).expect("decodes"), t);
            prop_assert_eq!(r.remaining(), 0);
        }
    }
}
