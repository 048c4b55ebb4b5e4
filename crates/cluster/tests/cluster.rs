//! Multi-node tests over an in-memory transport that calls `handle_rpc` directly.

#![allow(clippy::unwrap_used)]

use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use warren_cluster::{
    node_id, Meta, MetaConfig, Node, ProposeError, SnapshotPoint, StateMachine, Transport,
    TransportError,
};

/// The nodes by link address, and the addresses cut off from everyone.
#[derive(Default)]
struct Net {
    nodes: Mutex<HashMap<String, Meta>>,
    down: Mutex<HashSet<String>>,
}

impl Net {
    fn cut(&self, addr: &str) {
        self.down.lock().unwrap().insert(addr.to_string());
    }
    fn heal(&self, addr: &str) {
        self.down.lock().unwrap().remove(addr);
    }
}

struct MemTransport {
    from: String,
    net: Arc<Net>,
}

impl Transport for MemTransport {
    fn call(
        &self,
        to: &Node,
        request: Vec<u8>,
    ) -> Pin<Box<dyn Future<Output = Result<Vec<u8>, TransportError>> + Send>> {
        let net = self.net.clone();
        let from = self.from.clone();
        let to = to.addr.clone();
        Box::pin(async move {
            let target = {
                let down = net.down.lock().unwrap();
                if down.contains(&from) || down.contains(&to) {
                    return Err(TransportError::Unreachable(to, "partitioned".into()));
                }
                net.nodes.lock().unwrap().get(&to).cloned()
            };
            match target {
                Some(meta) => Ok(meta.handle_rpc(request.into()).await),
                None => Err(TransportError::Unreachable(to, "not running".into())),
            }
        })
    }
}

/// Applied commands in order; the reply is how many have been applied.
///
/// A `held` toy is a set instead, after a replicated queue: `add X` and `del X`, the reply the
/// set's size, and snapshots taken before the entry of the oldest item still held (its log is
/// kept from there), holding nothing themselves.
#[derive(Default)]
struct Toy {
    applied: Mutex<Vec<(u64, String)>>,
    restores: AtomicUsize,
    held: bool,
    live: Mutex<std::collections::BTreeMap<String, u64>>,
    last: std::sync::atomic::AtomicU64,
}

impl Toy {
    fn commands(&self) -> Vec<String> {
        self.applied
            .lock()
            .unwrap()
            .iter()
            .map(|(_, c)| c.clone())
            .collect()
    }
}

impl StateMachine for Toy {
    fn apply(&self, index: u64, command: &bytes::Bytes) -> Vec<u8> {
        if self.held {
            let cmd = String::from_utf8(command.to_vec()).unwrap();
            let mut live = self.live.lock().unwrap();
            if let Some(x) = cmd.strip_prefix("add ") {
                live.insert(x.to_string(), index);
            } else if let Some(x) = cmd.strip_prefix("del ") {
                live.remove(x);
            }
            self.last.store(index, Ordering::SeqCst);
            return live.len().to_string().into_bytes();
        }
        let mut applied = self.applied.lock().unwrap();
        if let Some((last, _)) = applied.last() {
            assert!(index > *last, "indexes increase");
        }
        applied.push((index, String::from_utf8(command.to_vec()).unwrap()));
        applied.len().to_string().into_bytes()
    }
    fn snapshot(&self) -> Vec<u8> {
        serde_json::to_vec(&*self.applied.lock().unwrap()).unwrap()
    }
    fn snapshot_point(&self) -> SnapshotPoint {
        if !self.held {
            return SnapshotPoint::Now;
        }
        let live = self.live.lock().unwrap();
        let at = match live.values().min() {
            Some(oldest) => oldest - 1,
            None => self.last.load(Ordering::SeqCst),
        };
        SnapshotPoint::At(at, Vec::new())
    }
    fn restore(&self, _index: Option<u64>, snapshot: &[u8]) {
        if self.held {
            assert!(snapshot.is_empty());
            self.live.lock().unwrap().clear();
            self.restores.fetch_add(1, Ordering::SeqCst);
            return;
        }
        *self.applied.lock().unwrap() = serde_json::from_slice(snapshot).unwrap();
        self.restores.fetch_add(1, Ordering::SeqCst);
    }
}

struct Cluster {
    net: Arc<Net>,
    base: PathBuf,
    config: MetaConfig,
    held: bool,
}

struct Running {
    meta: Meta,
    toy: Arc<Toy>,
    addr: String,
}

fn test_config() -> MetaConfig {
    MetaConfig {
        election_timeout_min_ms: 150,
        election_timeout_max_ms: 300,
        heartbeat_ms: 50,
        propose_timeout: Duration::from_secs(1),
        snapshot_after: 0,
        // As the broker runs its groups: appends made durable on the shared sync thread.
        group_commit: true,
    }
}

impl Cluster {
    fn new(name: &str, config: MetaConfig) -> Cluster {
        let base =
            std::env::temp_dir().join(format!("warren-cluster-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&base);
        Cluster {
            net: Arc::new(Net::default()),
            base,
            config,
            held: false,
        }
    }

    async fn start(&self, name: &str) -> Running {
        self.start_at(name, name).await
    }

    async fn start_at(&self, name: &str, addr: &str) -> Running {
        let toy = Arc::new(Toy {
            held: self.held,
            ..Toy::default()
        });
        let me = Node {
            name: name.to_string(),
            addr: addr.to_string(),
        };
        let transport = Arc::new(MemTransport {
            from: addr.to_string(),
            net: self.net.clone(),
        });
        let meta = Meta::open(
            &self.base.join(name),
            me,
            toy.clone(),
            transport,
            self.config.clone(),
        )
        .await
        .expect("open");
        self.net
            .nodes
            .lock()
            .unwrap()
            .insert(addr.to_string(), meta.clone());
        Running {
            meta,
            toy,
            addr: addr.to_string(),
        }
    }

    async fn stop(&self, node: Running) {
        self.net.nodes.lock().unwrap().remove(&node.addr);
        node.meta.shutdown().await;
    }

    /// n1 bootstraps; n2 joins through n1, n3 through n2 (a follower: redirected to the leader).
    async fn three(&self) -> Vec<Running> {
        let n1 = self.start("n1").await;
        assert!(!n1.meta.is_initialized());
        n1.meta.initialize().await.expect("initialize");
        assert!(n1.meta.is_initialized());
        let n2 = self.start("n2").await;
        n2.meta.join(&["n1".to_string()]).await.expect("join n2");
        let n3 = self.start("n3").await;
        n3.meta
            .join(&["nowhere".to_string(), "n2".to_string()])
            .await
            .expect("join n3");
        let nodes = vec![n1, n2, n3];
        for n in &nodes {
            assert!(n.meta.is_initialized());
        }
        nodes
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.base);
    }
}

async fn wait_until(what: &str, timeout: Duration, mut cond: impl FnMut() -> bool) {
    let start = Instant::now();
    while !cond() {
        assert!(start.elapsed() < timeout, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn leader_of(nodes: &[Running]) -> Option<usize> {
    let leader = nodes[0].meta.status().leader?;
    nodes.iter().position(|n| n.meta.status().id == leader)
}

async fn propose(meta: &Meta, cmd: &str) -> Result<String, ProposeError> {
    meta.propose(cmd.as_bytes().to_vec())
        .await
        .map(|r| String::from_utf8(r).unwrap())
}

#[tokio::test(flavor = "multi_thread")]
async fn replicates_in_order_and_survives_a_minority() {
    let c = Cluster::new("replicate", test_config());
    let nodes = c.three().await;
    let leader = leader_of(&nodes).expect("a leader");
    let status = nodes[leader].meta.status();
    assert_eq!(status.members.len(), 3);
    assert!(status.members.iter().all(|m| m.voter));
    let f1 = (leader + 1) % 3;
    let f2 = (leader + 2) % 3;

    // On a follower: the reply is the leader's, and the follower has applied it on return.
    assert_eq!(propose(&nodes[f1].meta, "a").await.unwrap(), "1");
    assert_eq!(nodes[f1].toy.commands(), ["a"]);
    assert_eq!(propose(&nodes[leader].meta, "b").await.unwrap(), "2");
    assert_eq!(propose(&nodes[f2].meta, "c").await.unwrap(), "3");
    wait_until("all apply 3", Duration::from_secs(5), || {
        nodes
            .iter()
            .all(|n| n.toy.applied.lock().unwrap().len() == 3)
    })
    .await;
    let first = nodes[0].toy.applied.lock().unwrap().clone();
    for n in &nodes {
        assert_eq!(
            *n.toy.applied.lock().unwrap(),
            first,
            "same order, same indexes"
        );
    }

    // One follower cut off: a majority remains.
    c.net.cut(&nodes[f2].addr);
    assert_eq!(propose(&nodes[leader].meta, "d").await.unwrap(), "4");
    assert_eq!(propose(&nodes[f1].meta, "e").await.unwrap(), "5");
    let f2_id = node_id(&nodes[f2].addr);
    wait_until("leader sees f2 unreachable", Duration::from_secs(5), || {
        let st = nodes[leader].meta.status();
        st.members
            .iter()
            .all(|m| m.reachable == (m.id != st.id).then_some(m.id != f2_id))
    })
    .await;

    // Two cut off: no quorum, the proposal fails within the timeout.
    c.net.cut(&nodes[f1].addr);
    let start = Instant::now();
    let res = propose(&nodes[leader].meta, "lost?").await;
    assert!(
        matches!(res, Err(ProposeError::Unavailable(_))),
        "got {res:?}"
    );
    assert!(start.elapsed() < Duration::from_millis(1500));
    // A cut-off follower cannot reach a leader either.
    let res = propose(&nodes[f1].meta, "nope").await;
    assert!(
        matches!(res, Err(ProposeError::Unavailable(_))),
        "got {res:?}"
    );

    // Healed: the cluster goes on, and every node converges on one history.
    c.net.heal(&nodes[f1].addr);
    c.net.heal(&nodes[f2].addr);
    let mut ok = false;
    for _ in 0..5 {
        if propose(&nodes[f2].meta, "f").await.is_ok() {
            ok = true;
            break;
        }
    }
    assert!(ok, "proposals work again after healing");
    wait_until("histories converge", Duration::from_secs(5), || {
        let a = nodes[0].toy.commands();
        a.last().map(String::as_str) == Some("f") && nodes.iter().all(|n| n.toy.commands() == a)
    })
    .await;

    // The leader cut off: the other two elect a new one and go on.
    let old = leader_of(&nodes).expect("a leader");
    c.net.cut(&nodes[old].addr);
    let other = (old + 1) % 3;
    wait_until("a new leader", Duration::from_secs(5), || {
        let l = nodes[other].meta.status().leader;
        l.is_some() && l != Some(nodes[old].meta.status().id)
    })
    .await;
    let n = nodes[other].toy.applied.lock().unwrap().len();
    assert_eq!(
        propose(&nodes[other].meta, "g").await.unwrap(),
        (n + 1).to_string()
    );
    c.net.heal(&nodes[old].addr);
    wait_until("old leader catches up", Duration::from_secs(5), || {
        nodes[old].toy.commands() == nodes[other].toy.commands()
    })
    .await;

    for n in nodes {
        c.stop(n).await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_restarted_node_reapplies_its_log_alone() {
    // A single-node cluster.
    let c = Cluster::new("restart1", test_config());
    let n1 = c.start("n1").await;
    n1.meta.initialize().await.expect("initialize");
    for i in 0..5 {
        assert_eq!(
            propose(&n1.meta, &format!("c{i}")).await.unwrap(),
            (i + 1).to_string()
        );
    }
    let before = n1.toy.applied.lock().unwrap().clone();
    c.stop(n1).await;
    let n1 = c.start("n1").await;
    assert!(n1.meta.is_initialized());
    assert_eq!(*n1.toy.applied.lock().unwrap(), before);
    assert_eq!(n1.toy.restores.load(Ordering::SeqCst), 0);
    assert_eq!(propose(&n1.meta, "c5").await.unwrap(), "6");
    c.stop(n1).await;

    // A member of a three-node cluster, restarted while the others are down.
    let c = Cluster::new("restart3", test_config());
    let nodes = c.three().await;
    for i in 0..4 {
        propose(&nodes[i % 3].meta, &format!("x{i}")).await.unwrap();
    }
    wait_until("all apply 4", Duration::from_secs(5), || {
        nodes.iter().all(|n| n.toy.commands().len() == 4)
    })
    .await;
    let before = nodes[1].toy.applied.lock().unwrap().clone();
    for n in nodes {
        c.stop(n).await;
    }
    let n2 = c.start("n2").await;
    assert_eq!(*n2.toy.applied.lock().unwrap(), before);
    assert!(n2.meta.is_initialized());
    let res = propose(&n2.meta, "alone").await;
    assert!(
        matches!(res, Err(ProposeError::Unavailable(_))),
        "got {res:?}"
    );
    // The others come back: a leader again, and the failed proposal is not required.
    let n1 = c.start("n1").await;
    let n3 = c.start("n3").await;
    let mut ok = false;
    for _ in 0..5 {
        if propose(&n2.meta, "together").await.is_ok() {
            ok = true;
            break;
        }
    }
    assert!(ok);
    assert_eq!(
        n2.toy.commands().last().map(String::as_str),
        Some("together")
    );
    for n in [n1, n2, n3] {
        c.stop(n).await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_late_joiner_gets_a_snapshot() {
    let c = Cluster::new(
        "snapshot",
        MetaConfig {
            snapshot_after: 5,
            ..test_config()
        },
    );
    let n1 = c.start("n1").await;
    n1.meta.initialize().await.expect("initialize");
    for i in 0..20 {
        propose(&n1.meta, &format!("s{i}")).await.unwrap();
    }
    wait_until("a snapshot on disk", Duration::from_secs(5), || {
        c.base.join("n1/snapshot.bin").exists()
    })
    .await;

    let n2 = c.start("n2").await;
    n2.meta.join(&["n1".to_string()]).await.expect("join");
    // Entry 0 was purged on n1, so only a snapshot could bring n2 up to date.
    assert!(
        n2.toy.restores.load(Ordering::SeqCst) >= 1,
        "got a snapshot"
    );
    assert_eq!(n2.toy.commands(), n1.toy.commands());
    assert_eq!(n2.toy.commands().len(), 20);
    assert_eq!(propose(&n2.meta, "after").await.unwrap(), "21");
    assert_eq!(n1.toy.commands(), n2.toy.commands());

    // A restart boots from the snapshot plus the entries after it.
    let before = n1.toy.commands();
    c.stop(n1).await;
    let n1 = c.start("n1").await;
    assert_eq!(n1.toy.restores.load(Ordering::SeqCst), 1);
    assert_eq!(n1.toy.commands(), before);
    c.stop(n1).await;
    c.stop(n2).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn snapshots_before_the_oldest_held_entry_keep_the_log_from_there() {
    let mut c = Cluster::new(
        "held",
        MetaConfig {
            snapshot_after: 5,
            ..test_config()
        },
    );
    c.held = true;
    let live = |n: &Running| {
        n.toy
            .live
            .lock()
            .unwrap()
            .keys()
            .cloned()
            .collect::<Vec<_>>()
    };
    let n1 = c.start("n1").await;
    n1.meta.initialize().await.expect("initialize");
    propose(&n1.meta, "add a").await.unwrap();
    for i in 0..30 {
        propose(&n1.meta, &format!("add b{i}")).await.unwrap();
        propose(&n1.meta, &format!("del b{i}")).await.unwrap();
    }
    // "a" pins the log: a joiner and a restart still find its entry.
    let n2 = c.start("n2").await;
    n2.meta.join(&["n1".to_string()]).await.expect("join");
    wait_until("n2 holds a", Duration::from_secs(5), || live(&n2) == ["a"]).await;
    c.stop(n1).await;
    let n1 = c.start("n1").await;
    assert_eq!(live(&n1), ["a"]);

    // Once "a" goes, the snapshot moves past it and the log before it is purged: a late
    // joiner then starts from the snapshot.
    propose(&n1.meta, "del a").await.unwrap();
    for i in 0..30 {
        propose(&n1.meta, &format!("add c{i}")).await.unwrap();
        propose(&n1.meta, &format!("del c{i}")).await.unwrap();
    }
    assert_eq!(propose(&n1.meta, "add d").await.unwrap(), "1");
    let n3 = c.start("n3").await;
    n3.meta.join(&["n1".to_string()]).await.expect("join");
    wait_until("n3 holds d", Duration::from_secs(5), || live(&n3) == ["d"]).await;
    assert!(
        n3.toy.restores.load(Ordering::SeqCst) >= 1,
        "got a snapshot"
    );
    let purged: serde_json::Value =
        serde_json::from_slice(&std::fs::read(c.base.join("n1/purged.json")).unwrap()).unwrap();
    assert!(
        purged["index"].as_u64().unwrap() > 61,
        "purged past a's entry: {purged}"
    );
    for n in [n1, n2, n3] {
        c.stop(n).await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn removes_members() {
    let c = Cluster::new("remove", test_config());
    let nodes = c.three().await;
    let leader = leader_of(&nodes).expect("a leader");
    let f1 = (leader + 1) % 3;
    let f2 = (leader + 2) % 3;
    let f2_id = nodes[f2].meta.status().id;

    // From a follower, a follower.
    nodes[f1].meta.remove(f2_id).await.expect("remove f2");
    let st = nodes[f1].meta.status();
    assert_eq!(st.members.len(), 2);
    assert!(st.members.iter().all(|m| m.id != f2_id));
    assert_eq!(propose(&nodes[f1].meta, "a").await.unwrap(), "1");
    // Removing it again is a no-op.
    nodes[leader]
        .meta
        .remove(f2_id)
        .await
        .expect("remove again");

    // From the follower, the leader: the follower is then alone and leads itself.
    let leader_id = nodes[leader].meta.status().id;
    nodes[f1]
        .meta
        .remove(leader_id)
        .await
        .expect("remove leader");
    let f1_id = nodes[f1].meta.status().id;
    wait_until("f1 leads", Duration::from_secs(5), || {
        nodes[f1].meta.status().leader == Some(f1_id)
    })
    .await;
    let st = nodes[f1].meta.status();
    assert_eq!(st.members.len(), 1);
    assert_eq!(st.members[0].id, f1_id);
    assert_eq!(propose(&nodes[f1].meta, "b").await.unwrap(), "2");
    // The last voter cannot be removed.
    assert!(nodes[f1].meta.remove(f1_id).await.is_err());

    // The watch reflects the membership.
    let w = nodes[f1].meta.watch();
    wait_until("watch shows one member", Duration::from_secs(5), || {
        w.borrow().members.len() == 1
    })
    .await;
    for n in nodes {
        c.stop(n).await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_node_with_a_new_address_rejoins() {
    let c = Cluster::new("readdress", test_config());
    let n1 = c.start("n1").await;
    n1.meta.initialize().await.expect("initialize");
    let n2 = c.start("n2").await;
    n2.meta.join(&["n1".to_string()]).await.expect("join");
    propose(&n1.meta, "a").await.unwrap();
    c.stop(n2).await;

    // Same name and directory, new link address: joining again updates the address.
    let n2 = c.start_at("n2", "n2-moved").await;
    assert!(n2.meta.is_initialized());
    n2.meta.join(&["n1".to_string()]).await.expect("rejoin");
    let st = n1.meta.status();
    let m = st
        .members
        .iter()
        .find(|m| m.id == node_id("n2"))
        .expect("n2 is a member");
    assert_eq!(m.node.addr, "n2-moved");
    assert!(m.voter);
    assert_eq!(propose(&n2.meta, "b").await.unwrap(), "2");
    assert_eq!(n2.toy.commands(), ["a", "b"]);
    c.stop(n1).await;
    c.stop(n2).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_seed_in_no_cluster_is_skipped_at_once() {
    // Two joiners started together may take each other for a seed: the one asked knows no
    // leader however long it is asked, so it says so and the joiner goes on to its next seed
    // (it used to be asked again until the proposal timeout).
    let c = Cluster::new("fellow-joiner", test_config());
    let n1 = c.start("n1").await;
    n1.meta.initialize().await.expect("initialize");
    let fellow = c.start("fellow").await;
    let n2 = c.start("n2").await;
    let e = n2
        .meta
        .join(&["fellow".to_string()])
        .await
        .expect_err("a seed in no cluster");
    assert!(e.to_string().contains("not in a cluster yet"), "{e}");
    n2.meta
        .join(&["fellow".to_string(), "n1".to_string()])
        .await
        .expect("join through the next seed");
    assert!(n2.meta.is_initialized());
    for n in [n1, fellow, n2] {
        c.stop(n).await;
    }
}
