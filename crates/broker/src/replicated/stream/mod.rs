//! A replicated stream's group ([`StreamGroup`]): a Raft group (openraft, as a replicated
//! queue's) per stream, over the members that hold a copy of it.
//!
//! - **The log carries the messages.** A publish on any member is batched into an entry
//!   (`[version][leader's time][messages][tracking records]`, each message in its stored form
//!   with its offset left to fill), proposed through the leader; the leader pipelines up to
//!   [`IN_FLIGHT`] entries. The confirm goes out once the entry is committed: a majority of
//!   members has it in its Raft log, fsynced (RabbitMQ's streams confirm without an fsync).
//! - **Apply writes the stream.** Every member applies each committed entry to its own segments
//!   as one chunk (`queue/stream/replica.rs`): the same offsets, the same chunks, the same
//!   segment files on every member, so consumers on any member read a local copy. A new leader
//!   has applied every committed entry: no confirmed message is lost, no offset given twice.
//! - **Snapshots are the segments.** A member's snapshot is the point its segments hold
//!   durably (Raft index, next offset, first offset), so its Raft log is dropped up to there:
//!   the messages then live in the segments only. A member sent a snapshot past its copy (new,
//!   or down while the others dropped their logs) fetches the missing offsets from another
//!   member's segments ([`GroupNet::fetch`]) before applying anything after it.
//!
//! The state machine's version is the entry's first byte and the snapshot's; a newer one is
//! refused (logged, not applied) rather than misread.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use bytes::Bytes;
use parking_lot::Mutex;

use super::net::GroupNet;
use sm::StreamSm;
use wire::{confirmed_among, decode_fetched, encode_entry, CONFIRMED};

mod sm;
mod wire;

use crate::confirm::ConfirmHandle;
use crate::queue::stream::{Stream, StreamGroup, Track};
use crate::queue::Enqueued;
pub use wire::encode_fetched;

/// The entry and snapshot format (the stream state machine's version).
pub const MACHINE_VERSION: u8 = 1;
/// Entries the leader keeps in flight.
const IN_FLIGHT: usize = 4;
/// An entry carries at most about this much.
const ENTRY_BYTES: usize = 1024 * 1024;
/// Above this much proposed and not committed, publishers wait.
const PRESSURE_BYTES: usize = 64 * 1024 * 1024;
/// What a fetch from another member asks for at once.
const FETCH_BYTES: u32 = 4 * 1024 * 1024;

/// Publishes and tracking records waiting for the next entry.
#[derive(Default)]
struct Batch {
    msgs: Vec<(Bytes, u32)>,
    bytes: usize,
    confirms: Vec<Arc<ConfirmHandle>>,
    tracks: Vec<Track>,
}

/// A replicated stream as this node runs it (it is one of the members).
pub struct ReplicatedStream {
    stream: Weak<Stream>,
    name: Arc<str>,
    vhost: Arc<str>,
    group: u64,
    me: String,
    members: parking_lot::RwLock<Vec<String>>,
    dir: std::path::PathBuf,
    net: Arc<dyn GroupNet>,
    meta: parking_lot::RwLock<Option<warren_cluster::Meta>>,
    leader: super::group::Leader,
    batch: Mutex<Batch>,
    wake: tokio::sync::Notify,
    in_flight_bytes: AtomicUsize,
    deleted: AtomicBool,
    stop: tokio::sync::watch::Sender<bool>,
    /// Stops this node's current role (member or not): replaced for each role.
    role: Mutex<tokio::sync::watch::Sender<bool>>,
    stopped: tokio::sync::watch::Sender<bool>,
}

impl std::fmt::Debug for ReplicatedStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ReplicatedStream({})", self.name)
    }
}

impl ReplicatedStream {
    /// Makes `stream` a member of its group (`group`, over `members`; the Raft state under
    /// `dir`) and starts the group in the background (the first member bootstraps a new one).
    pub fn start(
        stream: &Arc<Stream>,
        group: u64,
        members: Vec<String>,
        me: String,
        dir: std::path::PathBuf,
        net: Arc<dyn GroupNet>,
    ) -> std::io::Result<Arc<ReplicatedStream>> {
        let r = Arc::new(ReplicatedStream {
            stream: Arc::downgrade(stream),
            name: stream.name.clone(),
            vhost: stream.vhost.clone(),
            group,
            me,
            members: parking_lot::RwLock::new(members),
            dir,
            net,
            meta: parking_lot::RwLock::new(None),
            leader: super::group::Leader::default(),
            batch: Mutex::new(Batch::default()),
            wake: tokio::sync::Notify::new(),
            in_flight_bytes: AtomicUsize::new(0),
            deleted: AtomicBool::new(false),
            stop: tokio::sync::watch::channel(false).0,
            role: Mutex::new(tokio::sync::watch::channel(false).0),
            stopped: tokio::sync::watch::channel(false).0,
        });
        if r.is_member() {
            stream.join_group(r.clone())?;
        } else {
            stream.follow_group(r.clone());
        }
        tokio::spawn(r.clone().run());
        Ok(r)
    }

    /// The members changed (a committed metadata entry, on every node): a node that joins
    /// starts a member's role (its read copy cut back, the group's leader sends it the rest),
    /// one that leaves stops it and keeps a read copy.
    pub fn set_members(&self, members: Vec<String>) {
        let was = self.is_member();
        *self.members.write() = members;
        if was != self.is_member() {
            self.role.lock().send_replace(true);
        }
    }

    /// This node holds a member's copy (else a read copy, fed from the members').
    pub fn is_member(&self) -> bool {
        self.members.read().contains(&self.me)
    }

    pub fn members(&self) -> Vec<String> {
        self.members.read().clone()
    }

    pub fn group_id(&self) -> u64 {
        self.group
    }

    /// This node's copy.
    pub fn stream(&self) -> Option<Arc<Stream>> {
        self.stream.upgrade()
    }

    /// This member's Raft log, once its group has opened.
    pub fn raft_log(&self) -> Option<warren_cluster::RaftLog> {
        self.meta.read().as_ref().map(|m| m.raft_log())
    }

    /// Waits until the group knows its leader (a fresh declare waits for the first election).
    pub async fn wait_leader(&self, max: Duration) -> bool {
        self.leader.wait(max).await
    }

    /// Stops the group (its state stays on disk) and waits until it has.
    pub async fn close(&self) {
        self.stop_all();
        let mut s = self.stopped.subscribe();
        let _ = s.wait_for(|s| *s).await;
    }

    fn stop_all(&self) {
        self.stop.send_replace(true);
        self.role.lock().send_replace(true);
        self.wake.notify_one();
    }

    /// This node's roles, one after the other, until the stream is stopped or deleted: a
    /// member's (`serve`) or a read copy's (`outside`); a change of members switches.
    async fn run(self: Arc<Self>) {
        // `start` made the first role's copy a member's.
        let mut joined = self.is_member();
        loop {
            let (tx, rx) = tokio::sync::watch::channel(false);
            *self.role.lock() = tx;
            if *self.stop.borrow() {
                break;
            }
            let member = self.is_member();
            if member && !std::mem::take(&mut joined) {
                if let Some(s) = self.stream.upgrade() {
                    if let Err(e) = s.join_group(self.clone()) {
                        tracing::error!(stream = %self.name, vhost = %self.vhost, error = %e, "cannot make this node's copy a member's");
                        break;
                    }
                }
            }
            if member {
                self.clone().serve(rx).await;
            } else {
                self.clone().outside(rx).await;
            }
            if *self.stop.borrow() {
                break;
            }
            if member && !self.is_member() {
                // No longer a member: its Raft state goes, its copy stays as a read copy.
                tracing::info!(stream = %self.name, vhost = %self.vhost, "this node left the stream's group: it keeps a read copy");
                if let Some(s) = self.stream.upgrade() {
                    s.leave_group();
                }
                let _ = std::fs::remove_dir_all(&self.dir);
            }
        }
        self.fail_batch();
        if self.deleted.load(Ordering::Acquire) {
            let _ = std::fs::remove_dir_all(self.dir.parent().unwrap_or(&self.dir));
        }
        self.stopped.send_replace(true);
    }

    /// A member: opens the group, bootstraps it if new and this is its first member, follows
    /// who leads, and proposes until its role stops.
    async fn serve(self: Arc<Self>, mut stop: tokio::sync::watch::Receiver<bool>) {
        // A copy whose segments lost part of what they held durably gets it back from another
        // member before its group applies anything more.
        if let Some(s) = self.stream.upgrade() {
            if let Some((index, from, to)) = s.take_missing() {
                if self.members().iter().any(|m| *m != self.me) {
                    self.catch_up(&s, from, to).await;
                    s.caught_up(index, to);
                } else {
                    tracing::error!(stream = %self.name, vhost = %self.vhost, from, to, "stream member: offsets it held durably are lost and no other member holds them");
                }
            }
        }
        let sm = Arc::new(StreamSm {
            stream: self.stream.clone(),
            group: Arc::downgrade(&self),
            snapshot_at: Mutex::new(0),
        });
        let what = format!("stream '{}' in vhost '{}'", self.name, self.vhost);
        let members = self.members();
        let opened = super::group::open(
            &self.dir, &self.me, &members, self.group, sm, &self.net, &what,
        );
        let meta = match opened.await {
            Ok(m) => m,
            Err(e) => {
                tracing::error!(stream = %self.name, vhost = %self.vhost, error = %e, "cannot open the stream's group");
                let _ = stop.wait_for(|s| *s).await;
                return;
            }
        };
        *self.meta.write() = Some(meta.clone());
        tokio::spawn(self.clone().follow(meta.clone(), stop.clone()));
        let slots = Arc::new(tokio::sync::Semaphore::new(IN_FLIGHT));
        while let Some((entry, confirms, bytes)) = self.next_entry(&mut stop).await {
            let Ok(permit) = slots.clone().acquire_owned().await else {
                break;
            };
            let done = self.clone();
            match meta.submit(entry).await {
                // This node leads: in flight, in order.
                Ok(committed) => {
                    tokio::spawn(async move {
                        let ok = committed.await.is_ok();
                        done.settle(confirms, bytes, ok);
                        drop(permit);
                    });
                }
                // Through the leader, one at a time (entries stay in order).
                Err(entry) => {
                    let ok = match meta.propose(entry.to_vec()).await {
                        Ok(_) => true,
                        Err(e) => {
                            tracing::debug!(stream = %self.name, error = %e, "a stream entry was not committed");
                            false
                        }
                    };
                    done.settle(confirms, bytes, ok);
                    drop(permit);
                }
            }
        }
        // What is still proposed settles (or times out) before the group stops.
        let _ = slots.acquire_many(IN_FLIGHT as u32).await;
        self.net.register(self.group, None);
        *self.meta.write() = None;
        meta.shutdown().await;
    }

    /// A node that is no member: a read copy, fed from the members' segments (`feed`), and its
    /// publishes proposed through a member, one entry at a time (in order).
    async fn outside(self: Arc<Self>, mut stop: tokio::sync::watch::Receiver<bool>) {
        let feed = tokio::spawn(self.clone().feed(stop.clone()));
        tokio::spawn(self.clone().poll_leader(stop.clone()));
        self.forward_entries(&mut stop).await;
        // The feed ends before this role does: a fetch still in flight must not touch the copy
        // once it is a member's (cut back to what the group applied, fed only by the group).
        // It is aborted at an await, never inside `append_fetched`.
        feed.abort();
        let _ = feed.await;
    }

    /// A node that is no member proposes its publishes through a member, one entry at a time
    /// (in order), until its role stops.
    async fn forward_entries(&self, stop: &mut tokio::sync::watch::Receiver<bool>) {
        while let Some((entry, confirms, bytes)) = self.next_entry(stop).await {
            let ok = match self
                .net
                .forward(self.group, self.members(), entry.to_vec())
                .await
            {
                Ok(_) => true,
                Err(e) => {
                    tracing::debug!(stream = %self.name, error = %e, "a stream entry was not committed");
                    false
                }
            };
            self.settle(confirms, bytes, ok);
        }
    }

    /// Feeds a read copy: fetches what the members have committed past it, waiting there for
    /// more (a long poll), from the leader first.
    async fn feed(self: Arc<Self>, stop: tokio::sync::watch::Receiver<bool>) {
        let mut wait = Duration::from_millis(100);
        while !*stop.borrow() {
            let Some(s) = self.stream.upgrade() else {
                return;
            };
            let from = s.next_offset();
            let mut members = self.members();
            if let Some(l) = self.leader.get() {
                members.sort_by_key(|m| *m != l);
            }
            let mut served = false;
            for m in members {
                match self
                    .net
                    .fetch(&m, self.group, from, FETCH_BYTES, 1_000)
                    .await
                {
                    Ok(body) => {
                        let Some((entries, chunks)) = decode_fetched(body) else {
                            continue;
                        };
                        if let Some(first) = entries.first().map(|e| e.offset) {
                            if let Err(e) = s.start_at(first) {
                                tracing::warn!(stream = %self.name, error = %e, "cannot move the read copy to the members' first offset");
                            }
                            s.append_fetched(&entries, &chunks, u64::MAX);
                        }
                        served = true;
                        break;
                    }
                    Err(e) => {
                        tracing::debug!(stream = %self.name, member = %m, error = %e, "cannot fetch from this member")
                    }
                }
            }
            if served {
                wait = Duration::from_millis(100);
            } else {
                tokio::time::sleep(wait).await;
                wait = (wait * 2).min(Duration::from_secs(2));
            }
        }
    }

    /// A node that is no member asks the members who leads, every second.
    async fn poll_leader(self: Arc<Self>, stop: tokio::sync::watch::Receiver<bool>) {
        let every = Duration::from_secs(1);
        self.leader
            .poll(&self.net, self.group, || self.members(), every, stop)
            .await
    }

    /// Follows who leads the group.
    async fn follow(
        self: Arc<Self>,
        meta: warren_cluster::Meta,
        mut stop: tokio::sync::watch::Receiver<bool>,
    ) {
        let mut status = meta.watch();
        loop {
            let leader = status.borrow_and_update().leader_name().map(String::from);
            let mine = leader.as_deref() == Some(self.me.as_str());
            if self.leader.set(leader) && mine {
                tracing::info!(stream = %self.name, vhost = %self.vhost, "this node leads the replicated stream");
            }
            tokio::select! {
                r = status.changed() => if r.is_err() { return },
                _ = stop.wait_for(|s| *s) => return,
            }
        }
    }

    /// Waits for the next entry to propose (`take_entry`); `None` once the role stops.
    async fn next_entry(
        &self,
        stop: &mut tokio::sync::watch::Receiver<bool>,
    ) -> Option<(Bytes, Vec<Arc<ConfirmHandle>>, usize)> {
        loop {
            let woken = self.wake.notified();
            if *stop.borrow() {
                return None;
            }
            if let Some(e) = self.take_entry() {
                return Some(e);
            }
            tokio::select! {
                _ = woken => {}
                _ = stop.wait_for(|s| *s) => {}
            }
        }
    }

    /// The next entry from what is waiting: its bytes, its confirms, its messages' bytes.
    fn take_entry(&self) -> Option<(Bytes, Vec<Arc<ConfirmHandle>>, usize)> {
        let mut b = self.batch.lock();
        if b.msgs.is_empty() && b.tracks.is_empty() {
            return None;
        }
        let mut n = 0;
        let mut size = 0;
        while n < b.msgs.len() && (n == 0 || size + b.msgs[n].0.len() <= ENTRY_BYTES) {
            size += b.msgs[n].0.len();
            n += 1;
        }
        let msgs: Vec<(Bytes, u32)> = b.msgs.drain(..n).collect();
        // Confirms go with the entry holding their message: handles are in publish order,
        // one per confirmed message, so this entry's come first.
        let c = b.confirms.len().min(confirmed_among(&msgs));
        let confirms: Vec<Arc<ConfirmHandle>> = b.confirms.drain(..c).collect();
        let tracks = std::mem::take(&mut b.tracks);
        b.bytes -= size;
        drop(b);
        Some((
            encode_entry(crate::clock::unix_ms(), &msgs, &tracks),
            confirms,
            size,
        ))
    }

    fn settle(&self, confirms: Vec<Arc<ConfirmHandle>>, bytes: usize, ok: bool) {
        crate::confirm::complete_all(confirms.into_iter().map(|h| (h, ok)));
        let before = self.in_flight_bytes.fetch_sub(bytes, Ordering::AcqRel);
        if before >= PRESSURE_BYTES && before - bytes < PRESSURE_BYTES {
            if let Some(s) = self.stream.upgrade() {
                s.relieve();
            }
        }
    }

    /// Nothing more will be proposed: what waits is refused (nacked).
    fn fail_batch(&self) {
        let b = std::mem::take(&mut *self.batch.lock());
        self.settle(b.confirms, b.bytes, false);
    }
}

impl StreamGroup for ReplicatedStream {
    fn publish(&self, data: Bytes, patch: usize, confirm: Option<Arc<ConfirmHandle>>) -> Enqueued {
        if self.deleted.load(Ordering::Acquire) || *self.stop.borrow() {
            return Enqueued::Gone;
        }
        let len = data.len();
        let mut b = self.batch.lock();
        let flag = if confirm.is_some() { CONFIRMED } else { 0 };
        b.msgs.push((data, patch as u32 | flag));
        b.confirms.extend(confirm);
        b.bytes += len;
        drop(b);
        self.in_flight_bytes.fetch_add(len, Ordering::AcqRel);
        self.wake.notify_one();
        Enqueued::Accepted
    }

    fn track(&self, record: Track) {
        self.batch.lock().tracks.push(record);
        self.wake.notify_one();
    }

    fn group(&self) -> (u64, Vec<String>) {
        (self.group, self.members())
    }

    fn leader(&self) -> Option<String> {
        self.leader.get()
    }

    fn pressured(&self) -> bool {
        self.in_flight_bytes.load(Ordering::Relaxed) >= PRESSURE_BYTES
    }

    fn delete(&self) {
        self.deleted.store(true, Ordering::Release);
        self.stop_all();
    }

    fn set_members(&self, members: Vec<String>) {
        ReplicatedStream::set_members(self, members)
    }
}
