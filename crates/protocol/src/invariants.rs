//! What the decoders must hold for any input whatever, as executable checks. The fuzz targets
//! (`fuzz/`) call these on generated input and the regression tests
//! (`tests/fuzz_regressions.rs`) on every input a fuzzer ever crashed, so both check the same
//! thing. Each function panics when an invariant breaks; a decoder returning an error is fine.

use bytes::{Bytes, BytesMut};

use crate::codec::Reader;
use crate::properties::{delivery_mode, BasicProperties, ContentHeader};
use crate::{DecodeError, Frame, FrameDecoder, Method};

/// The frame decoder, fed `data[2..]` whole and in chunks of `1 + data[1]` octets, with a
/// frame_max chosen by `data[0]`: never panics, yields the same frames however the input is
/// split, and never reserves much beyond what arrived, whatever a header claims.
pub fn frame_decode(data: &[u8]) {
    if data.len() < 3 {
        return;
    }
    let frame_max = match data[0] % 4 {
        0 => 0,
        1 => 4096,
        2 => 131_072,
        _ => u32::MAX,
    };
    let chunk = 1 + data[1] as usize;
    let input = &data[2..];
    let dec = FrameDecoder::new(frame_max);
    let whole = decode_all(&dec, &[input], input.len());
    let pieces: Vec<&[u8]> = input.chunks(chunk).collect();
    let chunked = decode_all(&dec, &pieces, input.len());
    assert_eq!(whole, chunked, "chunked input decoded differently");
}

fn decode_all(
    dec: &FrameDecoder,
    pieces: &[&[u8]],
    fed: usize,
) -> (Vec<Frame>, Option<DecodeError>) {
    let mut buf = BytesMut::new();
    let mut frames = Vec::new();
    for p in pieces {
        buf.extend_from_slice(p);
        loop {
            let r = dec.decode(&mut buf);
            assert!(
                buf.capacity() <= 4 * (fed + crate::frame::RESERVE_AHEAD_MAX),
                "decoder reserved {} octets for {fed} octets of input",
                buf.capacity()
            );
            match r {
                Ok(Some(f)) => frames.push(f),
                Ok(None) => break,
                Err(e) => return (frames, Some(e)),
            }
        }
    }
    (frames, None)
}

/// A method payload: decoding never panics, and what decodes re-encodes to a payload that
/// decodes to the same method.
pub fn method_decode(data: &[u8]) {
    let payload = Bytes::copy_from_slice(data);
    if let Ok(m) = Method::decode(&payload) {
        let mut buf = BytesMut::new();
        m.encode_payload(&mut buf);
        let again = Method::decode(&buf.freeze()).expect("a re-encoded method decodes");
        // Debug, not ==: a float in a table may be NaN.
        assert_eq!(format!("{again:?}"), format!("{m:?}"), "{}", m.name());
    }
}

/// A field table (length-prefixed): decoding never panics or overflows the stack, and a
/// decoded table re-encodes to octets that decode and re-encode identically.
pub fn field_table(data: &[u8]) {
    let b = Bytes::copy_from_slice(data);
    if let Ok(t) = Reader::new(&b).table() {
        let mut out = BytesMut::new();
        t.encode(&mut out);
        let out = out.freeze();
        let again = Reader::new(&out)
            .table()
            .expect("a re-encoded table decodes");
        let mut out2 = BytesMut::new();
        again.encode(&mut out2);
        assert_eq!(out, out2.freeze());
    }
}

/// A content header payload, and the same octets as raw properties: decoding never panics, the
/// fast `delivery_mode` reader agrees with the full decoder, and properties re-encode losslessly.
pub fn content_header(data: &[u8]) {
    let payload = Bytes::copy_from_slice(data);
    if let Ok(h) = ContentHeader::decode(&payload) {
        properties(&h.raw_properties);
    }
    properties(&payload);
}

fn properties(raw: &Bytes) {
    let fast = delivery_mode(raw);
    if let Ok(p) = BasicProperties::decode(raw) {
        assert_eq!(fast, p.delivery_mode, "fast delivery_mode reader disagrees");
        let mut out = BytesMut::new();
        p.encode(&mut out);
        let again = BasicProperties::decode(&out.freeze()).expect("re-encoded properties decode");
        assert_eq!(format!("{again:?}"), format!("{p:?}"));
    }
}
