//! Replicated queues on the queue machine (`replicated/`) in a cluster: their [`GroupNet`]
//! over the inter-node links, and what a node serves for them.
//!
//! - Raft messages travel as `quorum::SERVICE_QRAFT`, led by the group id, to the member's
//!   group registered in `Cluster::groups` (as the earlier replicated queues' do).
//! - A node that is no member proposes through one ([`SERVICE_RQ_PROPOSE`]): the member
//!   proposes the entry to its group (forwarded to the leader) and answers the apply's reply.
//! - The leader hands a delivery to a consumer on another node as a one-way [`K_RQ_DELIVER`]
//!   frame; that node's queue hands it to the consumer's channel, dropping one it has had.
//! - A node that is no member asks one for the queue's counts ([`SERVICE_RQ_COUNTS`]).

use std::sync::{Arc, Weak};
use std::time::Duration;

use bytes::{Buf, BufMut, Bytes};

use super::Cluster;
use crate::replicated::net::{BoxFuture, Counts, Delivery};
use crate::replicated::{GroupNet, ReplicatedQueue};

/// Propose an entry to a group through this member: `[group u64][entry]` -> the apply's reply.
pub const SERVICE_RQ_PROPOSE: u8 = 9;
/// A group's counts as this member has them: `[group u64]` -> `[ready u32][unacked u32]
/// [consumers u32]`.
pub const SERVICE_RQ_COUNTS: u8 = 10;
/// Propose an entry through this node as the group's leader, in its sender's order:
/// `[group u64][stream u64][seq u64][entry]` -> the apply's reply (`replicated/forward.rs`).
pub const SERVICE_RQ_PROPOSE_AT: u8 = 11;
/// The queue was declared on another node: this member starts its `x-expires` lease again
/// (whichever member leads, now or after a failover, sees the declare): `[group u64]` -> `[]`.
pub const SERVICE_RQ_TOUCH: u8 = 12;
/// A replicated stream's committed entries from an offset, from this member's copy:
/// `[group u64][from u64][max bytes u32][wait ms u32]` -> `replicated::stream::
/// encode_fetched`'s form.
pub const SERVICE_RS_FETCH: u8 = 15;
/// A delivery to a consumer on the receiving node: `[group u64][consumer u64][delivery u64]
/// [seq u64][redelivered u8]` then the message.
pub const K_RQ_DELIVER: u8 = 24;
/// The machine timed out a consumer on the receiving node: `[group u64][consumer u64]
/// [timeout ms u64]`.
pub const K_RQ_TIMEDOUT: u8 = 25;

/// How long a forwarded proposal may take (a member waits for its group's commit).
const FORWARD_TIMEOUT: Duration = Duration::from_secs(8);

pub struct ClusterNet {
    pub(super) c: Weak<Cluster>,
}

impl GroupNet for ClusterNet {
    fn transport(&self, group: u64) -> Arc<dyn warren_cluster::Transport> {
        match self.c.upgrade() {
            Some(c) => Arc::new(super::LinkTransport {
                links: c.links.clone(),
                service: super::quorum::SERVICE_QRAFT,
                group: Some(group),
            }),
            None => Arc::new(crate::replicated::net::Alone),
        }
    }

    fn addr_of(&self, node: &str) -> Option<String> {
        self.c.upgrade()?.addr_of(node)
    }

    fn register(&self, group: u64, meta: Option<warren_cluster::Meta>) {
        let Some(c) = self.c.upgrade() else { return };
        match meta {
            Some(m) => {
                c.groups.write().insert(group, m);
            }
            None => {
                c.groups.write().remove(&group);
            }
        }
    }

    fn forward(
        &self,
        group: u64,
        members: Vec<String>,
        entry: Vec<u8>,
    ) -> BoxFuture<Result<Vec<u8>, String>> {
        let c = self.c.clone();
        Box::pin(async move {
            let c = c.upgrade().ok_or("node stopping")?;
            let mut body = Vec::with_capacity(8 + entry.len());
            body.extend_from_slice(&group.to_be_bytes());
            body.extend_from_slice(&entry);
            let mut last = String::from("no member reachable");
            // Each member in turn (any of them forwards to the leader), but only while the
            // request certainly reached none: one that may have been proposed is not sent
            // again (it would be applied twice).
            for m in members {
                let Some(addr) = c.addr_of(&m) else { continue };
                match c
                    .links
                    .call(&addr, SERVICE_RQ_PROPOSE, &body, FORWARD_TIMEOUT)
                    .await
                {
                    Ok(r) => return Ok(r.to_vec()),
                    Err(e @ super::link::LinkError::Unreachable(..)) => last = format!("{m}: {e}"),
                    Err(e) => return Err(format!("{m}: {e}")),
                }
            }
            Err(last)
        })
    }

    fn propose_at(
        &self,
        leader: &str,
        group: u64,
        stream: u64,
        seq: u64,
        entry: Vec<u8>,
    ) -> BoxFuture<Result<Vec<u8>, String>> {
        let c = self.c.clone();
        let leader = leader.to_string();
        Box::pin(async move {
            let c = c.upgrade().ok_or("node stopping")?;
            let addr = c
                .addr_of(&leader)
                .ok_or_else(|| format!("{leader}: no address"))?;
            let mut body = Vec::with_capacity(24 + entry.len());
            body.extend_from_slice(&group.to_be_bytes());
            body.extend_from_slice(&stream.to_be_bytes());
            body.extend_from_slice(&seq.to_be_bytes());
            body.extend_from_slice(&entry);
            c.links
                .call(&addr, SERVICE_RQ_PROPOSE_AT, &body, FORWARD_TIMEOUT)
                .await
                .map(|r| r.to_vec())
                .map_err(|e| format!("{leader}: {e}"))
        })
    }

    fn deliver(&self, node: &str, group: u64, d: Delivery) {
        let Some(c) = self.c.upgrade() else { return };
        let Some(addr) = c.addr_of(node) else { return };
        let send = move |l: &super::link::Link| {
            l.send(K_RQ_DELIVER, |b| {
                b.put_u64(group);
                let mut pre = [0u8; 16];
                pre[..8].copy_from_slice(&d.consumer.to_be_bytes());
                pre[8..].copy_from_slice(&d.delivery.to_be_bytes());
                b.put_slice(&pre);
                let mut pre = [0u8; 9];
                pre[..8].copy_from_slice(&d.seq.to_be_bytes());
                pre[8] = d.redelivered as u8;
                super::remote::put_message(b, &pre, &d.msg);
            })
        };
        // A delivery lost on the way is sent again by the next leader (what a consumer holds),
        // or stays held until its node is back.
        send_or_dial(&c, addr, send);
    }

    fn timed_out(&self, node: &str, group: u64, consumer: u64, timeout_ms: u64) {
        let Some(c) = self.c.upgrade() else { return };
        let Some(addr) = c.addr_of(node) else { return };
        let send = move |l: &super::link::Link| {
            l.send(K_RQ_TIMEDOUT, |b| {
                b.put_u64(group);
                b.put_u64(consumer);
                b.put_u64(timeout_ms);
            })
        };
        // Lost on the way (the node unreachable), the consumer stays attached on its node while
        // the machine has it down.
        send_or_dial(&c, addr, send);
    }

    fn leader_of(&self, group: u64, members: Vec<String>) -> BoxFuture<Option<String>> {
        self.ask_members(super::quorum::SERVICE_QLEADER, group, members, |r| {
            (!r.is_empty()).then(|| String::from_utf8_lossy(&r).into_owned())
        })
    }

    fn node_up(&self, node: &str) -> bool {
        self.c.upgrade().is_some_and(|c| c.running(node))
    }

    fn touch(&self, group: u64, members: Vec<String>) -> BoxFuture<()> {
        let c = self.c.clone();
        Box::pin(async move {
            let Some(c) = c.upgrade() else { return };
            let mut calls = tokio::task::JoinSet::new();
            for addr in members
                .iter()
                .filter(|m| **m != c.me)
                .filter_map(|m| c.addr_of(m))
            {
                let links = c.links.clone();
                calls.spawn(async move {
                    let body = group.to_be_bytes();
                    let _ = links
                        .call(&addr, SERVICE_RQ_TOUCH, &body, Duration::from_secs(2))
                        .await;
                });
            }
            while calls.join_next().await.is_some() {}
        })
    }

    fn fetch(
        &self,
        node: &str,
        group: u64,
        from: u64,
        max_bytes: u32,
        wait_ms: u32,
    ) -> BoxFuture<Result<Bytes, String>> {
        let c = self.c.clone();
        let node = node.to_string();
        Box::pin(async move {
            let c = c.upgrade().ok_or("node stopping")?;
            let addr = c
                .addr_of(&node)
                .ok_or_else(|| format!("{node}: no address"))?;
            let mut body = Vec::with_capacity(24);
            body.extend_from_slice(&group.to_be_bytes());
            body.extend_from_slice(&from.to_be_bytes());
            body.extend_from_slice(&max_bytes.to_be_bytes());
            body.extend_from_slice(&wait_ms.to_be_bytes());
            let limit = Duration::from_secs(30) + Duration::from_millis(wait_ms as u64);
            c.links
                .call(&addr, SERVICE_RS_FETCH, &body, limit)
                .await
                .map_err(|e| format!("{node}: {e}"))
        })
    }

    fn counts(&self, group: u64, members: Vec<String>) -> BoxFuture<Option<Counts>> {
        self.ask_members(SERVICE_RQ_COUNTS, group, members, |mut r| {
            (r.remaining() >= 12).then(|| (r.get_u32(), r.get_u32(), r.get_u32()))
        })
    }
}

impl ClusterNet {
    /// Asks `service` of each of `members` in turn, with the group as the request, until one
    /// answers what `take` accepts.
    fn ask_members<T: Send + 'static>(
        &self,
        service: u8,
        group: u64,
        members: Vec<String>,
        take: fn(Bytes) -> Option<T>,
    ) -> BoxFuture<Option<T>> {
        let c = self.c.clone();
        Box::pin(async move {
            let c = c.upgrade()?;
            for m in members {
                let Some(addr) = c.addr_of(&m) else { continue };
                let body = group.to_be_bytes();
                if let Ok(r) = c
                    .links
                    .call(&addr, service, &body, Duration::from_secs(2))
                    .await
                {
                    if let Some(t) = take(r) {
                        return Some(t);
                    }
                }
            }
            None
        })
    }
}

/// Sends a one-way frame on the link to `addr`, dialing it first when there is none.
fn send_or_dial(
    c: &Arc<Cluster>,
    addr: String,
    send: impl FnOnce(&super::link::Link) + Send + 'static,
) {
    match c.links.get(&addr) {
        Some(l) => send(&l),
        None => {
            let links = c.links.clone();
            tokio::spawn(async move {
                if let Ok(l) = links.link(&addr).await {
                    send(&l);
                }
            });
        }
    }
}

impl Cluster {
    /// The replicated queue of `group` on this node.
    fn rqueue(&self, group: u64) -> Option<Arc<ReplicatedQueue>> {
        self.rqueues.read().get(&group).and_then(Weak::upgrade)
    }

    /// The replicated stream of `group` this node holds a copy of.
    pub(super) fn rstream(
        &self,
        group: u64,
    ) -> Option<Arc<crate::replicated::stream::ReplicatedStream>> {
        self.rstreams.read().get(&group).and_then(Weak::upgrade)
    }

    pub(super) fn register_rstream(&self, r: &Arc<crate::replicated::stream::ReplicatedStream>) {
        let mut m = self.rstreams.write();
        m.retain(|_, w| w.strong_count() > 0);
        m.insert(r.group_id(), Arc::downgrade(r));
    }

    pub(super) fn register_rqueue(&self, q: &Arc<ReplicatedQueue>) {
        let mut r = self.rqueues.write();
        r.retain(|_, w| w.strong_count() > 0);
        r.insert(q.group(), Arc::downgrade(q));
    }
}

fn group_of(body: &mut Bytes) -> Result<u64, String> {
    if body.remaining() < 8 {
        return Err("short request".into());
    }
    Ok(body.get_u64())
}

/// A member's side of [`SERVICE_RQ_PROPOSE`].
pub async fn serve_propose(c: &Arc<Cluster>, mut body: Bytes) -> Result<Bytes, String> {
    let group = group_of(&mut body)?;
    let meta = c.groups.read().get(&group).cloned();
    let meta = meta.ok_or_else(|| format!("not a member of queue group {group:016x}"))?;
    meta.propose_at_leader(body.to_vec())
        .await
        .map(Bytes::from)
        .map_err(|e| e.to_string())
}

/// The leader's side of [`SERVICE_RQ_PROPOSE_AT`].
pub async fn serve_propose_at(c: &Arc<Cluster>, mut body: Bytes) -> Result<Bytes, String> {
    if body.remaining() < 24 {
        return Err("short request".into());
    }
    let (group, stream, seq) = (body.get_u64(), body.get_u64(), body.get_u64());
    let meta = c.groups.read().get(&group).cloned();
    let meta = meta.ok_or_else(|| format!("not a member of queue group {group:016x}"))?;
    let q = c
        .rqueue(group)
        .ok_or_else(|| format!("no queue group {group:016x} here"))?;
    // The entry as it came, not copied (Raft's log and its followers share it).
    q.submit_in_order(&meta, stream, seq, body)
        .await
        .map(Bytes::from)
}

/// A member's side of [`SERVICE_RQ_TOUCH`]: the queue was declared on the asking node.
pub fn serve_touch(c: &Arc<Cluster>, mut body: Bytes) -> Result<Bytes, String> {
    let group = group_of(&mut body)?;
    if let Some(q) = c.rqueue(group) {
        q.touch();
    }
    Ok(Bytes::new())
}

/// A member's side of [`SERVICE_RQ_COUNTS`].
pub fn serve_counts(c: &Arc<Cluster>, mut body: Bytes) -> Result<Bytes, String> {
    let group = group_of(&mut body)?;
    let q = c
        .rqueue(group)
        .ok_or_else(|| format!("no queue group {group:016x} here"))?;
    let (ready, unacked, consumers) = q.local_counts();
    let mut b = Vec::with_capacity(12);
    b.extend_from_slice(&ready.to_be_bytes());
    b.extend_from_slice(&unacked.to_be_bytes());
    b.extend_from_slice(&consumers.to_be_bytes());
    Ok(Bytes::from(b))
}

/// A member's side of [`SERVICE_RS_FETCH`]: committed entries of its copy (after waiting up
/// to the asked time for some), read on the blocking pool.
pub async fn serve_fetch(c: &Arc<Cluster>, mut body: Bytes) -> Result<Bytes, String> {
    if body.remaining() < 24 {
        return Err("short request".into());
    }
    let (group, from, max, wait_ms) = (
        body.get_u64(),
        body.get_u64(),
        body.get_u32(),
        body.get_u32().min(5_000),
    );
    let s = c
        .rstream(group)
        .filter(|r| r.is_member())
        .and_then(|r| r.stream())
        .ok_or_else(|| format!("no member's copy of stream group {group:016x} here"))?;
    s.wait_committed_past(from, Duration::from_millis(wait_ms as u64))
        .await;
    tokio::task::spawn_blocking(move || s.read_for_member(from, max as u64))
        .await
        .map_err(|e| e.to_string())?
        .map(|(entries, chunks)| crate::replicated::stream::encode_fetched(&entries, &chunks))
        .map_err(|e| e.to_string())
}

/// A [`K_RQ_TIMEDOUT`] frame: the consumer's channel here is told.
pub fn on_timed_out(c: &Arc<Cluster>, mut body: Bytes) {
    if body.remaining() < 24 {
        return;
    }
    let (group, consumer, timeout_ms) = (body.get_u64(), body.get_u64(), body.get_u64());
    if let Some(q) = c.rqueue(group) {
        q.timed_out_local(consumer, timeout_ms);
    }
}

/// A [`K_RQ_DELIVER`] frame: handed to the consumer here.
pub fn on_deliver(c: &Arc<Cluster>, mut body: Bytes) {
    if body.remaining() < 8 + 16 + 9 {
        return;
    }
    let group = body.get_u64();
    let consumer = body.get_u64();
    let delivery = body.get_u64();
    let seq = body.get_u64();
    let redelivered = body.get_u8() == 1;
    let Some(msg) = super::remote::get_message(&mut body) else {
        return;
    };
    if let Some(q) = c.rqueue(group) {
        q.deliver_local(Delivery {
            consumer,
            delivery,
            seq,
            redelivered,
            msg: Arc::new(msg),
        });
    }
}
