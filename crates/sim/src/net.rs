//! The simulated network's protocol: one request and its reply per TCP connection over
//! turmoil's network, `[len u32][kind u8][payload]` each way. Raft's messages between nodes
//! (kind [`RAFT`]) go through [`SimTransport`], which also duplicates some of them (a network
//! that delivers a request twice); the workload's requests to a node use the other kinds.

use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rand::rngs::StdRng;
use rand::Rng;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use turmoil::net::TcpStream;
use warren_cluster::{Node, Transport, TransportError};

/// A Raft message for `Meta::handle_rpc`.
pub const RAFT: u8 = 0;
/// Propose an entry (`[ts u64][bincode Cmd]`) through this node: `[ok u8][bincode Vec<Out>]`.
pub const PROPOSE: u8 = 1;
/// What a consumer holds on this node's machine: bincode `Vec<(seq, id)>`.
pub const HELD: u8 = 2;
/// This node's machine: bincode [`Final`](crate::client::Final).
pub const STATE: u8 = 3;

pub const PORT: u16 = 9000;
/// How long one request waits for its reply.
pub const CALL_TIMEOUT: Duration = Duration::from_millis(1500);

/// Sends one request to `addr` and reads its reply.
pub async fn call(addr: &str, kind: u8, payload: &[u8]) -> std::io::Result<Vec<u8>> {
    let mut s = TcpStream::connect(addr).await?;
    s.write_u32(payload.len() as u32 + 1).await?;
    s.write_u8(kind).await?;
    s.write_all(payload).await?;
    let len = s.read_u32().await? as usize;
    let mut reply = vec![0; len];
    s.read_exact(&mut reply).await?;
    Ok(reply)
}

/// Reads one request: its kind and payload.
pub async fn read_request(s: &mut TcpStream) -> std::io::Result<(u8, Vec<u8>)> {
    let len = s.read_u32().await? as usize;
    let kind = s.read_u8().await?;
    let mut payload = vec![0; len.saturating_sub(1)];
    s.read_exact(&mut payload).await?;
    Ok((kind, payload))
}

pub async fn write_reply(s: &mut TcpStream, reply: &[u8]) -> std::io::Result<()> {
    s.write_u32(reply.len() as u32).await?;
    s.write_all(reply).await
}

/// Raft's transport over the simulated network; a request is sent twice now and then.
pub struct SimTransport {
    pub rng: Arc<Mutex<StdRng>>,
    pub duplicate: f64,
}

impl Transport for SimTransport {
    fn call(
        &self,
        to: &Node,
        request: Vec<u8>,
    ) -> Pin<Box<dyn std::future::Future<Output = Result<Vec<u8>, TransportError>> + Send>> {
        // Raft's own messages only: a proposal sent twice is applied twice (Warren never sends
        // one again: a forwarded publish whose answer is lost is nacked).
        let twice = warren_cluster::is_raft_message(&request)
            && self
                .rng
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .gen_bool(self.duplicate);
        let addr = to.addr.clone();
        Box::pin(async move {
            if twice {
                let (addr, request) = (addr.clone(), request.clone());
                tokio::spawn(async move {
                    let _ = tokio::time::timeout(CALL_TIMEOUT, call(&addr, RAFT, &request)).await;
                });
            }
            match tokio::time::timeout(CALL_TIMEOUT, call(&addr, RAFT, &request)).await {
                Ok(Ok(r)) => Ok(r),
                // Refused at connect: certainly not delivered.
                Ok(Err(e)) if e.kind() == std::io::ErrorKind::ConnectionRefused => {
                    Err(TransportError::Unreachable(addr, e.to_string()))
                }
                Ok(Err(_)) | Err(_) => Err(TransportError::Timeout),
            }
        })
    }
}
