//! A deterministic simulation of a replicated queue's Raft group (issue 31, item 4), on
//! turmoil: 3 or 5 members in one process, each warren-cluster's Raft node (openraft, its log
//! store on files) with the queue machine (`warren_queue::replicated::Machine`) as its state
//! machine, a workload of random commands (`client.rs`), and a seeded schedule of faults:
//! - the network: random message delays, links that fail and come back (turmoil), partitions
//!   of one member from the others, requests delivered twice (`net.rs`);
//! - crashes: a member stops at once and restarts later, its log with a torn tail (a partial
//!   record after the last one, as a crash mid-write leaves);
//! - time: turmoil's simulated clock; openraft's election timeouts drawn from a generator
//!   seeded by the run (`warren_cluster::runtime`).
//!
//! Checked (`check.rs`, `client.rs`): members agree at every index, the machine's invariants
//! hold after every entry (a message is never held by two consumers at once), a message
//! delivered again is flagged redelivered, and once the faults are healed every member reaches
//! the same state, in which no confirmed message is missing.
//!
//! What is simulated and what is real: the network, the clock and the scheduling are
//! turmoil's; the files are real, under a fresh directory (on tmpfs when there is one), so a
//! crash loses nothing written before it, and a torn tail is made by the simulation. The
//! broker's layer above the group (`replicated/`: entries with bodies, the leader's acting on
//! outputs) is not in it; its log replay is checked by the broker's own tests.

pub mod check;
pub mod client;
pub mod net;
pub mod node;

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use warren_cluster::Node;

use crate::check::Check;
use crate::net::SimTransport;

#[derive(Debug, Clone)]
pub struct Options {
    pub seed: u64,
    pub members: usize,
    /// Simulated time the workload runs, faults included.
    pub work: Duration,
    pub faults: bool,
}

impl Options {
    pub fn new(seed: u64, members: usize) -> Options {
        Options {
            seed,
            members,
            work: Duration::from_secs(12),
            faults: true,
        }
    }
}

#[derive(Debug)]
pub struct Report {
    pub seed: u64,
    pub members: usize,
    pub confirmed: usize,
    pub ops: u64,
    pub failed_ops: u64,
    pub crashes: u32,
    pub partitions: u32,
    pub applies: u64,
    pub violations: Vec<String>,
}

impl Report {
    pub fn ok(&self) -> bool {
        self.violations.is_empty()
    }
}

/// Where a run's files go: tmpfs when there is one (fsync is then free, and a crash in the
/// simulation never loses written data anyway).
fn base_dir() -> PathBuf {
    let shm = Path::new("/dev/shm");
    if shm.is_dir() {
        shm.to_path_buf()
    } else {
        std::env::temp_dir()
    }
}

/// Appends a partial record to the member's newest log segment: a crash mid-write.
fn tear(dir: &Path, rng: &mut StdRng) {
    let Ok(rd) = std::fs::read_dir(dir.join("log")) else {
        return;
    };
    let newest = rd
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "seg"))
        .max();
    if let Some(p) = newest {
        use std::io::Write;
        let n = rng.gen_range(1..40);
        let junk: Vec<u8> = (0..n).map(|_| rng.gen()).collect();
        if let Ok(mut f) = std::fs::OpenOptions::new().append(true).open(&p) {
            let _ = f.write_all(&junk);
        }
    }
}

/// Runs one seed. A seed replays exactly in a fresh process; after other runs in the same
/// process it may not (some state below the simulation is process-wide), though every run
/// checks the same.
pub fn run(opts: &Options) -> Report {
    warren_cluster::runtime::seed_rng(opts.seed);
    let root = base_dir().join(format!(
        "warren-sim-{}-{}-{}",
        std::process::id(),
        opts.seed,
        opts.members
    ));
    let _ = std::fs::remove_dir_all(&root);
    let names: Vec<String> = (1..=opts.members).map(|i| format!("n{i}")).collect();
    let members: Vec<Node> = names
        .iter()
        .map(|n| Node {
            name: n.clone(),
            addr: format!("{n}:{}", net::PORT),
        })
        .collect();
    let check = Check::new();
    let transport = Arc::new(SimTransport {
        rng: Arc::new(Mutex::new(StdRng::seed_from_u64(opts.seed ^ 0xd0b1e))),
        duplicate: if opts.faults { 0.03 } else { 0.0 },
    });
    let mut b = turmoil::Builder::new();
    b.rng_seed(opts.seed)
        .simulation_duration(opts.work + Duration::from_secs(60))
        .tick_duration(Duration::from_millis(1))
        .min_message_latency(Duration::from_millis(1))
        .max_message_latency(Duration::from_millis(if opts.faults { 25 } else { 2 }));
    if opts.faults {
        // turmoil breaks a link at a message and repairs it at a later message on it: short
        // bursts of loss (a TCP connection caught in one stalls, and is timed out). Longer
        // partitions are the schedule's own.
        b.fail_rate(0.002).repair_rate(0.5);
    }
    let mut sim = b.build();
    for (i, name) in names.iter().enumerate() {
        let (members, dir, check, transport) = (
            members.clone(),
            root.join(name),
            check.clone(),
            transport.clone(),
        );
        sim.host(name.as_str(), move || {
            node::run(
                i,
                members.clone(),
                dir.clone(),
                check.clone(),
                transport.clone(),
            )
        });
    }
    let model = Arc::new(Mutex::new(None));
    {
        let (names, check, model, seed) = (names.clone(), check.clone(), model.clone(), opts.seed);
        let (until, settle_by) = (opts.work, opts.work + Duration::from_secs(55));
        sim.client("workload", async move {
            // Time for the first election.
            tokio::time::sleep(Duration::from_millis(800)).await;
            let w = client::Workload::new(names, seed);
            let m = client::run(w, until, settle_by, check).await?;
            *model.lock().unwrap_or_else(|e| e.into_inner()) = Some(m);
            Ok(())
        });
    }
    let mut faults = StdRng::seed_from_u64(opts.seed ^ 0xfa17);
    let (mut crashes, mut partitions) = (0, 0);
    // Each fault: (what, member, when it ends).
    let mut active: Vec<(bool, usize, Duration)> = Vec::new();
    let mut next_fault = Duration::from_millis(faults.gen_range(1500..3000));
    let heal_at = opts.work.saturating_sub(Duration::from_secs(1));
    let mut error = None;
    loop {
        match sim.step() {
            Ok(true) => break,
            Ok(false) => {}
            Err(e) => {
                error = Some(e.to_string());
                break;
            }
        }
        let now = sim.elapsed();
        // Faults that are over, or all of them once the workload is winding down.
        let mut k = 0;
        while k < active.len() {
            let (crash, m, until) = active[k];
            if now >= until || now >= heal_at {
                let name = names[m].as_str();
                if crash {
                    tear(&root.join(name), &mut faults);
                    sim.bounce(name);
                } else {
                    for other in names.iter().filter(|o| o.as_str() != name) {
                        sim.repair(name, other.as_str());
                    }
                }
                active.remove(k);
            } else {
                k += 1;
            }
        }
        if opts.faults && now >= next_fault && now < heal_at {
            next_fault = now + Duration::from_millis(faults.gen_range(300..2500));
            let m = faults.gen_range(0..opts.members);
            // One fault per member at a time; sometimes a majority is faulty at once.
            if !active.iter().any(|(_, x, _)| *x == m) {
                let until = now + Duration::from_millis(faults.gen_range(200..3000));
                let name = names[m].as_str();
                if faults.gen_bool(0.5) {
                    sim.crash(name);
                    crashes += 1;
                    active.push((true, m, until));
                } else {
                    for other in names.iter().filter(|o| o.as_str() != name) {
                        sim.partition(name, other.as_str());
                    }
                    partitions += 1;
                    active.push((false, m, until));
                }
            }
        }
    }
    if std::env::var_os("WARREN_SIM_DEBUG").is_some() {
        let running: Vec<bool> = names
            .iter()
            .map(|n| sim.is_host_running(n.as_str()))
            .collect();
        eprintln!(
            "end at {:?}: running {running:?}, faults still active {active:?}",
            sim.elapsed()
        );
    }
    if let Some(e) = error {
        check.violation(format!("the simulation failed: {e}"));
    }
    let model = model.lock().unwrap_or_else(|e| e.into_inner()).take();
    if model.is_none() {
        check.violation("the workload did not finish".into());
    }
    drop(sim);
    let _ = std::fs::remove_dir_all(&root);
    let model = model.unwrap_or_default();
    Report {
        seed: opts.seed,
        members: opts.members,
        confirmed: model.confirmed.len(),
        ops: model.ops,
        failed_ops: model.failed,
        crashes,
        partitions,
        applies: check.applies(),
        violations: check.violations(),
    }
}
