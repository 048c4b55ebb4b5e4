use super::*;
use crate::table::FieldValue;

fn round_trip(m: Method) {
    let mut buf = BytesMut::new();
    m.encode_payload(&mut buf);
    let b = buf.freeze();
    assert_eq!(Method::decode(&b).expect("decodes"), m, "{}", m.name());
}

#[test]
fn bits_pack_into_one_octet() {
    let m = Method::QueueDeclare(QueueDeclare {
        queue: "q".into(),
        passive: false,
        durable: true,
        exclusive: false,
        auto_delete: true,
        nowait: true,
        ..Default::default()
    });
    let mut buf = BytesMut::new();
    m.encode_payload(&mut buf);
    // class, method, reserved short, "q", bits, empty table
    assert_eq!(
        &buf[..],
        &[0, 50, 0, 10, 0, 0, 1, b'q', 0b11010, 0, 0, 0, 0]
    );
    round_trip(m);
}

#[test]
fn unknown_method() {
    let b = Bytes::from_static(&[0, 60, 0, 99]);
    assert_eq!(
        Method::decode(&b),
        Err(DecodeError::UnknownMethod {
            class_id: 60,
            method_id: 99
        })
    );
}

#[test]
fn truncated_method() {
    let b = Bytes::from_static(&[0, 60, 0, 40, 0, 0, 5, b'a']);
    assert!(matches!(Method::decode(&b), Err(DecodeError::Truncated(_))));
}

#[test]
fn samples_round_trip() {
    let mut t = FieldTable::new();
    t.insert("x-match", FieldValue::str("any"));
    round_trip(
        BasicDeliver {
            consumer_tag: "c".into(),
            delivery_tag: 7,
            redelivered: true,
            exchange: "e".into(),
            routing_key: "k".into(),
        }
        .into(),
    );
    round_trip(
        BasicNack {
            delivery_tag: u64::MAX,
            multiple: true,
            requeue: false,
        }
        .into(),
    );
    round_trip(
        ExchangeBind {
            destination: "d".into(),
            source: "s".into(),
            routing_key: "#".into(),
            nowait: true,
            arguments: t,
            ..Default::default()
        }
        .into(),
    );
    round_trip(
        ConnectionTune {
            channel_max: 2047,
            frame_max: 131072,
            heartbeat: 60,
        }
        .into(),
    );
    round_trip(TxRollbackOk {}.into());
}

/// Our encoding must be what a third-party codec (amq-protocol, lapin's) decodes, method by method.
#[test]
fn third_party_codec_agrees() {
    use amq_protocol::frame::{parse_frame, AMQPFrame};
    let methods: Vec<Method> = vec![
        BasicPublish {
            exchange: "ex".into(),
            routing_key: "rk".into(),
            mandatory: true,
            ..Default::default()
        }
        .into(),
        BasicDeliver {
            consumer_tag: "ctag".into(),
            delivery_tag: 99,
            redelivered: true,
            exchange: "ex".into(),
            routing_key: "rk".into(),
        }
        .into(),
        QueueDeclareOk {
            queue: "amq.gen-x".into(),
            message_count: 3,
            consumer_count: 1,
        }
        .into(),
        ExchangeUnbindOk {}.into(),
        BasicGetOk {
            delivery_tag: 1,
            redelivered: false,
            exchange: "".into(),
            routing_key: "q".into(),
            message_count: 5,
        }
        .into(),
        ConnectionClose {
            reply_code: 404,
            reply_text: "NOT_FOUND - x".into(),
            class_id: 50,
            method_id: 10,
        }
        .into(),
        BasicNack {
            delivery_tag: 3,
            multiple: true,
            requeue: true,
        }
        .into(),
        ConfirmSelectOk {}.into(),
    ];
    for m in methods {
        let mut buf = BytesMut::new();
        crate::frame::write_method(&mut buf, 1, &m);
        let parsed = parse_frame(&buf[..])
            .unwrap_or_else(|e| panic!("{} rejected by amq-protocol: {e:?}", m.name()));
        let AMQPFrame::Method(ch, class) = parsed.1 else {
            panic!("not a method frame")
        };
        assert_eq!(ch, 1);
        let dbg = format!("{class:?}").to_lowercase();
        let short = m
            .name()
            .split('.')
            .nth(1)
            .unwrap_or_default()
            .replace('_', "");
        assert!(
            dbg.replace('_', "").contains(&short),
            "{} decoded as {dbg}",
            m.name()
        );
    }
}

proptest::proptest! {
    // About 30 cases per method: the strategy picks one of ~60 methods per case.
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(2048))]
    /// Every method, with any field values, decodes to what was encoded (and nothing is left).
    #[test]
    fn every_method_round_trips(m in any_method()) {
        let mut buf = BytesMut::new();
        m.encode_payload(&mut buf);
        let b = buf.freeze();
        proptest::prop_assert_eq!(Method::decode(&b).expect("decodes"), m.clone());
        // And framed, through the frame decoder.
        let mut framed = BytesMut::new();
        crate::frame::write_method(&mut framed, 9, &m);
        let f = crate::FrameDecoder::new(0).decode(&mut framed).expect("frames").expect("whole");
        proptest::prop_assert_eq!(Method::decode(&f.payload).expect("decodes"), m);
        proptest::prop_assert!(framed.is_empty());
    }
}
