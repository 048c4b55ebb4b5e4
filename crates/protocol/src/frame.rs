//! Frames: a 7-octet header (type, channel, size), the payload, and the 0xCE end octet.
//! Decoding checks that a whole frame is buffered before it slices anything (mini-redis's
//! check-then-parse); `Ok(None)` means "read more", never an error.

use bytes::{Buf, BufMut, Bytes, BytesMut};

use crate::error::DecodeError;

pub const FRAME_METHOD: u8 = 1;
pub const FRAME_HEADER: u8 = 2;
pub const FRAME_BODY: u8 = 3;
pub const FRAME_HEARTBEAT: u8 = 8;
pub const FRAME_END: u8 = 0xCE;
/// Header (7) plus end octet (1).
pub const FRAME_OVERHEAD: usize = 8;
/// The most the decoder reserves ahead for a frame still arriving: a header alone must not make
/// the broker allocate what its size field claims (up to 4 GiB with frame_max 0).
pub const RESERVE_AHEAD_MAX: usize = 256 * 1024;
/// The smallest frame_max a peer may negotiate (spec: 4096).
pub const FRAME_MIN_SIZE: u32 = 4096;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FrameKind {
    Method,
    Header,
    Body,
    Heartbeat,
    /// A frame type outside the spec; the connection answers 501 naming it.
    Other(u8),
}

/// One frame; the payload is a zero-copy slice of the read buffer.
#[derive(Debug, Clone, PartialEq)]
pub struct Frame {
    pub kind: FrameKind,
    pub channel: u16,
    pub payload: Bytes,
}

/// Splits a byte stream into frames, enforcing `frame_max` (0 = no limit, as before tune-ok).
#[derive(Debug, Clone)]
pub struct FrameDecoder {
    pub frame_max: u32,
}

impl FrameDecoder {
    pub fn new(frame_max: u32) -> Self {
        FrameDecoder { frame_max }
    }

    /// Takes one whole frame off the front of `buf`, or returns `Ok(None)` if more bytes are needed.
    pub fn decode(&self, buf: &mut BytesMut) -> Result<Option<Frame>, DecodeError> {
        if buf.len() < 7 {
            return Ok(None);
        }
        let kind = match buf[0] {
            FRAME_METHOD => FrameKind::Method,
            FRAME_HEADER => FrameKind::Header,
            FRAME_BODY => FrameKind::Body,
            FRAME_HEARTBEAT => FrameKind::Heartbeat,
            t => FrameKind::Other(t),
        };
        let channel = u16::from_be_bytes([buf[1], buf[2]]);
        let size = u32::from_be_bytes([buf[3], buf[4], buf[5], buf[6]]);
        // RabbitMQ refuses a payload over frame_max (not a frame over it: up to 8 octets more
        // pass there), so clients tuned against it work here too.
        if self.frame_max != 0 && size > self.frame_max {
            return Err(DecodeError::FrameTooLarge {
                kind: buf[0],
                payload: size,
                max: self.frame_max,
            });
        }
        let total = 7 + size as usize + 1;
        if buf.len() < total {
            buf.reserve((total - buf.len()).min(RESERVE_AHEAD_MAX));
            return Ok(None);
        }
        let end = buf[total - 1];
        if end != FRAME_END {
            return Err(DecodeError::BadFrameEnd(end));
        }
        buf.advance(7);
        let payload = buf.split_to(size as usize).freeze();
        buf.advance(1);
        Ok(Some(Frame {
            kind,
            channel,
            payload,
        }))
    }
}

/// Writes a frame header with a size placeholder; returns the offset to patch with `end_frame`.
pub fn begin_frame(buf: &mut BytesMut, kind: u8, channel: u16) -> usize {
    buf.put_u8(kind);
    buf.put_u16(channel);
    let at = buf.len();
    buf.put_u32(0);
    at
}

/// Patches the size written by `begin_frame` and appends the end octet.
pub fn end_frame(buf: &mut BytesMut, size_at: usize) {
    let size = (buf.len() - size_at - 4) as u32;
    buf[size_at..size_at + 4].copy_from_slice(&size.to_be_bytes());
    buf.put_u8(FRAME_END);
}

/// Encodes a whole method frame.
pub fn write_method(buf: &mut BytesMut, channel: u16, method: &crate::Method) {
    let at = begin_frame(buf, FRAME_METHOD, channel);
    method.encode_payload(buf);
    end_frame(buf, at);
}

pub fn write_heartbeat(buf: &mut BytesMut) {
    buf.put_slice(&[FRAME_HEARTBEAT, 0, 0, 0, 0, 0, 0, FRAME_END]);
}

/// Encodes a content header frame around raw property bytes (flags included), sent back verbatim.
pub fn write_content_header(
    buf: &mut BytesMut,
    channel: u16,
    class_id: u16,
    body_size: u64,
    raw_properties: &[u8],
) {
    let at = begin_frame(buf, FRAME_HEADER, channel);
    buf.put_u16(class_id);
    buf.put_u16(0);
    buf.put_u64(body_size);
    buf.put_slice(raw_properties);
    end_frame(buf, at);
}

/// Writes the 7-octet header of a body frame of `len` bytes; the caller appends the body and
/// then the end octet (so a large body can go out as its own `Bytes` in a vectored write).
pub fn write_body_frame_header(buf: &mut BytesMut, channel: u16, len: usize) {
    buf.put_u8(FRAME_BODY);
    buf.put_u16(channel);
    buf.put_u32(len as u32);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn partial_frame_needs_more() {
        let mut b = BytesMut::from(&[1u8, 0, 1, 0, 0, 0, 4, 0, 10][..]);
        assert_eq!(FrameDecoder::new(0).decode(&mut b), Ok(None));
        assert_eq!(b.len(), 9, "nothing consumed");
    }

    #[test]
    fn bad_end_octet() {
        let mut b = BytesMut::from(&[8u8, 0, 0, 0, 0, 0, 0, 0xCD][..]);
        assert_eq!(
            FrameDecoder::new(0).decode(&mut b),
            Err(DecodeError::BadFrameEnd(0xCD))
        );
    }

    #[test]
    fn too_large_rejected_before_buffered() {
        let mut b = BytesMut::from(&[3u8, 0, 1, 0, 1, 0, 0][..]);
        assert!(matches!(
            FrameDecoder::new(4096).decode(&mut b),
            Err(DecodeError::FrameTooLarge { .. })
        ));
        // RabbitMQ's rule and words: the payload is compared with frame_max.
        let mut b = BytesMut::from(&[3u8, 0, 1, 0, 0, 0x10, 0x01][..]);
        let e = FrameDecoder::new(4096)
            .decode(&mut b)
            .expect_err("4097 > 4096");
        assert_eq!(
            e.to_string(),
            "type 3, all octets = <<>>: {frame_too_large,4097,4088}"
        );
        let mut b = BytesMut::from(&[3u8, 0, 1, 0, 0, 0x10, 0x00][..]);
        assert_eq!(
            FrameDecoder::new(4096).decode(&mut b),
            Ok(None),
            "4096 fits"
        );
    }

    #[test]
    fn unknown_type_is_framed_for_the_caller_to_refuse() {
        let mut b = BytesMut::from(&[9u8, 0, 0, 0, 0, 0, 0, 0xCE][..]);
        assert_eq!(
            FrameDecoder::new(0)
                .decode(&mut b)
                .expect("framed")
                .map(|f| f.kind),
            Some(FrameKind::Other(9))
        );
    }

    #[test]
    fn chunked_input_yields_same_frames() {
        let mut whole = BytesMut::new();
        write_heartbeat(&mut whole);
        write_content_header(&mut whole, 3, 60, 5, &[0, 0]);
        let bytes = whole.freeze();
        for split in 0..bytes.len() {
            let dec = FrameDecoder::new(0);
            let mut buf = BytesMut::new();
            let mut got = Vec::new();
            for chunk in [&bytes[..split], &bytes[split..]] {
                buf.extend_from_slice(chunk);
                while let Some(f) = dec.decode(&mut buf).expect("valid") {
                    got.push(f);
                }
            }
            assert_eq!(got.len(), 2, "split at {split}");
            assert_eq!(got[1].channel, 3);
        }
    }
}
