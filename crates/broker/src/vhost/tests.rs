//! Tests of how a vhost makes a definitions change: proposed through its [`Proposer`] (a
//! cluster's, or a single node's applier) and made here (and journaled) when applied.

use std::sync::Arc;

use bytes::Bytes;
use warren_protocol::{FieldTable, Method};

use super::{ClusterNode, ExchangeSpec, QueueSpec, Storage, VHost};
use crate::definitions::op::{Applying, DefOp, DefReply, QueueMeta};
use crate::definitions::proposer::tests::FakeProposer;
use crate::definitions::proposer::{Proposal, Proposer};
use crate::error::AmqpResult;
use crate::persist::Persister;
use crate::queue::{QueueOptions, QueueRef};

/// A one-node cluster that records what it is asked to propose and applies nothing.
struct FakeNode(Arc<FakeProposer>);

impl Proposer for FakeNode {
    fn propose(&self, op: DefOp) -> Proposal<'_> {
        self.0.propose(op)
    }
}

impl ClusterNode for FakeNode {
    fn me(&self) -> &str {
        "a"
    }
    fn place(&self, _locator: Option<&str>) -> String {
        "a".into()
    }
    fn members(
        &self,
        _home: &str,
        _arguments: &FieldTable,
        _exclusive: bool,
        _policy: &dyn Fn() -> Option<serde_json::Map<String, serde_json::Value>>,
    ) -> AmqpResult<Vec<String>> {
        Ok(Vec::new())
    }
    fn replicated_queue(
        self: Arc<Self>,
        _: Arc<str>,
        _: &Arc<VHost>,
        _: QueueOptions,
        _: u64,
        _: Vec<String>,
    ) -> QueueRef {
        unreachable!("no replicated queue here")
    }
    fn stream_member(
        self: Arc<Self>,
        _: &Arc<crate::queue::stream::Stream>,
        _: u64,
        _: Vec<String>,
    ) -> AmqpResult<()> {
        unreachable!("no replicated stream here")
    }
    fn remote_queue(
        self: Arc<Self>,
        _: Arc<str>,
        _: Arc<str>,
        _: QueueOptions,
        _: String,
    ) -> QueueRef {
        unreachable!("every queue lives here")
    }
    fn first_leader(&self, _q: &QueueRef) -> AmqpResult<()> {
        Ok(())
    }
}

fn storage(test: &str) -> Storage {
    let dir = std::env::temp_dir().join(format!("warren-vhost-{test}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    Storage {
        dir,
        persister: Persister::start(),
        quorum_on_machine: None,
    }
}

fn exchange(name: &str) -> ExchangeSpec<'_> {
    static NO_ARGS: std::sync::LazyLock<FieldTable> = std::sync::LazyLock::new(FieldTable::new);
    ExchangeSpec {
        name,
        kind: "direct",
        passive: false,
        durable: true,
        auto_delete: false,
        internal: false,
        arguments: &NO_ARGS,
    }
}

/// A durable queue's declare, as connection 1 asks for it.
pub(crate) fn queue<'a>(name: &'a str, args: &'a FieldTable) -> QueueSpec<'a> {
    QueueSpec {
        name,
        passive: false,
        durable: true,
        exclusive: false,
        auto_delete: false,
        arguments: args,
        conn_id: 1,
        server_named: false,
        home: None,
        members: None,
    }
}

fn method(op: &DefOp) -> (Method, Option<&QueueMeta>) {
    match op {
        DefOp::Vhost { method, queue, .. } => (
            Method::decode(&Bytes::copy_from_slice(method)).expect("a method"),
            queue.as_ref(),
        ),
        other => panic!("not a vhost op: {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_nodes_change_is_proposed_and_made_when_applied() {
    let p = FakeProposer::new();
    let s = storage("cluster");
    let (dir, persister) = (s.dir.clone(), s.persister.clone());
    let v = VHost::clustered("/", s, Arc::new(FakeNode(p.clone()))).unwrap();
    let args = FieldTable::new();

    // Asked for here: proposed, not made (the fake applies nothing).
    v.declare_exchange(&exchange("x")).unwrap();
    assert!(v.declare_queue(&queue("q", &args)).is_err(), "not made");
    let ops: Vec<DefOp> = std::mem::take(&mut *p.ops.lock());
    assert_eq!(ops.len(), 2);
    let (declare_x, _) = method(&ops[0]);
    assert!(matches!(&declare_x, Method::ExchangeDeclare(x) if x.exchange == "x"));
    let (declare_q, meta) = method(&ops[1]);
    assert!(matches!(&declare_q, Method::QueueDeclare(q) if q.queue == "q" && q.durable));
    let meta = meta.expect("a queue.declare names the queue's home");
    assert_eq!((meta.home.as_str(), meta.group), ("a", None));
    assert!(v.snapshot().queues.is_empty());
    assert!(!v.snapshot().table.exchanges.contains_key("x"));

    // Applied (what the state machine does with the committed entries): made here, not
    // proposed again; the queue's log is named after the entry's index.
    v.apply_method(&declare_x, None, Applying::entry(41))
        .unwrap();
    v.apply_method(&declare_q, Some(meta), Applying::entry(42))
        .unwrap();
    assert!(p.ops.lock().is_empty(), "an applied change is not proposed");
    assert!(v.snapshot().table.exchanges.contains_key("x"));
    let q = v.snapshot().queues.get("q").cloned().expect("declared");
    assert_eq!(q.store_id(), Some(42));
    assert!(dir.join("queues").join(format!("{:016x}", 42)).is_dir());

    // A delete asked for here is proposed too; applied, it deletes.
    v.delete_queue("q", false, false, None).unwrap();
    let ops: Vec<DefOp> = std::mem::take(&mut *p.ops.lock());
    let (delete_q, _) = method(&ops[0]);
    assert!(matches!(&delete_q, Method::QueueDelete(d) if d.queue == "q"));
    assert!(v.snapshot().queues.contains_key("q"));
    v.apply_method(&delete_q, None, Applying::entry(43))
        .unwrap();
    assert!(!v.snapshot().queues.contains_key("q"));
    assert!(p.ops.lock().is_empty());
    persister.stop();
    let _ = std::fs::remove_dir_all(&dir);
}

/// A single node's applier, as `server/apply.rs`'s: records each change and makes it at once
/// through [`VHost::apply_method`].
struct Applier {
    v: std::sync::OnceLock<std::sync::Weak<VHost>>,
    ops: parking_lot::Mutex<Vec<DefOp>>,
}

impl Proposer for Applier {
    fn propose(&self, op: DefOp) -> Proposal<'_> {
        let r = self.propose_blocking(op);
        Box::pin(async move { r })
    }
    fn propose_blocking(&self, op: DefOp) -> Result<DefReply, String> {
        let v = self.v.get().and_then(|v| v.upgrade()).ok_or("no vhost")?;
        let (m, meta) = method(&op);
        let (m, meta) = (m, meta.cloned());
        self.ops.lock().push(op);
        Ok(match v.apply_method(&m, meta.as_ref(), Applying::LOCAL) {
            Ok(Some(message_count)) => DefReply::Deleted { message_count },
            r => DefReply::amqp(r.map(|_| ())),
        })
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_single_node_applies_its_change_at_once_and_journals_it() {
    let s = storage("single");
    let (dir, persister) = (s.dir.clone(), s.persister.clone());
    let v = VHost::open("/", s).unwrap();
    let applier = Arc::new(Applier {
        v: Default::default(),
        ops: Default::default(),
    });
    let _ = applier.v.set(Arc::downgrade(&v));
    v.set_proposer(applier.clone());
    let args = FieldTable::new();
    v.declare_exchange(&exchange("x")).unwrap();
    let q = v.declare_queue(&queue("q", &args)).unwrap();
    let q2 = v.declare_queue(&queue("q2", &args)).unwrap();
    v.bind_queue("q", "x", "k", &args, true, None).unwrap();
    let kinds: Vec<String> = applier
        .ops
        .lock()
        .iter()
        .map(|op| {
            format!("{:?}", method(op).0)
                .split('(')
                .next()
                .unwrap()
                .to_string()
        })
        .collect();
    assert_eq!(
        kinds,
        [
            "ExchangeDeclare",
            "QueueDeclare",
            "QueueDeclare",
            "QueueBind"
        ],
        "each change goes through the applier as one command"
    );
    // With no entry to name them, durable queues' logs get fresh ids.
    let (id, id2) = (q.store_id().unwrap(), q2.store_id().unwrap());
    assert!(id != id2 && id != 0, "{id} {id2}");
    assert!(dir.join("queues").join(format!("{id:016x}")).is_dir());
    // Redeclaring what exists is not a change.
    v.declare_queue(&queue("q", &args)).unwrap();
    assert_eq!(applier.ops.lock().len(), 4);
    // A delete answers the count the delete itself found.
    for _ in 0..2 {
        q2.publish(
            Arc::new(crate::message::Message {
                exchange: "".into(),
                routing_key: "q2".into(),
                properties: warren_protocol::properties::BasicProperties::default().to_bytes(),
                body: Bytes::from_static(b"m"),
                persistent: false,
                priority: None,
                expiration_ms: None,
                forwarded: crate::message::Forwarded::NONE,
            }),
            None,
        );
    }
    let d = v.delete_queue("q2", false, false, None).unwrap();
    assert_eq!(d.message_count, 2);
    assert!(!v.snapshot().queues.contains_key("q2"));
    drop((q, q2, v));
    // What a restart replays: the journal has them.
    let again = VHost::open(
        "/",
        Storage {
            dir: dir.clone(),
            persister: persister.clone(),
            quorum_on_machine: None,
        },
    )
    .unwrap();
    let snap = again.snapshot();
    assert!(snap.queues.contains_key("q") && !snap.queues.contains_key("q2"));
    assert_eq!(snap.queues["q"].store_id(), Some(id), "the same log again");
    assert_eq!(snap.table.exchanges["x"].bindings.len(), 1);
    drop(snap);
    drop(again);
    persister.stop();
    let _ = std::fs::remove_dir_all(&dir);
}

/// Publishing through the vhost, as any front end does: routed by key, unroutable, and to a
/// queue that refuses it (a nack for a wanted confirm).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_publish_is_routed_returned_or_refused_whatever_the_protocol() {
    use crate::confirm::ConfirmTarget;
    use crate::queue::{ConfirmTo, FannedOut};
    use crate::vhost::publish::Published;
    use warren_protocol::{ByteString, FieldValue};

    let s = storage("publish");
    let (dir, persister) = (s.dir.clone(), s.persister.clone());
    let v = VHost::open("/", s).unwrap();
    let none = FieldTable::new();
    let mut full = FieldTable::new();
    full.insert("x-max-length", FieldValue::I32(0));
    full.insert("x-overflow", FieldValue::LongStr("reject-publish".into()));
    v.declare_exchange(&exchange("x")).unwrap();
    let open = v.declare_queue(&queue("open", &none)).unwrap();
    v.declare_queue(&queue("full", &full)).unwrap();
    v.bind_queue("open", "x", "k", &none, true, None).unwrap();
    v.bind_queue("full", "x", "refused", &none, true, None)
        .unwrap();
    v.bind_queue("open", "x", "refused", &none, true, None)
        .unwrap();
    let msg = |key: &str| crate::message::Message {
        exchange: ByteString::from("x"),
        routing_key: ByteString::from(key),
        properties: warren_protocol::properties::BasicProperties::default().to_bytes(),
        body: Bytes::from_static(b"m"),
        persistent: false,
        priority: None,
        expiration_ms: None,
        forwarded: crate::message::Forwarded::NONE,
    };
    #[derive(Default)]
    struct Told(parking_lot::Mutex<Vec<(u64, bool)>>);
    impl ConfirmTarget for Told {
        fn confirmed(self: Arc<Self>, seq: u64, ok: bool) {
            self.0.lock().push((seq, ok));
        }
    }
    let to: Arc<dyn ConfirmTarget> = Arc::new(Told::default());
    let mut buf = Vec::new();
    let mut seen = 0;
    let out = v.publish(
        msg("k"),
        &[],
        false,
        Some(ConfirmTo::Target(&to, 1)),
        &mut buf,
        |_| seen += 1,
    );
    assert!(matches!(
        out,
        Ok(Published::Routed(FannedOut::Settled { accepted: true }))
    ));
    assert_eq!((seen, open.message_count(), buf.len()), (1, 1, 0));
    let out = v.publish(msg("nowhere"), &[], true, None, &mut buf, |_| {});
    assert!(matches!(out, Ok(Published::Unroutable(m)) if &*m.routing_key == "nowhere"));
    let out = v.publish(msg("refused"), &[], false, None, &mut buf, |_| {});
    assert!(matches!(
        out,
        Ok(Published::Routed(FannedOut::Settled { accepted: false }))
    ));
    assert_eq!(
        open.message_count(),
        2,
        "the open queue took it all the same"
    );
    let gone = crate::message::Message {
        exchange: ByteString::from("no-such-exchange"),
        ..msg("k")
    };
    assert_eq!(
        v.publish(gone, &[], false, None, &mut buf, |_| {})
            .err()
            .map(|e| e.code),
        Some(404)
    );
    drop((open, v));
    persister.stop();
    let _ = std::fs::remove_dir_all(&dir);
}
