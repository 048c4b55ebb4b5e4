//! Primitive field reader and writer. AMQP packs consecutive `bit` fields into one octet; the
//! reader and writer track that here so method definitions can list fields in spec order.

use bytes::{BufMut, Bytes, BytesMut};
use bytestring::ByteString;

use crate::error::DecodeError;
use crate::table::FieldTable;

/// Reads fields from one method or header payload. Strings are zero-copy slices of `buf`.
pub struct Reader<'a> {
    buf: &'a Bytes,
    pos: usize,
    /// The octet holding packed bits and the next bit index (8 = none pending).
    bits: u8,
    bit_idx: u8,
}

impl<'a> Reader<'a> {
    pub fn new(buf: &'a Bytes) -> Self {
        Reader {
            buf,
            pos: 0,
            bits: 0,
            bit_idx: 8,
        }
    }

    pub fn remaining(&self) -> usize {
        self.buf.len() - self.pos
    }

    fn take(&mut self, n: usize, what: &'static str) -> Result<&'a [u8], DecodeError> {
        self.bit_idx = 8;
        if self.remaining() < n {
            return Err(DecodeError::Truncated(what));
        }
        let s = &self.buf[self.pos..self.pos + n];
        self.pos += n;
        Ok(s)
    }

    fn take_bytes(&mut self, n: usize, what: &'static str) -> Result<Bytes, DecodeError> {
        self.take(n, what)?;
        Ok(self.buf.slice(self.pos - n..self.pos))
    }

    pub fn u8(&mut self) -> Result<u8, DecodeError> {
        Ok(self.take(1, "octet")?[0])
    }
    pub fn u16(&mut self) -> Result<u16, DecodeError> {
        let b = self.take(2, "short")?;
        Ok(u16::from_be_bytes([b[0], b[1]]))
    }
    pub fn u32(&mut self) -> Result<u32, DecodeError> {
        let b = self.take(4, "long")?;
        Ok(u32::from_be_bytes([b[0], b[1], b[2], b[3]]))
    }
    pub fn u64(&mut self) -> Result<u64, DecodeError> {
        let b = self.take(8, "longlong")?;
        let mut a = [0u8; 8];
        a.copy_from_slice(b);
        Ok(u64::from_be_bytes(a))
    }
    pub fn bit(&mut self) -> Result<bool, DecodeError> {
        if self.bit_idx >= 8 {
            let b = self.u8()?;
            self.bits = b;
            self.bit_idx = 0;
        }
        let v = self.bits & (1 << self.bit_idx) != 0;
        self.bit_idx += 1;
        Ok(v)
    }
    pub fn short_str(&mut self) -> Result<ByteString, DecodeError> {
        let n = self.u8()? as usize;
        let b = self.take_bytes(n, "shortstr")?;
        ByteString::try_from(b).map_err(|_| DecodeError::BadUtf8)
    }
    pub fn long_bytes(&mut self) -> Result<Bytes, DecodeError> {
        let n = self.u32()? as usize;
        self.take_bytes(n, "longstr")
    }
    pub fn table(&mut self) -> Result<FieldTable, DecodeError> {
        FieldTable::decode(self)
    }
    /// Raw bytes of a table, without decoding it (used to skip over headers).
    pub fn raw(&mut self, n: usize, what: &'static str) -> Result<Bytes, DecodeError> {
        self.take_bytes(n, what)
    }
}

/// Writes fields into a buffer. Pending bits are flushed before any other field and by `finish`.
pub struct Writer<'a> {
    pub buf: &'a mut BytesMut,
    bits: u8,
    bit_idx: u8,
}

impl<'a> Writer<'a> {
    pub fn new(buf: &'a mut BytesMut) -> Self {
        Writer {
            buf,
            bits: 0,
            bit_idx: 0,
        }
    }
    fn flush_bits(&mut self) {
        if self.bit_idx > 0 {
            self.buf.put_u8(self.bits);
            self.bits = 0;
            self.bit_idx = 0;
        }
    }
    pub fn finish(&mut self) {
        self.flush_bits();
    }
    pub fn u8(&mut self, v: u8) {
        self.flush_bits();
        self.buf.put_u8(v);
    }
    pub fn u16(&mut self, v: u16) {
        self.flush_bits();
        self.buf.put_u16(v);
    }
    pub fn u32(&mut self, v: u32) {
        self.flush_bits();
        self.buf.put_u32(v);
    }
    pub fn u64(&mut self, v: u64) {
        self.flush_bits();
        self.buf.put_u64(v);
    }
    pub fn bit(&mut self, v: bool) {
        if self.bit_idx == 8 {
            self.flush_bits();
        }
        if v {
            self.bits |= 1 << self.bit_idx;
        }
        self.bit_idx += 1;
    }
    /// Short strings longer than 255 bytes are truncated at a char boundary: the spec cannot carry
    /// them, and the broker only ever echoes names it accepted (which are at most 255 bytes).
    pub fn short_str(&mut self, v: &str) {
        self.flush_bits();
        let mut n = v.len().min(255);
        while !v.is_char_boundary(n) {
            n -= 1;
        }
        self.buf.put_u8(n as u8);
        self.buf.put_slice(&v.as_bytes()[..n]);
    }
    pub fn long_bytes(&mut self, v: &[u8]) {
        self.flush_bits();
        self.buf.put_u32(v.len() as u32);
        self.buf.put_slice(v);
    }
    pub fn table(&mut self, t: &FieldTable) {
        self.flush_bits();
        t.encode(self.buf);
    }
}

/// One method field type. Implemented for the spec's domains so the method macro can stay generic.
pub trait Field: Sized {
    fn read(r: &mut Reader<'_>) -> Result<Self, DecodeError>;
    fn write(&self, w: &mut Writer<'_>);
}

impl Field for u8 {
    fn read(r: &mut Reader<'_>) -> Result<Self, DecodeError> {
        r.u8()
    }
    fn write(&self, w: &mut Writer<'_>) {
        w.u8(*self)
    }
}
impl Field for u16 {
    fn read(r: &mut Reader<'_>) -> Result<Self, DecodeError> {
        r.u16()
    }
    fn write(&self, w: &mut Writer<'_>) {
        w.u16(*self)
    }
}
impl Field for u32 {
    fn read(r: &mut Reader<'_>) -> Result<Self, DecodeError> {
        r.u32()
    }
    fn write(&self, w: &mut Writer<'_>) {
        w.u32(*self)
    }
}
impl Field for u64 {
    fn read(r: &mut Reader<'_>) -> Result<Self, DecodeError> {
        r.u64()
    }
    fn write(&self, w: &mut Writer<'_>) {
        w.u64(*self)
    }
}
impl Field for bool {
    fn read(r: &mut Reader<'_>) -> Result<Self, DecodeError> {
        r.bit()
    }
    fn write(&self, w: &mut Writer<'_>) {
        w.bit(*self)
    }
}
impl Field for ByteString {
    fn read(r: &mut Reader<'_>) -> Result<Self, DecodeError> {
        r.short_str()
    }
    fn write(&self, w: &mut Writer<'_>) {
        w.short_str(self)
    }
}
/// The spec's `longstr`: arbitrary octets.
impl Field for Bytes {
    fn read(r: &mut Reader<'_>) -> Result<Self, DecodeError> {
        r.long_bytes()
    }
    fn write(&self, w: &mut Writer<'_>) {
        w.long_bytes(self)
    }
}
impl Field for FieldTable {
    fn read(r: &mut Reader<'_>) -> Result<Self, DecodeError> {
        r.table()
    }
    fn write(&self, w: &mut Writer<'_>) {
        w.table(self)
    }
}
