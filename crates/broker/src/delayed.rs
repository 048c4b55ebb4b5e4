//! The `x-delayed-message` exchange's store: messages published with a positive `x-delay`
//! header wait here, ordered by due time, and are routed by the exchange's `x-delayed-type` once
//! due (RabbitMQ's `rabbitmq_delayed_message_exchange` plugin, made durable and bounded).
//!
//! - **Durable**: in a durable exchange, a persistent message is written to a [`QueueLog`]
//!   (the queues' log format: checksummed records, torn tails cut) through the group-commit
//!   persister, and its publisher is confirmed after the fsync. When it is due it is published
//!   to its queues, and its log record is acked only once every durable queue that took it has
//!   it on disk, so a crash in between redelivers it rather than losing it.
//! - **Bounded memory**: messages due soon are held in memory, ordered by `(due, seq)`, up to
//!   [`MEM_BUDGET`]. Past it, the latest are moved to spill files, one per [`BUCKET_MS`] of due
//!   time (a time-ordered index on disk), and read back a bucket at a time as their time nears
//!   or memory frees. Spill files are a cache: recovery rebuilds them from the log.
//! - **Time**: due times are Unix milliseconds, so they hold across a restart; a message whose
//!   time passed while the broker was down is routed at boot.
//!
//! One tokio task per exchange sleeps until the earliest due time; a publish that is due sooner
//! wakes it.

use crate::clock::unix_ms;
use std::collections::{BTreeMap, HashMap};
use std::fs::{self, File, OpenOptions};
use std::io::{BufWriter, Write};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Weak};

use bytes::{Buf, BufMut, Bytes, BytesMut};
use parking_lot::Mutex;
use warren_protocol::properties::BasicProperties;
use warren_protocol::table::FieldValue;
use warren_store::{LiveSet, QueueLog};

use crate::confirm::ConfirmHandle;
use crate::message::Message;
use crate::persist::{Logged, Persister};
use crate::queue::QueueRef;
use crate::queue::{fan_out, ConfirmTo, FannedOut};

/// Bytes of messages held in memory before the latest due are spilled to disk.
pub const MEM_BUDGET: u64 = 64 * 1024 * 1024;
/// What a held message costs beyond its bytes (map node, `Message`, `Arc`), for the budget.
const ENTRY_OVERHEAD: u64 = 160;
/// Width of a spill file's slice of due times.
pub const BUCKET_MS: u64 = 1000;
/// A spilled bucket is read back this long before it is due.
const LOOKAHEAD_MS: u64 = 2000;
/// Most messages routed per lock hold, so publishers are not held up by a large due batch.
const FIRE_BATCH: usize = 4096;
/// Longest a store's task sleeps with nothing due (it is woken on publish).
const IDLE_SLEEP_MS: u64 = 60_000;

type Log = QueueLog<Arc<ConfirmHandle>>;

/// The delay a message asks for: a positive integer `x-delay` header, in ms. Other values
/// (absent, zero, negative, not an integer) route it at once, as the plugin does. Out of line:
/// inlined, it grew `VHost::route_keys` past what the compiler inlines into every publish.
#[cold]
#[inline(never)]
pub fn requested_delay(properties: &Bytes) -> Option<u64> {
    if !warren_protocol::properties::may_have_header(properties, "x-delay") {
        return None;
    }
    let props = BasicProperties::decode(properties).ok()?;
    let d = props.headers.as_ref()?.get("x-delay")?.as_i64()?;
    (d > 0).then_some(d as u64)
}

/// The properties a due message is delivered with: `x-delay` negated, as the plugin does, so a
/// consumer can tell it was delayed and by how much.
fn negate_delay(properties: &Bytes) -> Bytes {
    let Ok(mut props) = BasicProperties::decode(properties) else {
        return properties.clone();
    };
    let Some(h) = props.headers.as_mut() else {
        return properties.clone();
    };
    for (k, v) in h.0.iter_mut() {
        if &**k == "x-delay" {
            *v = match *v {
                FieldValue::I8(d) => FieldValue::I8(d.wrapping_neg()),
                FieldValue::I16(d) => FieldValue::I16(d.wrapping_neg()),
                FieldValue::I32(d) => FieldValue::I32(d.wrapping_neg()),
                FieldValue::I64(d) => FieldValue::I64(d.wrapping_neg()),
                FieldValue::U8(d) => FieldValue::I16(-(d as i16)),
                FieldValue::U16(d) => FieldValue::I32(-(d as i32)),
                FieldValue::U32(d) => FieldValue::I64(-(d as i64)),
                FieldValue::U64(d) => FieldValue::I64((d as i64).wrapping_neg()),
                _ => return properties.clone(),
            };
        }
    }
    props.to_bytes()
}

/// A held message, and whether its log record must be acked once it is handed over.
struct Held {
    msg: Arc<Message>,
    logged: bool,
    /// A dead letter: the dead-letter cycle rule applies when it is routed.
    dead: bool,
}

/// In a log record, a bit of the stored message's flags byte (which `persist` reads only bit 0
/// of): the message is a dead letter. In a spill record, bit 1 of the `logged` byte.
const DEAD_LETTER_FLAG: u8 = 2;

impl Held {
    fn cost(&self) -> u64 {
        ENTRY_OVERHEAD + self.msg.body.len() as u64 + self.msg.properties.len() as u64
    }
}

/// Spill files: `<bucket>.bkt` holds the messages due in `[bucket, bucket + 1) * BUCKET_MS`.
/// Record: `due u64 | seq u64 | flags u8 (bit 0 logged, bit 1 dead letter) | len u32 | stored
/// message`.
struct Spill {
    dir: PathBuf,
    /// Bucket -> messages in it.
    buckets: BTreeMap<u64, u64>,
    writers: HashMap<u64, BufWriter<File>>,
}

/// Open spill writers kept at once; beyond it one is flushed and closed.
const MAX_WRITERS: usize = 64;

impl Spill {
    fn path(&self, bucket: u64) -> PathBuf {
        self.dir.join(format!("{bucket:016x}.bkt"))
    }

    fn append(&mut self, due: u64, seq: u64, h: &Held) -> std::io::Result<()> {
        let bucket = due / BUCKET_MS;
        if !self.writers.contains_key(&bucket) {
            if self.writers.len() >= MAX_WRITERS {
                if let Some(&b) = self.writers.keys().next() {
                    if let Some(mut w) = self.writers.remove(&b) {
                        w.flush()?;
                    }
                }
            }
            let f = OpenOptions::new()
                .create(true)
                .append(true)
                .open(self.path(bucket))?;
            self.writers
                .insert(bucket, BufWriter::with_capacity(64 * 1024, f));
        }
        let data = crate::persist::encode_message(&h.msg, None);
        let w = self.writers.get_mut(&bucket).expect("just inserted");
        let mut head = [0u8; 21];
        head[..8].copy_from_slice(&due.to_be_bytes());
        head[8..16].copy_from_slice(&seq.to_be_bytes());
        head[16] = h.logged as u8 | if h.dead { DEAD_LETTER_FLAG } else { 0 };
        head[17..21].copy_from_slice(&(data.len() as u32).to_be_bytes());
        w.write_all(&head)?;
        w.write_all(&data)?;
        *self.buckets.entry(bucket).or_insert(0) += 1;
        Ok(())
    }

    /// Reads a bucket back and deletes its file.
    fn take(&mut self, bucket: u64) -> std::io::Result<Vec<(u64, u64, Held)>> {
        if let Some(mut w) = self.writers.remove(&bucket) {
            w.flush()?;
        }
        self.buckets.remove(&bucket);
        let path = self.path(bucket);
        let mut b = Bytes::from(fs::read(&path)?);
        let mut out = Vec::new();
        while b.remaining() >= 21 {
            let due = b.get_u64();
            let seq = b.get_u64();
            let flags = b.get_u8();
            let len = b.get_u32() as usize;
            if b.remaining() < len {
                break;
            }
            let data = b.split_to(len);
            if let Some((msg, _)) = crate::persist::decode_message(&data) {
                out.push((
                    due,
                    seq,
                    Held {
                        msg: Arc::new(msg),
                        logged: flags & 1 != 0,
                        dead: flags & DEAD_LETTER_FLAG != 0,
                    },
                ));
            }
        }
        let _ = fs::remove_file(&path);
        Ok(out)
    }
}

struct State {
    /// `None` for a store whose messages do not outlive the process (non-durable exchange, or
    /// no data directory).
    log: Option<Log>,
    next_seq: u64,
    /// Messages due before `horizon`, by `(due, seq)`.
    mem: BTreeMap<(u64, u64), Held>,
    mem_bytes: u64,
    /// Every spilled message is due at or after it; every held one before it.
    horizon: u64,
    spill: Option<Spill>,
    count: u64,
    deleted: bool,
}

/// Where a delay store sends what comes due, as the store sees its vhost (which implements it):
/// the store names no vhost type, so the vhost may own its stores.
pub trait DueRoutes: Send + Sync {
    /// The vhost's name (the store's log label).
    fn name(&self) -> &Arc<str>;
    /// Routes due message `msg` from `exchange` now, adding its queues to `out`.
    fn route_due(&self, exchange: &str, msg: &Message, out: &mut Vec<QueueRef>);
    /// The queue `name` (a store of retries hands its messages back to it).
    fn queue(&self, name: &str) -> Option<QueueRef>;
}

pub struct DelayStore {
    /// The exchange it routes through, or the queue it returns messages to.
    pub exchange: Arc<str>,
    to_queue: bool,
    /// Names it in the persister's logs.
    label: String,
    vhost: Weak<dyn DueRoutes>,
    vhost_name: Arc<str>,
    dir: Option<PathBuf>,
    persister: Option<Arc<Persister>>,
    in_batch: AtomicBool,
    state: Mutex<State>,
    wake: Arc<tokio::sync::Notify>,
    /// The due time the task sleeps until; a publish due sooner wakes it.
    armed_for: AtomicU64,
    /// Messages held (management API), readable without the lock.
    held: AtomicU64,
}

/// A directory name for an exchange: names are up to 255 bytes, too long to use as they are.
pub fn dir_name(exchange: &str) -> String {
    // FNV-1a: stable across builds (std's hasher is not).
    let h = exchange.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ b as u64).wrapping_mul(0x0100_0000_01b3)
    });
    format!("{h:016x}")
}

impl DelayStore {
    /// Opens the store of exchange `exchange` under `dir` (recovering a durable one's messages)
    /// and starts its task. `durable` false: whatever `dir` holds is discarded.
    pub fn open<V: DueRoutes + 'static>(
        vhost: &Arc<V>,
        exchange: &str,
        to_queue: bool,
        dir: Option<PathBuf>,
        persister: Option<Arc<Persister>>,
        durable: bool,
    ) -> std::io::Result<Arc<DelayStore>> {
        let mut st = State {
            log: None,
            next_seq: 0,
            mem: BTreeMap::new(),
            mem_bytes: 0,
            horizon: u64::MAX,
            spill: None,
            count: 0,
            deleted: false,
        };
        let mut recovered = None;
        if let Some(dir) = &dir {
            if !durable {
                let _ = fs::remove_dir_all(dir);
            }
            let spill_dir = dir.join("spill");
            // Spill files are rebuilt from the log.
            let _ = fs::remove_dir_all(&spill_dir);
            fs::create_dir_all(&spill_dir)?;
            fs::write(dir.join("name"), exchange)?;
            st.spill = Some(Spill {
                dir: spill_dir,
                buckets: BTreeMap::new(),
                writers: HashMap::new(),
            });
            if durable && persister.is_some() {
                let (log, rec) = Log::open(&dir.join("log"), |d| d.len() as u64)?;
                st.next_seq = rec.max_seq.map_or(0, |m| m + 1);
                if let Some(first) = rec.live.first() {
                    recovered = Some((first, rec.live));
                }
                st.log = Some(log);
            }
        }
        let store = Arc::new(DelayStore {
            exchange: exchange.into(),
            to_queue,
            label: format!(
                "{} '{exchange}' in vhost '{}'",
                if to_queue {
                    "retries of queue"
                } else {
                    "delayed exchange"
                },
                vhost.name()
            ),
            vhost: Arc::downgrade(vhost) as Weak<dyn DueRoutes>,
            vhost_name: vhost.name().clone(),
            dir,
            persister,
            in_batch: AtomicBool::new(false),
            state: Mutex::new(st),
            wake: Arc::new(tokio::sync::Notify::new()),
            armed_for: AtomicU64::new(u64::MAX),
            held: AtomicU64::new(0),
        });
        if let Some((first, live)) = recovered {
            let n = store.recover(first, &live)?;
            tracing::info!(vhost = %store.vhost_name, exchange, messages = n, "delayed messages recovered");
        }
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            rt.spawn(run(Arc::downgrade(&store)));
        }
        Ok(store)
    }

    /// Messages waiting here.
    pub fn len(&self) -> u64 {
        self.held.load(Ordering::Relaxed)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Holds `msg` for `delay_ms`. A persistent message in a durable store is written with the
    /// publisher's `confirm` (which then waits for the fsync); otherwise the caller confirms.
    /// Returns whether `confirm` was taken.
    pub fn hold(
        self: &Arc<Self>,
        msg: Message,
        delay_ms: u64,
        confirm: Option<&Arc<ConfirmHandle>>,
    ) -> bool {
        self.hold_as(&msg, delay_ms, confirm, false)
            .unwrap_or(false)
    }

    /// [`DelayStore::hold`] for a dead letter: when it is due, the queues it would cycle back
    /// into are dropped from its targets, as when it was dead-lettered
    /// ([`crate::queue::dead_letter::drop_cycles`]). The mark is kept on disk with it. `None`
    /// if the store's exchange was deleted meanwhile (nothing held); else whether `confirm` was
    /// taken.
    pub fn hold_dead_letter(
        self: &Arc<Self>,
        msg: &Message,
        delay_ms: u64,
        confirm: Option<&Arc<ConfirmHandle>>,
    ) -> Option<bool> {
        self.hold_as(msg, delay_ms, confirm, true)
    }

    fn hold_as(
        self: &Arc<Self>,
        msg: &Message,
        delay_ms: u64,
        confirm: Option<&Arc<ConfirmHandle>>,
        dead: bool,
    ) -> Option<bool> {
        let due = unix_ms().saturating_add(delay_ms);
        // Its own copy: a body sliced from a connection's read buffer would keep that whole
        // buffer alive for as long as the message waits.
        let msg = Arc::new(Message {
            exchange: warren_protocol::ByteString::from(&*msg.exchange),
            routing_key: warren_protocol::ByteString::from(&*msg.routing_key),
            properties: Bytes::copy_from_slice(&msg.properties),
            body: Bytes::copy_from_slice(&msg.body),
            persistent: msg.persistent,
            priority: msg.priority,
            expiration_ms: msg.expiration_ms,
            forwarded: crate::message::Forwarded::NONE,
        });
        let mut took = false;
        let dirty = {
            let mut st = self.state.lock();
            if st.deleted {
                return None;
            }
            let seq = st.next_seq;
            st.next_seq += 1;
            let logged = msg.persistent && st.log.is_some();
            if logged {
                let mut data = BytesMut::with_capacity(8 + msg.body.len() + 64);
                data.put_u64(due);
                data.put_slice(&crate::persist::encode_message(&msg, None));
                if dead {
                    data[8] |= DEAD_LETTER_FLAG;
                }
                let log = st.log.as_mut().expect("checked");
                log.enqueue(seq, data.freeze(), confirm.cloned(), false);
                took = confirm.is_some();
            }
            self.insert(&mut st, due, seq, Held { msg, logged, dead });
            logged
        };
        if dirty {
            self.mark_dirty_now();
        }
        if due < self.armed_for.load(Ordering::Relaxed) {
            self.wake.notify_one();
        }
        Some(took)
    }

    fn mark_dirty_now(self: &Arc<Self>) {
        if let Some(p) = &self.persister {
            p.mark_dirty(self);
        }
    }

    fn insert(&self, st: &mut State, due: u64, seq: u64, h: Held) {
        st.count += 1;
        self.held.store(st.count, Ordering::Relaxed);
        if due >= st.horizon {
            if let Some(sp) = st.spill.as_mut() {
                match sp.append(due, seq, &h) {
                    Ok(()) => return,
                    Err(e) => {
                        tracing::error!(exchange = %self.exchange, error = %e, "cannot spill delayed messages; holding them in memory")
                    }
                }
            }
        }
        st.mem_bytes += h.cost();
        st.mem.insert((due, seq), h);
        if st.mem_bytes > MEM_BUDGET {
            self.shrink(st);
        }
    }

    /// Moves the latest-due messages to spill files until memory is under budget, a bucket at
    /// a time; the earliest bucket always stays in memory.
    fn shrink(&self, st: &mut State) {
        let Some(sp) = st.spill.as_mut() else { return };
        while st.mem_bytes > MEM_BUDGET {
            let (Some((&(first, _), _)), Some((&(last, _), _))) =
                (st.mem.first_key_value(), st.mem.last_key_value())
            else {
                return;
            };
            let cut = (last / BUCKET_MS) * BUCKET_MS;
            if cut <= first {
                return;
            }
            let moved = st.mem.split_off(&(cut, 0));
            st.horizon = cut;
            for ((due, seq), h) in moved {
                st.mem_bytes -= h.cost();
                if let Err(e) = sp.append(due, seq, &h) {
                    tracing::error!(exchange = %self.exchange, error = %e, "cannot spill delayed messages; holding them in memory");
                    st.mem_bytes += h.cost();
                    st.mem.insert((due, seq), h);
                }
            }
        }
    }

    /// Reads spilled buckets back while memory has room or their time nears.
    fn refill(&self, st: &mut State, now: u64) {
        loop {
            let Some(sp) = st.spill.as_mut() else { return };
            let Some((&bucket, _)) = sp.buckets.first_key_value() else {
                st.horizon = u64::MAX;
                return;
            };
            let near = bucket * BUCKET_MS <= now + LOOKAHEAD_MS;
            if !near && st.mem_bytes >= MEM_BUDGET / 2 {
                return;
            }
            match sp.take(bucket) {
                Ok(items) => {
                    for (due, seq, h) in items {
                        st.mem_bytes += h.cost();
                        st.mem.insert((due, seq), h);
                    }
                }
                Err(e) => {
                    tracing::error!(exchange = %self.exchange, error = %e, "cannot read spilled delayed messages")
                }
            }
            st.horizon = sp
                .buckets
                .first_key_value()
                .map_or(u64::MAX, |(&b, _)| b * BUCKET_MS);
            if !near && st.mem_bytes >= MEM_BUDGET / 2 {
                return;
            }
        }
    }

    /// Routes what is due; returns when to look again.
    fn fire(self: &Arc<Self>) -> u64 {
        let now = unix_ms();
        let mut due = Vec::new();
        let next = {
            let mut st = self.state.lock();
            if st.deleted {
                return u64::MAX;
            }
            self.refill(&mut st, now);
            while due.len() < FIRE_BATCH {
                match st.mem.first_key_value() {
                    Some((&(d, _), _)) if d <= now => {
                        let ((_, seq), h) = st.mem.pop_first().expect("present");
                        st.mem_bytes -= h.cost();
                        due.push((seq, h));
                    }
                    _ => break,
                }
            }
            st.count -= due.len() as u64;
            self.held.store(st.count, Ordering::Relaxed);
            if due.len() == FIRE_BATCH {
                now
            } else {
                let first = st.mem.first_key_value().map(|(&(d, _), _)| d);
                let spilled =
                    (st.horizon != u64::MAX).then(|| st.horizon.saturating_sub(LOOKAHEAD_MS));
                first.into_iter().chain(spilled).min().unwrap_or(u64::MAX)
            }
        };
        if !due.is_empty() {
            self.route(due);
        }
        next
    }

    /// Publishes due messages to the queues the exchange routes them to now.
    fn route(self: &Arc<Self>, due: Vec<(u64, Held)>) {
        let Some(vhost) = self.vhost.upgrade() else {
            return;
        };
        let mut targets = Vec::new();
        let mut acks = Vec::new();
        for (seq, h) in due {
            let m = &h.msg;
            targets.clear();
            if self.to_queue {
                targets.extend(vhost.queue(&self.exchange));
                self.hand_over(seq, &h, h.msg.clone(), &mut targets, &mut acks);
                continue;
            }
            let msg = Arc::new(Message {
                exchange: m.exchange.clone(),
                routing_key: m.routing_key.clone(),
                properties: negate_delay(&m.properties),
                body: m.body.clone(),
                persistent: m.persistent,
                priority: m.priority,
                expiration_ms: m.expiration_ms,
                forwarded: crate::message::Forwarded::NONE,
            });
            vhost.route_due(&self.exchange, &msg, &mut targets);
            if h.dead {
                crate::queue::dead_letter::drop_cycles(&msg.properties, &mut targets, |q| q.name());
            }
            self.hand_over(seq, &h, msg, &mut targets, &mut acks);
        }
        if !acks.is_empty() {
            self.ack(acks);
        }
    }

    /// Publishes a due message to `targets`; its log record is acked once they have it.
    fn hand_over(
        self: &Arc<Self>,
        seq: u64,
        h: &Held,
        msg: Arc<Message>,
        targets: &mut Vec<QueueRef>,
        acks: &mut Vec<u64>,
    ) {
        // A logged message's record is acked once every queue that stores it has it.
        let store: Arc<dyn crate::confirm::ConfirmTarget> = self.clone();
        let confirm = h.logged.then_some(ConfirmTo::Target(&store, seq));
        if fan_out(&msg, targets, confirm, |_| {}) != FannedOut::Pending && h.logged {
            acks.push(seq);
        }
        targets.clear();
    }

    /// The log records of messages handed over for good.
    pub fn ack(self: &Arc<Self>, seqs: impl IntoIterator<Item = u64>) {
        let mut st = self.state.lock();
        let Some(log) = st.log.as_mut() else { return };
        for s in seqs {
            log.ack(s);
        }
        let dirty = log.has_pending();
        drop(st);
        if dirty {
            self.mark_dirty_now();
        }
    }

    /// The exchange was deleted: its messages are dropped (as the plugin does) and its files
    /// removed.
    pub fn destroy(&self) {
        let log = {
            let mut st = self.state.lock();
            st.deleted = true;
            st.mem.clear();
            st.count = 0;
            self.held.store(0, Ordering::Relaxed);
            if let Some(sp) = st.spill.as_mut() {
                sp.writers.clear();
            }
            st.log.take()
        };
        if let Some(log) = log {
            let tokens = log.destroy();
            crate::confirm::complete_all(tokens.into_iter().map(|t| (t, true)));
        }
        if let Some(dir) = &self.dir {
            let _ = fs::remove_dir_all(dir);
        }
        self.wake.notify_one();
    }
}

impl Logged for DelayStore {
    fn join_batch(&self) -> bool {
        !self.in_batch.swap(true, Ordering::AcqRel)
    }

    fn write_log(&self) -> warren_store::Written<Arc<ConfirmHandle>> {
        self.in_batch.store(false, Ordering::Release);
        let mut st = self.state.lock();
        crate::persist::write_counted(st.log.as_mut(), self.persister.as_ref())
    }

    fn log_name(&self) -> &str {
        &self.label
    }
}

impl DelayStore {
    /// Reads the live records of the log back a chunk at a time, so a long log is spilled as it
    /// is read rather than held whole.
    fn recover(&self, first: u64, live: &LiveSet) -> std::io::Result<u64> {
        let mut st = self.state.lock();
        let Some(log) = st.log.take() else {
            return Ok(0);
        };
        let mut cursor = log.cursor_at_start(first);
        let mut n = 0;
        let r = loop {
            let got = match log.read(&mut cursor, 4 << 20, |s| live.holds(s)) {
                Ok(got) if got.is_empty() => break Ok(n),
                Ok(got) => got,
                Err(e) => break Err(e),
            };
            for (seq, data) in got {
                let Some(due) = data
                    .get(..8)
                    .map(|b| u64::from_be_bytes(b.try_into().expect("8 bytes")))
                else {
                    continue;
                };
                let dead = data.get(8).is_some_and(|f| f & DEAD_LETTER_FLAG != 0);
                if let Some((m, _)) = crate::persist::decode_message(&data.slice(8..)) {
                    self.insert(
                        &mut st,
                        due,
                        seq,
                        Held {
                            msg: Arc::new(m),
                            logged: true,
                            dead,
                        },
                    );
                    n += 1;
                }
            }
        };
        st.log = Some(log);
        r
    }
}

/// A due message handed to durable queues: its log record goes once they all have it. Even a
/// failed write acks it: the queue refused or lost the message, as it would a publish, and
/// retrying would route it again.
impl crate::confirm::ConfirmTarget for DelayStore {
    fn confirmed(self: Arc<Self>, seq: u64, _ok: bool) {
        self.ack([seq])
    }
}

async fn run(store: Weak<DelayStore>) {
    loop {
        let Some(s) = store.upgrade() else { return };
        let wake = s.wake.clone();
        let notified = wake.notified();
        tokio::pin!(notified);
        notified.as_mut().enable();
        let next = s.fire();
        if s.state.lock().deleted {
            return;
        }
        s.armed_for.store(next, Ordering::Relaxed);
        drop(s);
        let wait = next.saturating_sub(unix_ms()).min(IDLE_SLEEP_MS);
        if wait == 0 {
            tokio::task::yield_now().await;
            continue;
        }
        tokio::select! {
            _ = &mut notified => {}
            _ = tokio::time::sleep(std::time::Duration::from_millis(wait)) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_positive_integer_delays() {
        let with = |v: FieldValue| {
            let mut h = warren_protocol::FieldTable::new();
            h.insert("x-delay", v);
            BasicProperties {
                headers: Some(h),
                ..Default::default()
            }
            .to_bytes()
        };
        assert_eq!(requested_delay(&with(FieldValue::I32(1500))), Some(1500));
        assert_eq!(requested_delay(&with(FieldValue::I64(-5))), None);
        assert_eq!(requested_delay(&with(FieldValue::I32(0))), None);
        assert_eq!(requested_delay(&with(FieldValue::str("1000"))), None);
        assert_eq!(
            requested_delay(&BasicProperties::default().to_bytes()),
            None
        );
        let neg = negate_delay(&with(FieldValue::I32(1500)));
        let p = BasicProperties::decode(&neg).expect("decodes");
        assert_eq!(
            p.headers.expect("headers").get("x-delay"),
            Some(&FieldValue::I32(-1500))
        );
    }

    #[test]
    fn dir_names_are_stable() {
        assert_eq!(dir_name("x"), dir_name("x"));
        assert_ne!(dir_name("x"), dir_name("y"));
        assert_eq!(dir_name("").len(), 16);
    }
}
