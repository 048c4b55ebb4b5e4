//! What this node serves on its links: Raft messages (the metadata group's and each replicated
//! queue's), queue requests, applied-index and membership questions, its `/api/nodes` object,
//! management questions (`SERVICE_VIEW`); and the one-way forwarding frames, handed to `remote`.

use std::sync::{Arc, Weak};

use bytes::Bytes;

use super::link::{BoxFuture, Handler, Link};
use super::{quorum, remote, rq, Cluster};
use super::{
    APPLY_WAIT, SERVICE_APPLIED, SERVICE_MEMBER, SERVICE_NODE, SERVICE_QUEUE, SERVICE_RAFT,
    SERVICE_VIEW,
};

pub(super) struct LinkHandler(pub(super) Weak<Cluster>);

impl Handler for LinkHandler {
    fn request(
        &self,
        link: &Arc<Link>,
        service: u8,
        body: Bytes,
    ) -> BoxFuture<Result<Bytes, String>> {
        let c = self.0.upgrade();
        let link = link.clone();
        Box::pin(async move {
            let c = c.ok_or("node stopping")?;
            match service {
                SERVICE_RAFT => {
                    let m = c.meta.read().clone();
                    match m {
                        Some(m) => Ok(Bytes::from(m.handle_rpc(body).await)),
                        None => Err("not ready".into()),
                    }
                }
                SERVICE_QUEUE => remote::serve_request(&c, &link, body).await,
                rq::SERVICE_RQ_PROPOSE => rq::serve_propose(&c, body).await,
                rq::SERVICE_RQ_COUNTS => rq::serve_counts(&c, body),
                rq::SERVICE_RQ_TOUCH => rq::serve_touch(&c, body),
                rq::SERVICE_RQ_PROPOSE_AT => rq::serve_propose_at(&c, body).await,
                rq::SERVICE_RS_FETCH => rq::serve_fetch(&c, body).await,
                quorum::SERVICE_QMEMBER => quorum::serve_member_change(&c, &body).await,
                quorum::rebalance::SERVICE_QELECT => {
                    quorum::rebalance::serve_elect(&c, &body).await
                }
                quorum::SERVICE_QRAFT | quorum::SERVICE_QLEADER => {
                    if body.len() < 8 {
                        return Err("short request".into());
                    }
                    let group = u64::from_be_bytes([
                        body[0], body[1], body[2], body[3], body[4], body[5], body[6], body[7],
                    ]);
                    let m = c.groups.read().get(&group).cloned();
                    let m = m.ok_or_else(|| format!("no queue group {group:016x} here"))?;
                    if service == quorum::SERVICE_QLEADER {
                        let leader = quorum::raft_leader(&m).unwrap_or_default();
                        return Ok(Bytes::from(leader));
                    }
                    Ok(Bytes::from(m.handle_rpc(body.slice(8..)).await))
                }
                SERVICE_APPLIED => {
                    let m = c.meta.read().clone().ok_or("not ready")?;
                    let index = match body.len() {
                        8 => u64::from_be_bytes([
                            body[0], body[1], body[2], body[3], body[4], body[5], body[6], body[7],
                        ]),
                        _ => 0,
                    };
                    if index > 0 {
                        m.wait_applied_within(index, APPLY_WAIT).await;
                    }
                    let applied = m.status().last_applied.unwrap_or(0);
                    Ok(Bytes::copy_from_slice(&applied.to_be_bytes()))
                }
                SERVICE_MEMBER => {
                    let st = c.meta.read().clone().ok_or("not ready")?.status();
                    let mut r = st.last_applied.unwrap_or(0).to_be_bytes().to_vec();
                    r.push(
                        st.members
                            .iter()
                            .any(|m| m.node.name.as_bytes() == body.as_ref())
                            as u8,
                    );
                    Ok(Bytes::from(r))
                }
                SERVICE_NODE => {
                    let b = c.broker().ok_or("node stopping")?;
                    Ok(Bytes::from(crate::node_status::node_json(&b).to_string()))
                }
                super::SERVICE_STREAM_PORT => {
                    let b = c.broker().ok_or("node stopping")?;
                    let port = b.config.stream_port.unwrap_or(0);
                    Ok(Bytes::copy_from_slice(&port.to_be_bytes()))
                }
                SERVICE_VIEW => {
                    let b = c.broker().ok_or("node stopping")?;
                    b.local_view(&body).map(Bytes::from)
                }
                s => Err(format!("unknown service {s}")),
            }
        })
    }

    fn message(&self, link: &Arc<Link>, kind: u8, body: Bytes) {
        if let Some(c) = self.0.upgrade() {
            if kind == rq::K_RQ_DELIVER {
                rq::on_deliver(&c, body);
            } else if kind == rq::K_RQ_TIMEDOUT {
                rq::on_timed_out(&c, body);
            } else {
                remote::on_message(&c, link, kind, body);
            }
        }
    }

    fn link_down(&self, link: &Arc<Link>) {
        if let Some(c) = self.0.upgrade() {
            remote::on_link_down(&c, link);
        }
    }

    fn batch_end(&self, link: &Arc<Link>) {
        if let Some(c) = self.0.upgrade() {
            remote::on_batch_end(&c, link);
        }
    }
}
