//! A connection's publishers: declared on a stream (named ones deduplicated, see
//! `publishers.rs`), their messages stored through the broker API, confirmed after the
//! stream's fsync.

use std::sync::Arc;
use std::time::Duration;

use bytestring::ByteString;
use warren_broker::access::Perm;
use warren_broker::queue::QueueRef;

use super::Conn;
use crate::frame::*;
use crate::out::Out;
use crate::publishers::{confirm, Dedup, Publisher};

impl Conn {
    pub(super) fn declare_publisher(
        &mut self,
        corr: u32,
        id: u8,
        reference: Option<String>,
        stream: String,
    ) {
        let code = if self.publishers.contains_key(&id) {
            code::PRECONDITION_FAILED
        } else if !self.permitted(Perm::Write, &stream) {
            code::ACCESS_REFUSED
        } else if let Some(QueueRef::Stream(s)) = self.stream(&stream) {
            let dedup = reference.map(|r| Arc::new(Dedup::new(s.clone(), r)));
            self.publishers.insert(id, Publisher { stream, dedup });
            code::OK
        } else {
            code::STREAM_DOES_NOT_EXIST
        };
        self.respond(DECLARE_PUBLISHER, corr, code);
    }

    pub(super) fn query_publisher_sequence(&self, corr: u32, reference: &str, stream: &str) {
        // A live publisher of that reference on this connection knows more than the stream's
        // record (it records every RECORD_EVERY).
        let live = self
            .publishers
            .values()
            .filter(|p| p.stream == stream)
            .filter_map(|p| p.dedup.as_ref())
            .filter(|d| d.reference() == reference)
            .filter_map(|d| d.confirmed())
            .max();
        let (code, seq) = match self.stream(stream) {
            Some(QueueRef::Stream(s)) => (
                code::OK,
                live.or(s.publisher_sequence(reference)).unwrap_or(0),
            ),
            _ => (code::STREAM_DOES_NOT_EXIST, 0),
        };
        self.out.send(|w| {
            w.begin(QUERY_PUBLISHER_SEQUENCE | RESPONSE, 1)
                .u32(corr)
                .u16(code)
                .u64(seq)
                .end()
        });
    }

    pub(super) async fn publish(&mut self, publisher: u8, messages: Vec<Published>) {
        let refuse = |out: &Out, code: u16| {
            out.send(|w| {
                w.begin(PUBLISH_ERROR, 1)
                    .u8(publisher)
                    .u32(messages.len() as u32);
                for m in &messages {
                    w.u64(m.publishing_id).u16(code);
                }
                w.end();
            })
        };
        let Some(p) = self.publishers.get(&publisher) else {
            return refuse(&self.out, code::PUBLISHER_DOES_NOT_EXIST);
        };
        // Routed through the default exchange, a message for a deleted stream would be
        // unroutable, which AMQP confirms; here it is an error, as RabbitMQ's.
        if self.stream(&p.stream).is_none() {
            return refuse(&self.out, code::STREAM_DOES_NOT_EXIST);
        }
        let stream = ByteString::from(p.stream.as_str());
        let dedup = p.dedup.clone();
        let vhost = self.vhost().clone();
        let mut pressured: Vec<QueueRef> = Vec::new();
        for m in messages {
            if let Some(d) = &dedup {
                if d.duplicate(m.publishing_id) {
                    // Stored already: confirmed again, not stored twice (RabbitMQ's answer).
                    self.out
                        .send(|w| confirm(w, publisher, m.publishing_id, true));
                    continue;
                }
            }
            let built = crate::amqp10::to_amqp091(&m.message).and_then(|(mut props, body)| {
                if let Some(v) = &m.filter {
                    // Kept as RabbitMQ 3.13's AMQP 0-9-1 publishers give it.
                    let mut h = props.headers.take().unwrap_or_default();
                    h.0.retain(|(k, _)| &**k != crate::subscription::FILTER_HEADER);
                    h.0.push((
                        crate::subscription::FILTER_HEADER.into(),
                        warren_protocol::FieldValue::str(v),
                    ));
                    props.headers = Some(h);
                }
                warren_broker::vhost::publish::message(
                    ByteString::from_static(""),
                    stream.clone(),
                    props.to_bytes(),
                    body,
                )
                .map_err(|e| e.text.to_string())
            });
            let msg = match built {
                Ok(msg) => msg,
                Err(why) => {
                    tracing::debug!(conn = self.id, why = %why, "unreadable message published");
                    self.out
                        .send(|w| confirm(w, publisher, m.publishing_id, false));
                    continue;
                }
            };
            if let Some(d) = &dedup {
                d.accept(m.publishing_id);
            }
            self.next_seq += 1;
            let seq = self.next_seq;
            self.confirms
                .waiting
                .lock()
                .insert(seq, (publisher, m.publishing_id, dedup.clone()));
            let settled = vhost
                .publish_confirmed(msg, &self.target, seq, &mut self.targets, &mut pressured)
                .unwrap_or(Some(false));
            if let Some(ok) = settled {
                if let Some((_, id, d)) = self.confirms.waiting.lock().remove(&seq) {
                    if let Some(d) = d {
                        d.settled(id, ok);
                    }
                    self.out.send(|w| confirm(w, publisher, id, ok));
                }
            }
        }
        // A stream that falls behind its writes holds this connection's reads (credit flow, as
        // for AMQP publishers).
        for q in pressured {
            q.stall(Duration::from_millis(200)).await;
        }
    }
}
