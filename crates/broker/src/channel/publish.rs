//! basic.publish's frames assembled into a message: the method, then a content header, then
//! body frames up to the size the header declared, each checked for order. The whole message
//! goes to [`Channel::publish`] and [`Channel::route`], which stay in `mod.rs` (see there),
//! and a delayed exchange's hold is done here, out of their line.

use bytes::{Bytes, BytesMut};
use warren_protocol::method::BasicPublish;
use warren_protocol::properties::ContentHeader;

use super::{Channel, PublishState};
use crate::error::{AmqpError, AmqpResult};

impl Channel {
    /// basic.publish: its content header and body frames follow.
    pub(super) fn basic_publish(&mut self, p: BasicPublish) -> AmqpResult<()> {
        if p.immediate {
            return Err(AmqpError::not_implemented("immediate=true"));
        }
        self.publish = PublishState::AwaitingHeader(p);
        Ok(())
    }

    /// While a publish is being assembled: what the next frame must be.
    pub fn expecting_content(&self) -> Option<&'static str> {
        match self.publish {
            PublishState::Idle => None,
            PublishState::AwaitingHeader(_) => Some("content header for class 60"),
            PublishState::AwaitingBody { .. } => Some("content body"),
        }
    }

    /// The 505 for a content frame of kind `got` arriving where something else was due.
    pub fn out_of_order(&self, got: &str) -> Option<AmqpError> {
        // Hot path (every header and body frame): compare states, build text only on error.
        let expected = match self.publish {
            PublishState::Idle => "method",
            PublishState::AwaitingHeader(_) => "content header",
            PublishState::AwaitingBody { .. } => "content body",
        };
        if expected == got {
            return None;
        }
        let want = self.expecting_content().unwrap_or("method frame");
        let short = want
            .split(" for")
            .next()
            .unwrap_or(want)
            .trim_end_matches(" frame");
        if short == got {
            return None;
        }
        let e =
            AmqpError::unexpected_frame(format!("expected {want}, got non {short} frame instead"));
        Some(if short == "method" || got == "method" {
            e
        } else {
            e.on(60, 40)
        })
    }

    /// A content header frame arrived.
    pub fn handle_header(
        &mut self,
        payload: &Bytes,
        max_size: u64,
    ) -> AmqpResult<Option<(BasicPublish, ContentHeader, Bytes)>> {
        if let Some(e) = self.out_of_order("content header") {
            return Err(e);
        }
        let PublishState::AwaitingHeader(publish) =
            std::mem::replace(&mut self.publish, PublishState::Idle)
        else {
            return Err(AmqpError::internal_error("publish state"));
        };
        let header = ContentHeader::decode(payload).map_err(|e| {
            AmqpError::frame_error(format!("cannot decode content header: {e}")).on(60, 40)
        })?;
        if header.class_id != 60 {
            return Err(AmqpError::unexpected_frame(format!(
                "expected content header for class 60, got one for class {} instead",
                header.class_id
            ))
            .on(60, 40));
        }
        if header.body_size > max_size {
            return Err(AmqpError::precondition_failed(format!(
                "message size {} is larger than configured max size {}",
                header.body_size, max_size
            ))
            .on(60, 40));
        }
        if header.body_size == 0 {
            return Ok(Some((publish, header, Bytes::new())));
        }
        self.publish = PublishState::AwaitingBody {
            publish,
            header,
            body: BytesMut::new(),
        };
        Ok(None)
    }

    /// A body frame arrived; returns the whole message once complete.
    pub fn handle_body(
        &mut self,
        payload: Bytes,
    ) -> AmqpResult<Option<(BasicPublish, ContentHeader, Bytes)>> {
        if let Some(e) = self.out_of_order("content body") {
            return Err(e);
        }
        let PublishState::AwaitingBody { header, body, .. } = &mut self.publish else {
            return Err(AmqpError::internal_error("publish state"));
        };
        let have = body.len() as u64 + payload.len() as u64;
        if have > header.body_size {
            return Err(AmqpError::frame_error(format!(
                "body larger than the {} bytes its header declared",
                header.body_size
            ))
            .on(60, 40));
        }
        if have < header.body_size {
            body.extend_from_slice(&payload);
            return Ok(None);
        }
        let PublishState::AwaitingBody {
            publish,
            header,
            body,
        } = std::mem::replace(&mut self.publish, PublishState::Idle)
        else {
            return Ok(None);
        };
        // A body in one frame stays a zero-copy slice of the read buffer.
        let whole = if body.is_empty() {
            payload
        } else {
            let mut body = body;
            body.extend_from_slice(&payload);
            body.freeze()
        };
        Ok(Some((publish, header, whole)))
    }
}
