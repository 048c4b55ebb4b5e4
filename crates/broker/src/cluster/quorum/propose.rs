//! Proposing: the leader's loop that proposes the replicator's batches (a few in flight),
//! finishes each once committed (confirms, refusals, claims), and retries kept dead letters.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use super::entry::encode;
use super::{stopped, Batch, QuorumQueue, CLAIM_WINDOW, DEAD_LETTER_RETRY, PIPELINE};

impl QuorumQueue {
    /// Proposes the leader queue's publishes and settlements, a batch per entry, and completes
    /// the publishes' confirms once committed.
    pub(super) async fn propose_loop(
        self: Arc<Self>,
        meta: warren_cluster::Meta,
        mut stop: tokio::sync::watch::Receiver<bool>,
    ) {
        type Pending = std::pin::Pin<
            Box<
                dyn std::future::Future<Output = Result<Vec<u8>, warren_cluster::ProposeError>>
                    + Send,
            >,
        >;
        // Entries in flight, oldest first: a batch waits for the group only while the window
        // is full, so commits of consecutive batches overlap (each is one fsync per member).
        let mut in_flight: std::collections::VecDeque<(Pending, Batch)> = Default::default();
        loop {
            while in_flight.len() < PIPELINE {
                let Some(mut batch) = self.repl.take() else {
                    break;
                };
                self.claim(&mut batch);
                let cmd = encode(&batch);
                let fut: Pending = match meta.submit(cmd).await {
                    Ok(f) => Box::pin(f),
                    // Not the leader (any more): through whoever leads, one at a time.
                    Err(cmd) => {
                        let m = meta.clone();
                        Box::pin(async move { m.propose(Vec::from(cmd)).await })
                    }
                };
                in_flight.push_back((fut, batch));
            }
            let room = in_flight.len() < PIPELINE;
            if let Some((fut, _)) = in_flight.front_mut() {
                let r = tokio::select! {
                    r = fut => Some(r),
                    _ = self.repl.wake.notified(), if room => None,
                    _ = stopped(&mut stop) => return,
                };
                let Some(r) = r else { continue };
                if let Some((_, batch)) = in_flight.pop_front() {
                    self.finish(batch, r);
                }
                continue;
            }
            if self.deleted.load(Ordering::Acquire) {
                return;
            }
            tokio::select! {
                _ = self.repl.wake.notified() => {}
                _ = stopped(&mut stop) => return,
            }
        }
    }

    /// Sends again, every second, the kept dead letters that could not be routed or were
    /// refused (RabbitMQ's at-least-once dead-lettering retries them too).
    pub(super) async fn dead_letter_retries(
        self: Arc<Self>,
        mut stop: tokio::sync::watch::Receiver<bool>,
    ) {
        let mut tick = tokio::time::interval(DEAD_LETTER_RETRY);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = tick.tick() => {}
                _ = stopped(&mut stop) => return,
            }
            if self.deleted.load(Ordering::Acquire) {
                return;
            }
            if self.repl.has_dead_to_send() {
                if let Some(q) = self.local_leg() {
                    super::leg::send_dead_kept(&q, &self.repl);
                }
            }
        }
    }

    /// Completes a batch's confirms from its entry's outcome. Without a reply (not committed in
    /// time, no leader) every publish is nacked: the entry may still commit, so a publisher
    /// that resends may duplicate.
    fn finish(&self, batch: Batch, r: Result<Vec<u8>, warren_cluster::ProposeError>) {
        let n = batch.msgs.len();
        let bytes = batch.bytes;
        let refused: Option<Vec<usize>> = match r {
            Ok(reply) => Some(
                reply
                    .chunks_exact(4)
                    .map(|c| u32::from_be_bytes([c[0], c[1], c[2], c[3]]) as usize)
                    .collect(),
            ),
            Err(e) => {
                tracing::warn!(queue = %self.name, vhost = %self.vhost, messages = n, error = %e, "replicating publishes failed; they are nacked");
                None
            }
        };
        let handles = batch
            .msgs
            .into_iter()
            .enumerate()
            .filter_map(|(i, (_, h))| h.map(|h| (i, h)));
        crate::confirm::complete_all(handles.map(|(i, h)| {
            let ok = refused.as_ref().is_some_and(|r| !r.contains(&i));
            (h, ok)
        }));
        self.repl.done(n, bytes);
    }

    /// Adds the claims this batch should carry: the new messages consumers are waiting for, and
    /// unclaimed ones from the lowest an offer was held back for (a window, so a backlog drains
    /// a window per entry; a new leader marks at most that many never-delivered messages).
    fn claim(&self, batch: &mut Batch) {
        let Some(leg) = self.local_leg() else {
            self.repl.claims_from.lock().take();
            return;
        };
        batch.claim_new = leg.spare_credit().min(batch.msgs.len()) as u32;
        let Some(from) = self.repl.claims_from.lock().take() else {
            return;
        };
        let r = self.sm.replica.lock();
        let mut claiming = self.repl.claiming.lock();
        for id in r.ids_from(from) {
            if batch.claimed.len() >= CLAIM_WINDOW {
                break;
            }
            if !r.delivered.contains(&id) && claiming.insert(id) {
                batch.claimed.push(id);
            }
        }
    }
}
