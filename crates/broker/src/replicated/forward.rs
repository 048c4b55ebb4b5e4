//! Entries a member proposes for its channels while another member leads. They go to the
//! leader directly ([`GroupNet::propose_at`](super::GroupNet::propose_at): one hop, the entry's
//! bytes as they are), several in flight, and the leader submits them in the order they were
//! sent: each carries its sender's stream and a number, and the leader submits number `n` of a
//! stream only after `n - 1` (serving requests concurrently, it could otherwise submit them in
//! another order, and a channel's publishes must be enqueued in the order they came).
//!
//! A number that never comes (its request lost with a broken link) holds the next ones at most
//! [`ORDER_WAIT`]: their sender has failed that entry's publishes anyway. A stream is new to a
//! leader from the first number that reaches it (after a failover, the sender's numbers go
//! on); one sent just before it and arriving just after is then submitted late.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use tokio::sync::watch;

use super::ReplicatedQueue;

/// How long an entry waits for the ones sent before it.
const ORDER_WAIT: Duration = Duration::from_secs(1);
/// Streams not heard from this long are forgotten (when there are many).
const STREAM_IDLE: Duration = Duration::from_secs(60);
const STREAMS_KEPT: usize = 64;

/// The text a member gets from a node that does not lead.
pub const NOT_LEADER: &str = "not the leader of this queue group";

/// Per sending stream, the next number to submit.
#[derive(Default)]
pub struct Order {
    streams: Mutex<HashMap<u64, (watch::Sender<u64>, Instant)>>,
}

/// A member's numbering of the entries it sends to the leader.
pub struct Stream {
    pub id: u64,
    pub next: u64,
}

impl Stream {
    pub fn new() -> Stream {
        Stream {
            id: rand::random(),
            next: 0,
        }
    }

    pub fn take(&mut self) -> u64 {
        self.next += 1;
        self.next - 1
    }
}

impl ReplicatedQueue {
    /// As the leader: submits an entry a member sent as number `seq` of `stream`, after the
    /// ones it sent before; the apply's reply.
    pub async fn submit_in_order(
        &self,
        meta: &warren_cluster::Meta,
        stream: u64,
        seq: u64,
        entry: bytes::Bytes,
    ) -> Result<Vec<u8>, String> {
        let mut turn = {
            let mut streams = self.order.streams.lock();
            if streams.len() > STREAMS_KEPT {
                streams.retain(|_, (_, used)| used.elapsed() < STREAM_IDLE);
            }
            let (tx, used) = streams
                .entry(stream)
                .or_insert_with(|| (watch::channel(seq).0, Instant::now()));
            *used = Instant::now();
            tx.subscribe()
        };
        let _ = tokio::time::timeout(ORDER_WAIT, turn.wait_for(|next| *next >= seq)).await;
        let submitted = meta.submit(entry).await;
        if let Some((tx, _)) = self.order.streams.lock().get(&stream) {
            tx.send_if_modified(|next| {
                let moved = *next <= seq;
                if moved {
                    *next = seq + 1;
                }
                moved
            });
        }
        match submitted {
            Ok(applied) => applied.await.map_err(|e| e.to_string()),
            Err(_) => Err(NOT_LEADER.into()),
        }
    }
}
