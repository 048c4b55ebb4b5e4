//! The one interface through which the vhost, the access registry and the broker make a
//! definitions change they do not make themselves: [`Proposer`]. A cluster node's proposer is
//! the cluster (`cluster::Cluster`): it replicates the command, and every node, the proposer
//! too, applies it on commit through the same methods given the entry as an [`Applying`]. A
//! single node has none: it makes each change at once through those methods (`at` = `None`),
//! which journal it (`vhost/journal.rs`, `access.json`) before it is visible.
//!
//! [`Applying`]: super::op::Applying

use std::future::Future;
use std::pin::Pin;

use warren_protocol::Method;

use super::op::{DefOp, DefReply, QueueMeta};
use crate::definitions::records::MgmtError;
use crate::error::AmqpResult;

/// A proposal under way: the outcome of the applied change, or why it could not be recorded.
pub type Proposal<'a> = Pin<Box<dyn Future<Output = Result<DefReply, String>> + Send + 'a>>;

/// Where a change of the definitions asked for on this node goes when this node does not make
/// it at once.
pub trait Proposer: Send + Sync {
    /// Records `op` for every node to apply, and answers once this node has applied it.
    fn propose(&self, op: DefOp) -> Proposal<'_>;

    /// [`Proposer::propose`] from synchronous code on a tokio worker (the vhost's and the
    /// access registry's methods): the worker's other tasks move to another thread meanwhile.
    fn propose_blocking(&self, op: DefOp) -> Result<DefReply, String> {
        let handle = tokio::runtime::Handle::current();
        tokio::task::block_in_place(|| handle.block_on(self.propose(op)))
    }

    /// A vhost change (called by the vhost's public methods in place of making it).
    fn vhost_change(
        &self,
        vhost: &str,
        method: Method,
        queue: Option<QueueMeta>,
    ) -> AmqpResult<()> {
        self.vhost_change_counted(vhost, method, queue).map(|_| ())
    }

    /// [`Proposer::vhost_change`], with the ready count of a queue its queue.delete deleted on
    /// this node (`None`: not one, or the queue lived elsewhere).
    fn vhost_change_counted(
        &self,
        vhost: &str,
        method: Method,
        queue: Option<QueueMeta>,
    ) -> AmqpResult<Option<u32>> {
        let mut b = bytes::BytesMut::new();
        method.encode_payload(&mut b);
        let op = DefOp::Vhost {
            vhost: vhost.into(),
            method: b.to_vec(),
            queue,
        };
        let r = self.propose_blocking(op);
        let count = match &r {
            Ok(DefReply::Deleted { message_count }) => Some(*message_count),
            _ => None,
        };
        DefReply::into_amqp(r).map(|()| count)
    }

    /// A users/permissions/policies/limits/vhosts change.
    fn mgmt_change(&self, op: DefOp) -> Result<(), MgmtError> {
        DefReply::into_mgmt(self.propose_blocking(op))
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
pub(crate) mod tests {
    use std::sync::Arc;

    use bytes::Bytes;
    use parking_lot::Mutex;
    use warren_protocol::method::ExchangeDelete;

    use super::*;
    use crate::definitions::records::VhostDef;

    /// A proposer that records what it is given and answers `reply` (or fails, `Err`).
    pub(crate) struct FakeProposer {
        pub(crate) ops: Mutex<Vec<DefOp>>,
        pub(crate) reply: Mutex<Result<DefReply, String>>,
    }

    impl FakeProposer {
        pub(crate) fn new() -> Arc<FakeProposer> {
            Arc::new(FakeProposer {
                ops: Mutex::new(Vec::new()),
                reply: Mutex::new(Ok(DefReply::Ok)),
            })
        }

        fn answer(&self, r: Result<DefReply, String>) {
            *self.reply.lock() = r;
        }
    }

    impl Proposer for FakeProposer {
        fn propose(&self, op: DefOp) -> Proposal<'_> {
            self.ops.lock().push(op);
            let r = self.reply.lock().clone();
            Box::pin(async move { r })
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_vhost_change_is_proposed_as_its_encoded_method() {
        let p = FakeProposer::new();
        let m: Method = ExchangeDelete {
            exchange: "x".into(),
            if_unused: true,
            ..Default::default()
        }
        .into();
        p.vhost_change("/", m, None).unwrap();
        let ops = p.ops.lock();
        let [DefOp::Vhost {
            vhost,
            method,
            queue,
        }] = &ops[..]
        else {
            panic!("one vhost op: {ops:?}")
        };
        assert_eq!((vhost.as_str(), queue.is_none()), ("/", true));
        match Method::decode(&Bytes::copy_from_slice(method)).unwrap() {
            Method::ExchangeDelete(d) => assert!(d.exchange == "x" && d.if_unused),
            other => panic!("{other:?}"),
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn replies_become_the_callers_errors() {
        let p = FakeProposer::new();
        let m = || -> Method { ExchangeDelete::default().into() };
        p.answer(Ok(DefReply::Amqp {
            code: 406,
            text: "PRECONDITION_FAILED - in use".into(),
        }));
        let e = p.vhost_change("/", m(), None).unwrap_err();
        assert_eq!(
            (e.code, e.text.as_str()),
            (406, "PRECONDITION_FAILED - in use")
        );
        // Not recorded (no majority): the connection is closed, as RabbitMQ does.
        p.answer(Err("no majority".into()));
        assert_eq!(p.vhost_change("/", m(), None).unwrap_err().code, 320);
        assert_eq!(
            p.mgmt_change(DefOp::DeleteVhost("v".into())),
            Err(MgmtError::Unavailable("no majority".into()))
        );
        p.answer(Ok(DefReply::Mgmt {
            kind: 0,
            text: "no vhost 'v'".into(),
        }));
        assert_eq!(
            p.mgmt_change(DefOp::DeleteVhost("v".into())),
            Err(MgmtError::NotFound("no vhost 'v'".into()))
        );
        p.answer(Ok(DefReply::Ok));
        let def = VhostDef {
            name: "v".into(),
            description: String::new(),
        };
        assert_eq!(p.mgmt_change(DefOp::AddVhost(def)), Ok(()));
        assert_eq!(p.ops.lock().len(), 5);
    }

    #[test]
    fn the_encoding_is_the_metadata_entries_of_before() {
        // Entries and snapshots written while the type was `cluster::MetaOp` still read.
        let op: DefOp = serde_json::from_str(
            r#"{"Vhost":{"vhost":"/","method":[0,40,0,40],"queue":{"home":"a","owner":null,"server_named":false}}}"#,
        )
        .unwrap();
        assert!(matches!(&op, DefOp::Vhost { queue: Some(q), .. } if q.home == "a"));
        let op = DefOp::ClearPermissions {
            user: "u".into(),
            vhost: "/".into(),
        };
        assert_eq!(
            serde_json::to_string(&op).unwrap(),
            r#"{"ClearPermissions":{"user":"u","vhost":"/"}}"#
        );
        let r: DefReply = serde_json::from_str(r#"{"Mgmt":{"kind":1,"text":"t"}}"#).unwrap();
        assert!(matches!(r, DefReply::Mgmt { kind: 1, .. }));
    }
}
