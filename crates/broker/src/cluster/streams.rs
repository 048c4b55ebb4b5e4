//! What a stream-protocol front end asks of the cluster about a replicated stream's members:
//! where each listens for the stream protocol, so that a client's metadata names the leader
//! (to publish to) and the replicas (to consume from), as RabbitMQ's advertised host and port.

use std::time::{Duration, Instant};

use super::{Cluster, SERVICE_STREAM_PORT};

/// How long another node's answer is kept.
const KEEP: Duration = Duration::from_secs(30);

impl Cluster {
    /// Where a client reaches `node`'s stream protocol: the host of its inter-node link address
    /// and its stream port (asked over the link, kept a while); `None` for this node (the
    /// caller answers the address the client reached), a node without a stream port, or one
    /// that does not answer.
    pub async fn stream_endpoint(&self, node: &str) -> Option<(String, u16)> {
        if node == self.me {
            return None;
        }
        let addr = self.addr_of(node)?;
        let host = addr.rsplit_once(':').map_or(addr.as_str(), |(h, _)| h);
        let host = host
            .trim_start_matches('[')
            .trim_end_matches(']')
            .to_string();
        let kept = self
            .stream_ports
            .lock()
            .get(node)
            .filter(|(_, at)| at.elapsed() < KEEP)
            .map(|(p, _)| *p);
        let port = match kept {
            Some(p) => p,
            None => {
                let r = self
                    .links
                    .call(&addr, SERVICE_STREAM_PORT, &[], Duration::from_secs(1))
                    .await
                    .ok()?;
                let p = u16::from_be_bytes([*r.first()?, *r.get(1)?]);
                self.stream_ports
                    .lock()
                    .insert(node.to_string(), (p, Instant::now()));
                p
            }
        };
        (port != 0).then_some((host, port))
    }
}
