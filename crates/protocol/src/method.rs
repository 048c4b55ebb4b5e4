//! Every AMQP 0-9-1 method RabbitMQ speaks, generated from the table below. Field names follow the
//! spec (with `type` spelled `kind`); `reserved_*` fields are kept so encode/decode is exact.

use bytes::{BufMut, Bytes, BytesMut};
use bytestring::ByteString;

use crate::codec::{Field, Reader, Writer};
use crate::error::DecodeError;
use crate::table::FieldTable;

macro_rules! methods {
    ($( $variant:ident = ($class:literal, $method:literal, $name:literal) { $($field:ident : $ty:ty),* $(,)? } )*) => {
        $(
            #[derive(Debug, Clone, PartialEq, Default)]
            pub struct $variant { $(pub $field: $ty,)* }

            impl From<$variant> for Method {
                fn from(m: $variant) -> Method { Method::$variant(m) }
            }
        )*

        #[derive(Debug, Clone, PartialEq)]
        pub enum Method { $($variant($variant),)* }

        impl Method {
            /// Decodes a method frame payload (class id, method id, arguments).
            pub fn decode(payload: &Bytes) -> Result<Method, DecodeError> {
                let mut r = Reader::new(payload);
                let class_id = r.u16()?;
                let method_id = r.u16()?;
                match (class_id, method_id) {
                    $( ($class, $method) => {
                        #[allow(unused_variables)]
                        let r = &mut r;
                        Ok(Method::$variant($variant { $($field: <$ty as Field>::read(r)?,)* }))
                    } )*
                    _ => Err(DecodeError::UnknownMethod { class_id, method_id }),
                }
            }

            /// Appends the method payload (ids and arguments) to `buf`.
            pub fn encode_payload(&self, buf: &mut BytesMut) {
                match self {
                    $( Method::$variant(_m) => {
                        buf.put_u16($class);
                        buf.put_u16($method);
                        #[allow(unused_mut, unused_variables)]
                        let mut w = Writer::new(buf);
                        $( _m.$field.write(&mut w); )*
                        w.finish();
                    } )*
                }
            }

            pub fn class_id(&self) -> u16 {
                match self { $( Method::$variant(_) => $class, )* }
            }

            pub fn method_id(&self) -> u16 {
                match self { $( Method::$variant(_) => $method, )* }
            }

            /// The spec name, e.g. `basic.publish`, as RabbitMQ writes it in error texts.
            pub fn name(&self) -> &'static str {
                match self { $( Method::$variant(_) => $name, )* }
            }
        }

        /// Any method, with any field values (for the round-trip property).
        #[cfg(test)]
        pub(crate) fn any_method() -> proptest::strategy::BoxedStrategy<Method> {
            use proptest::strategy::Strategy;
            #[allow(unused_imports)]
            use crate::arb::Arb;
            proptest::strategy::Union::new(vec![
                $(
                    // A leading Just(()) so a method without fields is still a tuple.
                    (proptest::strategy::Just(()), $(<$ty as Arb>::arb(),)*)
                        .prop_map(|(_, $($field,)*)| Method::$variant($variant { $($field,)* }))
                        .boxed(),
                )*
            ])
            .boxed()
        }

        /// The spec name of a class/method id pair, if known.
        pub fn method_name(class_id: u16, method_id: u16) -> Option<&'static str> {
            match (class_id, method_id) { $( ($class, $method) => Some($name), )* _ => None }
        }
    };
}

methods! {
    ConnectionStart = (10, 10, "connection.start") { version_major: u8, version_minor: u8, server_properties: FieldTable, mechanisms: Bytes, locales: Bytes }
    ConnectionStartOk = (10, 11, "connection.start_ok") { client_properties: FieldTable, mechanism: ByteString, response: Bytes, locale: ByteString }
    ConnectionSecure = (10, 20, "connection.secure") { challenge: Bytes }
    ConnectionSecureOk = (10, 21, "connection.secure_ok") { response: Bytes }
    ConnectionTune = (10, 30, "connection.tune") { channel_max: u16, frame_max: u32, heartbeat: u16 }
    ConnectionTuneOk = (10, 31, "connection.tune_ok") { channel_max: u16, frame_max: u32, heartbeat: u16 }
    ConnectionOpen = (10, 40, "connection.open") { virtual_host: ByteString, reserved_1: ByteString, reserved_2: bool }
    ConnectionOpenOk = (10, 41, "connection.open_ok") { reserved_1: ByteString }
    ConnectionClose = (10, 50, "connection.close") { reply_code: u16, reply_text: ByteString, class_id: u16, method_id: u16 }
    ConnectionCloseOk = (10, 51, "connection.close_ok") {}
    ConnectionBlocked = (10, 60, "connection.blocked") { reason: ByteString }
    ConnectionUnblocked = (10, 61, "connection.unblocked") {}
    ConnectionUpdateSecret = (10, 70, "connection.update_secret") { new_secret: Bytes, reason: ByteString }
    ConnectionUpdateSecretOk = (10, 71, "connection.update_secret_ok") {}

    ChannelOpen = (20, 10, "channel.open") { reserved_1: ByteString }
    ChannelOpenOk = (20, 11, "channel.open_ok") { reserved_1: Bytes }
    ChannelFlow = (20, 20, "channel.flow") { active: bool }
    ChannelFlowOk = (20, 21, "channel.flow_ok") { active: bool }
    ChannelClose = (20, 40, "channel.close") { reply_code: u16, reply_text: ByteString, class_id: u16, method_id: u16 }
    ChannelCloseOk = (20, 41, "channel.close_ok") {}

    ExchangeDeclare = (40, 10, "exchange.declare") { reserved_1: u16, exchange: ByteString, kind: ByteString, passive: bool, durable: bool, auto_delete: bool, internal: bool, nowait: bool, arguments: FieldTable }
    ExchangeDeclareOk = (40, 11, "exchange.declare_ok") {}
    ExchangeDelete = (40, 20, "exchange.delete") { reserved_1: u16, exchange: ByteString, if_unused: bool, nowait: bool }
    ExchangeDeleteOk = (40, 21, "exchange.delete_ok") {}
    ExchangeBind = (40, 30, "exchange.bind") { reserved_1: u16, destination: ByteString, source: ByteString, routing_key: ByteString, nowait: bool, arguments: FieldTable }
    ExchangeBindOk = (40, 31, "exchange.bind_ok") {}
    ExchangeUnbind = (40, 40, "exchange.unbind") { reserved_1: u16, destination: ByteString, source: ByteString, routing_key: ByteString, nowait: bool, arguments: FieldTable }
    ExchangeUnbindOk = (40, 51, "exchange.unbind_ok") {}

    QueueDeclare = (50, 10, "queue.declare") { reserved_1: u16, queue: ByteString, passive: bool, durable: bool, exclusive: bool, auto_delete: bool, nowait: bool, arguments: FieldTable }
    QueueDeclareOk = (50, 11, "queue.declare_ok") { queue: ByteString, message_count: u32, consumer_count: u32 }
    QueueBind = (50, 20, "queue.bind") { reserved_1: u16, queue: ByteString, exchange: ByteString, routing_key: ByteString, nowait: bool, arguments: FieldTable }
    QueueBindOk = (50, 21, "queue.bind_ok") {}
    QueuePurge = (50, 30, "queue.purge") { reserved_1: u16, queue: ByteString, nowait: bool }
    QueuePurgeOk = (50, 31, "queue.purge_ok") { message_count: u32 }
    QueueDelete = (50, 40, "queue.delete") { reserved_1: u16, queue: ByteString, if_unused: bool, if_empty: bool, nowait: bool }
    QueueDeleteOk = (50, 41, "queue.delete_ok") { message_count: u32 }
    QueueUnbind = (50, 50, "queue.unbind") { reserved_1: u16, queue: ByteString, exchange: ByteString, routing_key: ByteString, arguments: FieldTable }
    QueueUnbindOk = (50, 51, "queue.unbind_ok") {}

    BasicQos = (60, 10, "basic.qos") { prefetch_size: u32, prefetch_count: u16, global: bool }
    BasicQosOk = (60, 11, "basic.qos_ok") {}
    BasicConsume = (60, 20, "basic.consume") { reserved_1: u16, queue: ByteString, consumer_tag: ByteString, no_local: bool, no_ack: bool, exclusive: bool, nowait: bool, arguments: FieldTable }
    BasicConsumeOk = (60, 21, "basic.consume_ok") { consumer_tag: ByteString }
    BasicCancel = (60, 30, "basic.cancel") { consumer_tag: ByteString, nowait: bool }
    BasicCancelOk = (60, 31, "basic.cancel_ok") { consumer_tag: ByteString }
    BasicPublish = (60, 40, "basic.publish") { reserved_1: u16, exchange: ByteString, routing_key: ByteString, mandatory: bool, immediate: bool }
    BasicReturn = (60, 50, "basic.return") { reply_code: u16, reply_text: ByteString, exchange: ByteString, routing_key: ByteString }
    BasicDeliver = (60, 60, "basic.deliver") { consumer_tag: ByteString, delivery_tag: u64, redelivered: bool, exchange: ByteString, routing_key: ByteString }
    BasicGet = (60, 70, "basic.get") { reserved_1: u16, queue: ByteString, no_ack: bool }
    BasicGetOk = (60, 71, "basic.get_ok") { delivery_tag: u64, redelivered: bool, exchange: ByteString, routing_key: ByteString, message_count: u32 }
    BasicGetEmpty = (60, 72, "basic.get_empty") { reserved_1: ByteString }
    BasicAck = (60, 80, "basic.ack") { delivery_tag: u64, multiple: bool }
    BasicReject = (60, 90, "basic.reject") { delivery_tag: u64, requeue: bool }
    BasicRecoverAsync = (60, 100, "basic.recover_async") { requeue: bool }
    BasicRecover = (60, 110, "basic.recover") { requeue: bool }
    BasicRecoverOk = (60, 111, "basic.recover_ok") {}
    BasicNack = (60, 120, "basic.nack") { delivery_tag: u64, multiple: bool, requeue: bool }

    ConfirmSelect = (85, 10, "confirm.select") { nowait: bool }
    ConfirmSelectOk = (85, 11, "confirm.select_ok") {}

    TxSelect = (90, 10, "tx.select") {}
    TxSelectOk = (90, 11, "tx.select_ok") {}
    TxCommit = (90, 20, "tx.commit") {}
    TxCommitOk = (90, 21, "tx.commit_ok") {}
    TxRollback = (90, 30, "tx.rollback") {}
    TxRollbackOk = (90, 31, "tx.rollback_ok") {}
}

impl Method {
    /// Methods followed by a content header and body frames.
    pub fn has_content(&self) -> bool {
        matches!(
            self,
            Method::BasicPublish(_)
                | Method::BasicReturn(_)
                | Method::BasicDeliver(_)
                | Method::BasicGetOk(_)
        )
    }
}

#[cfg(test)]
mod tests;
