//! The workload and its model. Random commands go through random members: publishes
//! (`Enqueue`, each message an id of its own), consumers attaching on random nodes, their held
//! deliveries settled, returned or discarded, cancels, downs, node downs and ticks. The model
//! remembers what was confirmed and what the workload itself removed; once the faults are
//! healed, every member must reach the same state, and every confirmed message must be in it or
//! have been settled or discarded by the workload (a settle whose answer was lost counts, as
//! it may have been applied).

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use warren_queue::replicated::{Attach, Cmd, MsgRef, Out, ReturnKind};

use crate::check::Check;
use crate::net::{self, call, CALL_TIMEOUT};

/// A member's machine as the end of a run reads it.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Final {
    pub applied: u64,
    /// The ids of the messages still in the queue, sorted.
    pub ids: Vec<u64>,
    pub fingerprint: String,
}

/// What the workload saw.
#[derive(Default, Debug)]
pub struct Model {
    /// Publishes confirmed (their `Enqueue` answered `Accepted`), by id.
    pub confirmed: BTreeSet<u64>,
    /// Ids the workload settled or discarded, answered or not.
    pub removed: BTreeSet<u64>,
    pub ops: u64,
    pub failed: u64,
}

const CONSUMERS: u64 = 4;

pub struct Workload {
    pub nodes: Vec<String>,
    pub rng: StdRng,
    pub model: Model,
    next_id: u64,
}

fn addr(node: &str) -> String {
    format!("{node}:{}", net::PORT)
}

impl Workload {
    pub fn new(nodes: Vec<String>, seed: u64) -> Workload {
        Workload {
            nodes,
            rng: StdRng::seed_from_u64(seed ^ 0x5eed_c11e),
            model: Model::default(),
            next_id: 1,
        }
    }

    fn node(&mut self) -> String {
        let i = self.rng.gen_range(0..self.nodes.len());
        self.nodes[i].clone()
    }

    /// Proposes `cmd` through a random member: its outputs, `None` when the answer was lost
    /// (it may or may not have been applied).
    async fn propose(&mut self, cmd: Cmd) -> Option<Vec<Out>> {
        let node = self.node();
        let ts = turmoil::elapsed().as_millis() as u64;
        let entry = bincode::serialize(&(ts, cmd)).ok()?;
        self.model.ops += 1;
        let r =
            tokio::time::timeout(CALL_TIMEOUT * 2, call(&addr(&node), net::PROPOSE, &entry)).await;
        match r {
            Ok(Ok(reply)) if reply.first() == Some(&1) => bincode::deserialize(&reply[1..]).ok(),
            _ => {
                self.model.failed += 1;
                None
            }
        }
    }

    async fn held(&mut self, consumer: u64) -> Vec<(u64, u64)> {
        let node = self.node();
        match tokio::time::timeout(
            CALL_TIMEOUT,
            call(&addr(&node), net::HELD, &consumer.to_be_bytes()),
        )
        .await
        {
            Ok(Ok(r)) => bincode::deserialize(&r).unwrap_or_default(),
            _ => Vec::new(),
        }
    }

    /// One random command.
    pub async fn step(&mut self) {
        let roll = self.rng.gen_range(0..100);
        let consumer = self.rng.gen_range(1..=CONSUMERS);
        match roll {
            0..=44 => {
                let id = self.next_id;
                self.next_id += 1;
                let msg = MsgRef {
                    index: id,
                    size: 10,
                    priority: None,
                    expiration_ms: None,
                    delivery_count: 0,
                };
                if let Some(outs) = self.propose(Cmd::Enqueue(msg)).await {
                    if outs.iter().any(|o| matches!(o, Out::Accepted { .. })) {
                        self.model.confirmed.insert(id);
                    }
                }
            }
            45..=51 => {
                let node = self.node();
                let prefetch = self.rng.gen_range(0..4);
                let a = Attach {
                    key: consumer,
                    node,
                    priority: 0,
                    prefetch,
                    no_ack: false,
                    exclusive: false,
                    timeout_ms: None,
                };
                self.propose(Cmd::Attach(a)).await;
            }
            52..=87 => {
                let held = self.held(consumer).await;
                if held.is_empty() {
                    return;
                }
                let n = self.rng.gen_range(1..=held.len());
                let pick: Vec<(u64, u64)> = held.into_iter().take(n).collect();
                let seqs: Vec<u64> = pick.iter().map(|(s, _)| *s).collect();
                let ids = pick.iter().map(|(_, id)| *id);
                match self.rng.gen_range(0..10) {
                    0..=6 => {
                        self.model.removed.extend(ids);
                        self.propose(Cmd::Settle { consumer, seqs }).await;
                    }
                    7 => {
                        self.model.removed.extend(ids);
                        self.propose(Cmd::Discard { consumer, seqs }).await;
                    }
                    _ => {
                        let kind = ReturnKind::Rejected;
                        self.propose(Cmd::Return {
                            consumer,
                            seqs,
                            kind,
                        })
                        .await;
                    }
                }
            }
            88..=91 => {
                self.propose(Cmd::Cancel { consumer }).await;
            }
            92..=94 => {
                self.propose(Cmd::Down { consumer }).await;
            }
            95 => {
                let node = self.node();
                self.propose(Cmd::NodeDown { node }).await;
            }
            96 => {
                let node = self.node();
                self.propose(Cmd::Unreachable { node }).await;
            }
            97 => {
                let node = self.node();
                self.propose(Cmd::Reachable { node }).await;
            }
            _ => {
                self.propose(Cmd::Tick).await;
            }
        }
    }

    /// Every member's machine, once they all agree (`None` while they do not).
    pub async fn converged(&mut self) -> Option<Final> {
        let mut seen: Option<Final> = None;
        for node in self.nodes.clone() {
            let r = tokio::time::timeout(CALL_TIMEOUT, call(&addr(&node), net::STATE, &[])).await;
            let f: Final = bincode::deserialize(&r.ok()?.ok()?).ok()?;
            match &seen {
                Some(s) if *s != f => return None,
                _ => seen = Some(f),
            }
        }
        seen
    }
}

/// Drives the workload until `until`, then waits (faults healed by then) for the members to
/// agree and checks the model against their state.
pub async fn run(
    mut w: Workload,
    until: Duration,
    settle_by: Duration,
    check: std::sync::Arc<Check>,
) -> turmoil::Result<Model> {
    while turmoil::elapsed() < until {
        w.step().await;
        let pause = w.rng.gen_range(1..30);
        tokio::time::sleep(Duration::from_millis(pause)).await;
    }
    // Faults are healed now: the members must reach one state.
    let mut last = None;
    while turmoil::elapsed() < settle_by {
        // A no-op entry makes sure the last leader's term has one committed (and applied) entry.
        w.propose(Cmd::Tick).await;
        if let Some(f) = w.converged().await {
            last = Some(f);
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let Some(f) = last else {
        let mut states = Vec::new();
        for node in w.nodes.clone() {
            let r = tokio::time::timeout(CALL_TIMEOUT, call(&addr(&node), net::STATE, &[])).await;
            let f: Option<Final> = r
                .ok()
                .and_then(|r| r.ok())
                .and_then(|b| bincode::deserialize(&b).ok());
            states.push(format!("{node}: {:?}", f.map(|f| (f.applied, f.ids.len()))));
        }
        check.violation(format!(
            "the members did not reach the same state after the faults were healed (applied index, messages): {}",
            states.join(", ")
        ));
        return Ok(w.model);
    };
    let present: BTreeSet<u64> = f.ids.iter().copied().collect();
    let lost: Vec<u64> = w
        .model
        .confirmed
        .iter()
        .filter(|id| !present.contains(id) && !w.model.removed.contains(id))
        .copied()
        .collect();
    if !lost.is_empty() {
        check.violation(format!(
            "{} confirmed messages lost (neither in the queue nor removed by the workload): {:?}",
            lost.len(),
            &lost[..lost.len().min(10)]
        ));
    }
    let mut dup = BTreeMap::new();
    for id in &f.ids {
        *dup.entry(*id).or_insert(0u32) += 1;
    }
    if let Some((id, n)) = dup.iter().find(|(_, n)| **n > 1) {
        check.violation(format!("message {id} is in the queue {n} times"));
    }
    Ok(w.model)
}
