//! One simulated member: the queue machine as the state machine of warren-cluster's Raft node
//! (openraft, its log store on files), serving Raft's messages and the workload's requests
//! over the simulated network. Restarted by the simulation after a crash, it opens its files
//! again, possibly with a torn tail the simulation left.

use std::collections::HashSet;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard};

use turmoil::net::{TcpListener, TcpStream};
use warren_cluster::{Meta, MetaConfig, Node, StateMachine};
use warren_queue::replicated::{Cmd, Machine, MachineConfig, Out, Snapshot};
use warren_queue::Limits;

use crate::check::Check;
use crate::client::Final;
use crate::net::{self, SimTransport};

/// The queue machine as a Raft state machine, checked as it applies.
pub struct SimSm {
    name: String,
    check: Arc<Check>,
    st: Mutex<St>,
}

struct St {
    machine: Machine,
    applied: u64,
    /// Messages (by id) this member has seen delivered since it started or restored.
    delivered: HashSet<u64>,
}

pub fn fresh_machine() -> Machine {
    Machine::new(MachineConfig::default(), Limits::default(), 0)
}

impl SimSm {
    pub fn new(name: &str, check: Arc<Check>) -> SimSm {
        SimSm {
            name: name.to_string(),
            check,
            st: Mutex::new(St {
                machine: fresh_machine(),
                applied: 0,
                delivered: HashSet::new(),
            }),
        }
    }

    fn lock(&self) -> MutexGuard<'_, St> {
        self.st.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn held(&self, consumer: u64) -> Vec<(u64, u64)> {
        self.lock()
            .machine
            .held_since(consumer, None)
            .into_iter()
            .map(|r| (r.seq, r.msg.index))
            .collect()
    }

    fn state(&self) -> Final {
        let st = self.lock();
        let mut ids: Vec<u64> = st.machine.refs().map(|(_, m)| m.index).collect();
        ids.sort_unstable();
        Final {
            applied: st.applied,
            ids,
            fingerprint: st.machine.fingerprint(),
        }
    }
}

impl StateMachine for SimSm {
    fn apply(&self, index: u64, command: &bytes::Bytes) -> Vec<u8> {
        let Ok((ts, cmd)) = bincode::deserialize::<(u64, Cmd)>(command) else {
            self.check
                .violation(format!("{}: entry {index} does not decode", self.name));
            return Vec::new();
        };
        let mut st = self.lock();
        let outs = st.machine.apply(ts, cmd);
        st.applied = index;
        if let Err(e) = st.machine.check_invariants() {
            self.check
                .violation(format!("{} after index {index}: {e}", self.name));
        }
        for o in &outs {
            if let Out::Deliver {
                msg, redelivered, ..
            } = o
            {
                if !st.delivered.insert(msg.index) && !redelivered {
                    self.check.violation(format!(
                        "{} at index {index}: message {} delivered again without the redelivered flag",
                        self.name, msg.index
                    ));
                }
            }
        }
        let fingerprint = st.machine.fingerprint();
        drop(st);
        self.check.applied(&self.name, index, &fingerprint);
        bincode::serialize(&outs).unwrap_or_default()
    }

    fn snapshot(&self) -> Vec<u8> {
        bincode::serialize(&self.lock().machine.snapshot()).unwrap_or_default()
    }

    fn restore(&self, index: Option<u64>, snapshot: &[u8]) {
        let mut st = self.lock();
        st.delivered.clear();
        st.applied = index.unwrap_or(0);
        st.machine = if snapshot.is_empty() {
            fresh_machine()
        } else {
            match bincode::deserialize::<Snapshot>(snapshot).map(Machine::restore) {
                Ok(Ok(m)) => m,
                _ => {
                    self.check
                        .violation(format!("{}: a snapshot does not restore", self.name));
                    fresh_machine()
                }
            }
        };
    }
}

/// A member's software: opens its Raft node (the first member forms the group at its first
/// start) and serves requests until the simulation crashes it.
pub async fn run(
    i: usize,
    members: Vec<Node>,
    dir: PathBuf,
    check: Arc<Check>,
    transport: Arc<SimTransport>,
) -> turmoil::Result {
    let me = members[i].clone();
    let sm = Arc::new(SimSm::new(&me.name, check.clone()));
    let config = MetaConfig {
        election_timeout_min_ms: 150,
        election_timeout_max_ms: 300,
        heartbeat_ms: 50,
        propose_timeout: std::time::Duration::from_secs(2),
        snapshot_after: 48,
        group_commit: false,
    };
    let name = me.name.clone();
    let meta = match Meta::open(&dir, me, sm.clone(), transport, config).await {
        Ok(m) => m,
        Err(e) => {
            // A member that cannot restart is a finding (a torn tail must be cut off).
            check.violation(format!("{name} cannot start: {e}"));
            return Err(e.to_string().into());
        }
    };
    let debug = std::env::var_os("WARREN_SIM_DEBUG").is_some();
    if debug {
        eprintln!("{:?} {name} started", turmoil::elapsed());
    }
    let listener = match TcpListener::bind(("0.0.0.0", net::PORT)).await {
        Ok(l) => l,
        Err(e) => {
            check.violation(format!("{name} cannot listen: {e}"));
            return Err(e.into());
        }
    };
    if i == 0 && !meta.is_initialized() {
        let m = meta.clone();
        tokio::spawn(async move {
            if let Err(e) = m.initialize_with(members).await {
                eprintln!("initialize: {e}");
            }
        });
    }
    loop {
        match listener.accept().await {
            Ok((s, _)) => {
                tokio::spawn(serve(s, meta.clone(), sm.clone()));
            }
            // A connection that failed on the way in: the next one.
            Err(_) => tokio::time::sleep(std::time::Duration::from_millis(1)).await,
        }
    }
}

async fn serve(mut s: TcpStream, meta: Meta, sm: Arc<SimSm>) -> std::io::Result<()> {
    let (kind, payload) = net::read_request(&mut s).await?;
    let reply = match kind {
        net::RAFT => meta.handle_rpc(payload.into()).await,
        net::PROPOSE => match meta.propose_at_leader(payload).await {
            Ok(r) => [vec![1], r].concat(),
            Err(_) => vec![0],
        },
        net::HELD => {
            let consumer = u64::from_be_bytes(
                payload
                    .get(..8)
                    .and_then(|b| b.try_into().ok())
                    .unwrap_or_default(),
            );
            bincode::serialize(&sm.held(consumer)).unwrap_or_default()
        }
        net::STATE => bincode::serialize(&sm.state()).unwrap_or_default(),
        _ => Vec::new(),
    };
    net::write_reply(&mut s, &reply).await
}
