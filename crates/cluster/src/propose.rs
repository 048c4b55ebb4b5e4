//! Proposals: replicating a command through the leader ([`Meta::propose`], forwarded when this
//! node does not lead) or pipelining it on the leader itself ([`Meta::submit`]), and waiting
//! until this node has applied an entry, so a caller reads its own writes.

use std::sync::atomic::Ordering;
use std::time::Duration;

use openraft::metrics::WaitError;
use tokio::time::Instant;

use crate::rpc::Target;
use crate::types::{Blob, Reply, Rpc};
use crate::{Meta, MetaError, ProposeError};

impl Meta {
    /// Replicates `command`, forwarded to the leader when this node is not it; returns the
    /// leader's [`StateMachine::apply`](crate::StateMachine::apply) reply once this node has
    /// applied the entry too.
    pub async fn propose(&self, command: Vec<u8>) -> Result<Vec<u8>, ProposeError> {
        let deadline = Instant::now() + self.inner.config.propose_timeout;
        let (reply, index) = self.propose_routed(command, deadline).await?;
        self.wait_applied(index, deadline)
            .await
            .map_err(|e| match e {
                MetaError::Stopped(m) => ProposeError::Fatal(m),
                e => ProposeError::Unavailable(format!(
                    "committed at index {index} but not applied here in time: {e}"
                )),
            })?;
        Ok(reply)
    }

    /// [`Meta::propose`] without waiting for this node to apply the entry: the reply is the
    /// leader's apply's, answered once the leader has applied it. For a caller that needs the
    /// entry committed and its effect, not this node's copy up to date (a replicated queue's
    /// member proposing for its channels: its counts may lag by the entry).
    pub async fn propose_at_leader(&self, command: Vec<u8>) -> Result<Vec<u8>, ProposeError> {
        let deadline = Instant::now() + self.inner.config.propose_timeout;
        Ok(self.propose_routed(command, deadline).await?.0)
    }

    /// Proposes through whoever leads: the apply's reply and the entry's index.
    async fn propose_routed(
        &self,
        command: Vec<u8>,
        deadline: Instant,
    ) -> Result<(Vec<u8>, u64), ProposeError> {
        let reply = self
            .route(&Rpc::Propose(Blob(command.into())), None, deadline)
            .await
            .map_err(|e| match e {
                MetaError::Unavailable(m) => ProposeError::Unavailable(m),
                e => ProposeError::Fatal(e.to_string()),
            })?;
        match reply {
            Reply::Proposed { reply, index } => Ok((reply.0.into(), index)),
            _ => Err(ProposeError::Fatal("unexpected reply to a proposal".into())),
        }
    }

    /// Submits `command` on this node when it leads, without waiting: the returned future
    /// resolves to the apply's reply once the entry is committed and applied here. Entries are
    /// ordered as submitted, so a caller may keep several in flight (pipelining) and still
    /// know their order. The command back when this node does not lead (use
    /// [`Meta::propose`]).
    pub async fn submit(
        &self,
        command: impl Into<bytes::Bytes>,
    ) -> Result<impl std::future::Future<Output = Result<Vec<u8>, ProposeError>>, bytes::Bytes>
    {
        let command = command.into();
        if !matches!(self.leader_target(), Some(Target::Local)) {
            return Err(command);
        }
        let appended = Instant::now();
        let rx = self.inner.raft.client_write_ff(Blob(command)).await;
        let t = self.inner.config.propose_timeout;
        let inner = self.inner.clone();
        Ok(async move {
            let rx = rx.map_err(|e| ProposeError::Unavailable(e.to_string()))?;
            match tokio::time::timeout(t, rx).await {
                Ok(Ok(Ok(resp))) => {
                    let us = appended.elapsed().as_micros().min(u64::MAX as u128) as u64;
                    inner.commit_latency_us.store(us, Ordering::Relaxed);
                    Ok(resp.data.0.into())
                }
                Ok(Ok(Err(e))) => Err(ProposeError::Unavailable(e.to_string())),
                Ok(Err(_)) => Err(ProposeError::Unavailable("the leader stopped".into())),
                Err(_) => Err(ProposeError::Unavailable(format!(
                    "not committed within {t:?} (is a majority down?); it may still be"
                ))),
            }
        })
    }

    /// Waits up to `timeout` for this node to have applied entry `index`; true if it has.
    pub async fn wait_applied_within(&self, index: u64, timeout: Duration) -> bool {
        self.wait_applied(index, Instant::now() + timeout)
            .await
            .is_ok()
    }

    pub(crate) async fn wait_applied(
        &self,
        index: u64,
        deadline: Instant,
    ) -> Result<(), MetaError> {
        let left = deadline.saturating_duration_since(Instant::now());
        self.inner
            .raft
            .wait(Some(left))
            .applied_index_at_least(Some(index), "wait for the entry to be applied here")
            .await
            .map(|_| ())
            .map_err(wait_error)
    }
}

pub(crate) fn wait_error(e: WaitError) -> MetaError {
    match e {
        WaitError::Timeout(..) => MetaError::Unavailable(e.to_string()),
        WaitError::ShuttingDown => MetaError::Stopped(e.to_string()),
    }
}
