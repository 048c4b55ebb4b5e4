use thiserror::Error;

/// Why a frame or method could not be decoded. Each maps to one connection-level reply code.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum DecodeError {
    /// A field ran past the end of the method payload (502 SYNTAX_ERROR).
    #[error("truncated payload while reading {0}")]
    Truncated(&'static str),
    /// A short string that is not UTF-8 (502).
    #[error("invalid UTF-8 in a short string")]
    BadUtf8,
    /// A field table value with an unknown type tag (502).
    #[error("unknown field value type {0:#04x}")]
    BadFieldType(u8),
    /// Field tables or arrays nested deeper than `table::MAX_NESTING` (502).
    #[error("field tables nested deeper than {} levels", crate::table::MAX_NESTING)]
    TooDeep,
    /// A class/method id pair this server does not know (540 NOT_IMPLEMENTED).
    #[error("unknown method {class_id}/{method_id}")]
    UnknownMethod { class_id: u16, method_id: u16 },
    /// A frame whose last octet is not 0xCE (501 FRAME_ERROR).
    #[error("bad frame end octet {0:#04x}")]
    BadFrameEnd(u8),
    /// A frame whose payload is larger than the negotiated frame_max (501), in RabbitMQ's
    /// words: it compares the payload, not the whole frame, and names frame_max less 8.
    #[error("type {kind}, all octets = <<>>: {{frame_too_large,{payload},{}}}", max.saturating_sub(8))]
    FrameTooLarge { kind: u8, payload: u32, max: u32 },
}
