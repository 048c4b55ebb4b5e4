//! The inter-node link: one TCP connection per pair of nodes, shared by Raft traffic, requests
//! between brokers and the forwarded message stream (publishes, deliveries, settles).
//!
//! Frames are `u32 length | u8 kind | payload`. Writers append frames to the link's buffer
//! under a mutex and the writer task writes whatever has gathered in one syscall, so a burst
//! of forwarded publishes costs one write, as a connection's outbox does.
//!
//! A connection starts with a challenge-response on the shared cookie (Erlang distribution's
//! scheme: neither side sends the cookie, each proves it holds it); a node without it is
//! refused and the attempt logged. Either side may dial; if both did at once, the connection
//! dialed by the node whose address sorts first is kept.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::{Buf, BufMut, Bytes, BytesMut};
use parking_lot::Mutex;
use sha2::{Digest, Sha256};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{oneshot, Notify};

/// Version 2: publishes, deliveries, settles and confirms travel in runs ([`Link::send_run`]);
/// a node speaking version 1 is refused at the handshake rather than misread.
const MAGIC: &[u8; 8] = b"WARRENL2";
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(5);
const DIAL_TIMEOUT: Duration = Duration::from_secs(2);
/// A peer's frame larger than this is a broken or hostile peer: the link is dropped.
const FRAME_MAX: usize = 256 << 20;

const KIND_REQUEST: u8 = 1;
const KIND_REPLY: u8 = 2;
const KIND_REPLY_ERR: u8 = 3;
/// One-way kinds at or above this go to [`Handler::message`].
pub const KIND_FIRST_MESSAGE: u8 = 16;

pub type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

/// What a link hands to the broker.
pub trait Handler: Send + Sync + 'static {
    /// A request from `link`'s peer; `Ok` is the reply, `Err` a text the caller gets as an error.
    fn request(
        &self,
        link: &Arc<Link>,
        service: u8,
        body: Bytes,
    ) -> BoxFuture<Result<Bytes, String>>;
    /// A one-way message, in the order the peer sent it.
    fn message(&self, link: &Arc<Link>, kind: u8, body: Bytes);
    /// The connection to the peer is gone (its pending requests have failed).
    fn link_down(&self, link: &Arc<Link>);
    /// Every frame of one read has been handled.
    fn batch_end(&self, _link: &Arc<Link>) {}
}

#[derive(Debug, thiserror::Error, Clone)]
pub enum LinkError {
    #[error("node at {0} unreachable: {1}")]
    Unreachable(String, String),
    #[error("node at {0} did not answer in time")]
    Timeout(String),
    #[error("node at {0}: {1}")]
    Remote(String, String),
}

/// Frames waiting for the writer, in two lanes: control (Raft, requests, replies, acks,
/// confirms, credit) is written before bulk (forwarded publishes and deliveries), so a burst of
/// messages does not hold up Raft heartbeats, whose deadline is a few hundred milliseconds.
#[derive(Default)]
struct Out {
    control: BytesMut,
    bulk: BytesMut,
    /// The run each lane's last frame holds, if it is one ([`Link::send_run`]).
    control_run: Option<Run>,
    bulk_run: Option<Run>,
}

/// A frame that items are still being appended to.
#[derive(Clone, Copy)]
struct Run {
    kind: u8,
    key: u128,
    /// Where its length and its item count are.
    at: usize,
    count_at: usize,
    count: u32,
}

/// A run is closed at this many bytes, so one frame never holds up its reader for long.
const RUN_BYTES: usize = 64 * 1024;

impl Out {
    fn lane(&mut self, kind: u8) -> (&mut BytesMut, &mut Option<Run>) {
        if bulk(kind) {
            (&mut self.bulk, &mut self.bulk_run)
        } else {
            (&mut self.control, &mut self.control_run)
        }
    }
}

/// Kinds that go in the bulk lane.
fn bulk(kind: u8) -> bool {
    kind == crate::cluster::remote::K_PUBLISH || kind == crate::cluster::remote::K_DELIVER
}

/// One connection to one peer.
pub struct Link {
    pub peer_name: String,
    pub peer_addr: String,
    /// Whether this side dialed it.
    dialed: bool,
    out: Mutex<Out>,
    /// The bulk lane's length, readable without its lock (publishers check it per publish).
    bulk_len: AtomicUsize,
    wake_writer: Notify,
    pending: Mutex<HashMap<u64, oneshot::Sender<Result<Bytes, String>>>>,
    next_id: AtomicU64,
    closed: AtomicBool,
    closed_notify: Notify,
}

impl Link {
    pub fn is_closed(&self) -> bool {
        self.closed.load(Ordering::Acquire)
    }

    /// Output not yet written to the socket.
    pub fn pending_bytes(&self) -> usize {
        self.bulk_len.load(Ordering::Relaxed)
    }

    /// Appends one frame; `fill` writes its payload.
    pub fn send(&self, kind: u8, fill: impl FnOnce(&mut BytesMut)) {
        let mut lanes = self.out.lock();
        let was_empty = lanes.control.is_empty() && lanes.bulk.is_empty();
        let (out, run) = lanes.lane(kind);
        *run = None;
        let at = out.len();
        out.put_u32(0);
        out.put_u8(kind);
        fill(out);
        let len = (out.len() - at - 4) as u32;
        out[at..at + 4].copy_from_slice(&len.to_be_bytes());
        self.bulk_len.store(lanes.bulk.len(), Ordering::Relaxed);
        drop(lanes);
        if was_empty {
            self.wake_writer.notify_one();
        }
    }

    /// Appends one item to a run: a frame `head | u32 count | items` of one kind for one `key`
    /// (publishes to one queue, deliveries to one consumer, acks from one). While the lane's
    /// last frame is still that run, the item joins it, so the receiver pays its lookups and
    /// its bookkeeping once per run, not once per message; `head` is written only by the item
    /// that starts a run.
    pub fn send_run(
        &self,
        kind: u8,
        key: u128,
        head: impl FnOnce(&mut BytesMut),
        item: impl FnOnce(&mut BytesMut),
    ) {
        let mut lanes = self.out.lock();
        let was_empty = lanes.control.is_empty() && lanes.bulk.is_empty();
        let (out, run) = lanes.lane(kind);
        let r = match run.take() {
            Some(r) if r.kind == kind && r.key == key && out.len() - r.at < RUN_BYTES => r,
            _ => {
                let at = out.len();
                out.put_u32(0);
                out.put_u8(kind);
                head(out);
                let count_at = out.len();
                out.put_u32(0);
                Run {
                    kind,
                    key,
                    at,
                    count_at,
                    count: 0,
                }
            }
        };
        item(out);
        let r = Run {
            count: r.count + 1,
            ..r
        };
        let len = (out.len() - r.at - 4) as u32;
        out[r.at..r.at + 4].copy_from_slice(&len.to_be_bytes());
        out[r.count_at..r.count_at + 4].copy_from_slice(&r.count.to_be_bytes());
        *run = Some(r);
        self.bulk_len.store(lanes.bulk.len(), Ordering::Relaxed);
        drop(lanes);
        if was_empty {
            self.wake_writer.notify_one();
        }
    }

    /// Sends a request and waits for its reply.
    pub async fn call(
        &self,
        service: u8,
        body: &[u8],
        timeout: Duration,
    ) -> Result<Bytes, LinkError> {
        if self.is_closed() {
            return Err(LinkError::Unreachable(
                self.peer_addr.clone(),
                "link closed".into(),
            ));
        }
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = oneshot::channel();
        self.pending.lock().insert(id, tx);
        self.send(KIND_REQUEST, |b| {
            b.put_u64(id);
            b.put_u8(service);
            b.put_slice(body);
        });
        // A link that closed between the check and the insert fails nobody's request: recheck.
        if self.is_closed() {
            self.pending.lock().remove(&id);
            return Err(LinkError::Unreachable(
                self.peer_addr.clone(),
                "link closed".into(),
            ));
        }
        match tokio::time::timeout(timeout, rx).await {
            Ok(Ok(Ok(b))) => Ok(b),
            Ok(Ok(Err(text))) => Err(LinkError::Remote(self.peer_addr.clone(), text)),
            Ok(Err(_)) => Err(LinkError::Unreachable(
                self.peer_addr.clone(),
                "link closed".into(),
            )),
            Err(_) => {
                self.pending.lock().remove(&id);
                Err(LinkError::Timeout(self.peer_addr.clone()))
            }
        }
    }

    fn close(&self) {
        if self.closed.swap(true, Ordering::AcqRel) {
            return;
        }
        for (_, tx) in self.pending.lock().drain() {
            let _ = tx.send(Err("link closed".into()));
        }
        self.wake_writer.notify_one();
        self.closed_notify.notify_waiters();
    }
}

/// This node's links, by peer address.
pub struct Links {
    pub me: String,
    pub my_addr: String,
    cookie: Vec<u8>,
    links: Mutex<HashMap<String, Arc<Link>>>,
    /// One dial at a time per address.
    dialing: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
    /// When a dial to an address last failed: callers fail fast for a moment after, so a dead
    /// node costs each request nothing (the keeper task redials it every second).
    failed: Mutex<HashMap<String, std::time::Instant>>,
    handler: std::sync::OnceLock<Arc<dyn Handler>>,
}

impl Links {
    pub fn new(me: String, my_addr: String, cookie: Vec<u8>) -> Arc<Links> {
        Arc::new(Links {
            me,
            my_addr,
            cookie,
            links: Mutex::new(HashMap::new()),
            dialing: Mutex::new(HashMap::new()),
            failed: Mutex::new(HashMap::new()),
            handler: std::sync::OnceLock::new(),
        })
    }

    pub fn set_handler(&self, h: Arc<dyn Handler>) {
        let _ = self.handler.set(h);
    }

    /// The open link to `addr`, if any (no dial).
    pub fn get(&self, addr: &str) -> Option<Arc<Link>> {
        self.links
            .lock()
            .get(addr)
            .filter(|l| !l.is_closed())
            .cloned()
    }

    /// Every open link.
    pub fn all(&self) -> Vec<Arc<Link>> {
        self.links
            .lock()
            .values()
            .filter(|l| !l.is_closed())
            .cloned()
            .collect()
    }

    /// The link to `addr`, dialing it if there is none.
    pub async fn link(self: &Arc<Self>, addr: &str) -> Result<Arc<Link>, LinkError> {
        if let Some(l) = self.get(addr) {
            return Ok(l);
        }
        let gate = self
            .dialing
            .lock()
            .entry(addr.to_string())
            .or_default()
            .clone();
        let _g = gate.lock().await;
        if let Some(l) = self.get(addr) {
            return Ok(l);
        }
        self.dial(addr).await
    }

    /// Dials `addr`, unless a dial failed less than a second ago.
    async fn dial(self: &Arc<Self>, addr: &str) -> Result<Arc<Link>, LinkError> {
        let unreachable = |e: String| LinkError::Unreachable(addr.to_string(), e);
        if let Some(at) = self.failed.lock().get(addr) {
            if at.elapsed() < Duration::from_secs(1) {
                return Err(unreachable("down (a recent dial failed)".into()));
            }
        }
        let r = async {
            let mut s = tokio::time::timeout(DIAL_TIMEOUT, TcpStream::connect(addr))
                .await
                .map_err(|_| unreachable("connect timed out".into()))?
                .map_err(|e| unreachable(e.to_string()))?;
            let _ = s.set_nodelay(true);
            let (name, peer_addr) =
                tokio::time::timeout(HANDSHAKE_TIMEOUT, self.dial_handshake(&mut s))
                    .await
                    .map_err(|_| unreachable("handshake timed out".into()))?
                    .map_err(unreachable)?;
            Ok::<_, LinkError>((s, name, peer_addr))
        }
        .await;
        let (s, name, peer_addr) = match r {
            Ok(x) => {
                self.failed.lock().remove(addr);
                x
            }
            Err(e) => {
                self.failed
                    .lock()
                    .insert(addr.to_string(), std::time::Instant::now());
                return Err(e);
            }
        };
        if peer_addr != addr {
            tracing::debug!(dialed = addr, announced = %peer_addr, "peer announces another link address");
        }
        Ok(self.start(s, name, addr.to_string(), true))
    }

    /// Sends a request to `addr` (dialing if needed).
    pub async fn call(
        self: &Arc<Self>,
        addr: &str,
        service: u8,
        body: &[u8],
        timeout: Duration,
    ) -> Result<Bytes, LinkError> {
        let l = tokio::time::timeout(timeout, self.link(addr))
            .await
            .map_err(|_| LinkError::Timeout(addr.to_string()))??;
        l.call(service, body, timeout).await
    }

    /// Accepts links until the listener fails.
    pub async fn serve(self: Arc<Self>, listener: TcpListener) {
        loop {
            let (mut s, peer) = match listener.accept().await {
                Ok(x) => x,
                Err(e) => {
                    tracing::warn!(error = %e, "inter-node accept failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            };
            let me = self.clone();
            tokio::spawn(async move {
                let _ = s.set_nodelay(true);
                match tokio::time::timeout(HANDSHAKE_TIMEOUT, me.accept_handshake(&mut s)).await {
                    Ok(Ok((name, addr))) => {
                        me.start(s, name, addr, false);
                    }
                    Ok(Err(e)) => {
                        tracing::warn!(peer = %peer, reason = %e, "inter-node connection refused")
                    }
                    Err(_) => tracing::warn!(peer = %peer, "inter-node handshake timed out"),
                }
            });
        }
    }

    fn proof(&self, nonce: &[u8], side: &[u8]) -> [u8; 32] {
        let mut h = Sha256::new();
        h.update(&self.cookie);
        h.update(nonce);
        h.update(side);
        h.finalize().into()
    }

    async fn dial_handshake(&self, s: &mut TcpStream) -> Result<(String, String), String> {
        let nonce: [u8; 16] = rand::random();
        let mut b = BytesMut::new();
        b.put_slice(MAGIC);
        put_str(&mut b, &self.me);
        put_str(&mut b, &self.my_addr);
        b.put_slice(&nonce);
        s.write_all(&b).await.map_err(|e| e.to_string())?;
        // Challenge: peer's name, address, nonce, proof of our nonce.
        let name = read_str(s).await?;
        let addr = read_str(s).await?;
        let mut peer_nonce = [0u8; 16];
        s.read_exact(&mut peer_nonce)
            .await
            .map_err(|e| e.to_string())?;
        let mut proof = [0u8; 32];
        s.read_exact(&mut proof).await.map_err(|e| e.to_string())?;
        if proof != self.proof(&nonce, b"s") {
            return Err(format!("node {name} does not hold this cluster's cookie"));
        }
        s.write_all(&self.proof(&peer_nonce, b"c"))
            .await
            .map_err(|e| e.to_string())?;
        let mut ok = [0u8; 1];
        s.read_exact(&mut ok)
            .await
            .map_err(|_| format!("node {name} refused this node's cookie"))?;
        Ok((name, addr))
    }

    async fn accept_handshake(&self, s: &mut TcpStream) -> Result<(String, String), String> {
        let mut magic = [0u8; 8];
        s.read_exact(&mut magic).await.map_err(|e| e.to_string())?;
        if &magic != MAGIC {
            return Err("not a Warren node (bad preamble)".into());
        }
        let name = read_str(s).await?;
        let addr = read_str(s).await?;
        let mut peer_nonce = [0u8; 16];
        s.read_exact(&mut peer_nonce)
            .await
            .map_err(|e| e.to_string())?;
        let nonce: [u8; 16] = rand::random();
        let mut b = BytesMut::new();
        put_str(&mut b, &self.me);
        put_str(&mut b, &self.my_addr);
        b.put_slice(&nonce);
        b.put_slice(&self.proof(&peer_nonce, b"s"));
        s.write_all(&b).await.map_err(|e| e.to_string())?;
        let mut proof = [0u8; 32];
        s.read_exact(&mut proof).await.map_err(|e| e.to_string())?;
        if proof != self.proof(&nonce, b"c") {
            return Err(format!(
                "node {name} ({addr}) does not hold this cluster's cookie"
            ));
        }
        s.write_all(&[1]).await.map_err(|e| e.to_string())?;
        Ok((name, addr))
    }

    /// Registers a connected link and starts its reader and writer.
    fn start(
        self: &Arc<Self>,
        s: TcpStream,
        name: String,
        addr: String,
        dialed: bool,
    ) -> Arc<Link> {
        let link = Arc::new(Link {
            peer_name: name,
            peer_addr: addr.clone(),
            dialed,
            out: Mutex::new(Out::default()),
            bulk_len: AtomicUsize::new(0),
            wake_writer: Notify::new(),
            pending: Mutex::new(HashMap::new()),
            next_id: AtomicU64::new(1),
            closed: AtomicBool::new(false),
            closed_notify: Notify::new(),
        });
        {
            let mut links = self.links.lock();
            if let Some(old) = links.get(&addr).filter(|l| !l.is_closed()) {
                // Both sides dialed: keep the one dialed by the node whose address sorts first.
                let keep_dialed_by_me = self.my_addr < addr;
                if old.dialed == keep_dialed_by_me {
                    let old = old.clone();
                    drop(links);
                    drop(s);
                    return old;
                }
                old.close();
            }
            links.insert(addr.clone(), link.clone());
        }
        tracing::info!(peer = %link.peer_name, addr = %addr, "inter-node link up");
        let (r, w) = s.into_split();
        tokio::spawn(write_loop(link.clone(), w));
        tokio::spawn(self.clone().read_loop(link.clone(), r));
        link
    }

    async fn read_loop(self: Arc<Self>, link: Arc<Link>, mut r: tokio::net::tcp::OwnedReadHalf) {
        let mut buf = BytesMut::with_capacity(256 * 1024);
        let reason = 'outer: loop {
            let n = tokio::select! {
                n = r.read_buf(&mut buf) => n,
                _ = link.closed_notify.notified() => break 'outer "closed".to_string(),
            };
            match n {
                Ok(0) => break "peer closed the connection".to_string(),
                Err(e) => break e.to_string(),
                Ok(_) => {}
            }
            // Deliveries this read hands to connections go out in one write each.
            crate::outbox::begin_batch();
            let r = self.frames(&link, &mut buf);
            if let Some(h) = self.handler.get() {
                h.batch_end(&link);
            }
            crate::outbox::end_batch();
            if let Err(e) = r {
                break 'outer e;
            }
            if link.is_closed() {
                break "closed".to_string();
            }
        };
        link.close();
        {
            let mut links = self.links.lock();
            if links
                .get(&link.peer_addr)
                .is_some_and(|l| Arc::ptr_eq(l, &link))
            {
                links.remove(&link.peer_addr);
            }
        }
        tracing::info!(peer = %link.peer_name, addr = %link.peer_addr, reason = %reason, "inter-node link down");
        if let Some(h) = self.handler.get() {
            h.link_down(&link);
        }
    }

    fn frames(&self, link: &Arc<Link>, buf: &mut BytesMut) -> Result<(), String> {
        while buf.len() >= 4 {
            let len = u32::from_be_bytes([buf[0], buf[1], buf[2], buf[3]]) as usize;
            if len == 0 || len > FRAME_MAX {
                return Err(format!("bad frame length {len}"));
            }
            if buf.len() < 4 + len {
                buf.reserve(4 + len - buf.len());
                break;
            }
            buf.advance(4);
            let mut frame = buf.split_to(len).freeze();
            let kind = frame.get_u8();
            self.frame(link, kind, frame)?;
        }
        Ok(())
    }

    fn frame(&self, link: &Arc<Link>, kind: u8, mut frame: Bytes) -> Result<(), String> {
        match kind {
            KIND_REQUEST => {
                if frame.len() < 9 {
                    return Err("short request".into());
                }
                let id = frame.get_u64();
                let service = frame.get_u8();
                let Some(h) = self.handler.get().cloned() else {
                    return Err("no handler".into());
                };
                let fut = h.request(link, service, frame);
                let link = link.clone();
                tokio::spawn(async move {
                    let (kind, body) = match fut.await {
                        Ok(b) => (KIND_REPLY, b),
                        Err(t) => (KIND_REPLY_ERR, Bytes::from(t)),
                    };
                    link.send(kind, |b| {
                        b.put_u64(id);
                        b.put_slice(&body);
                    });
                });
            }
            KIND_REPLY | KIND_REPLY_ERR => {
                if frame.len() < 8 {
                    return Err("short reply".into());
                }
                let id = frame.get_u64();
                if let Some(tx) = link.pending.lock().remove(&id) {
                    let r = if kind == KIND_REPLY {
                        Ok(frame)
                    } else {
                        Err(String::from_utf8_lossy(&frame).into_owned())
                    };
                    let _ = tx.send(r);
                }
            }
            k if k >= KIND_FIRST_MESSAGE => {
                if let Some(h) = self.handler.get() {
                    h.message(link, k, frame);
                }
            }
            k => return Err(format!("unknown frame kind {k}")),
        }
        Ok(())
    }
}

async fn write_loop(link: Arc<Link>, mut w: tokio::net::tcp::OwnedWriteHalf) {
    let (mut control, mut bulk) = (
        BytesMut::with_capacity(64 * 1024),
        BytesMut::with_capacity(64 * 1024),
    );
    loop {
        let notified = link.wake_writer.notified();
        if link.is_closed() {
            break;
        }
        {
            let mut out = link.out.lock();
            // Control first: a heartbeat queued behind a burst of bulk output goes before it.
            std::mem::swap(&mut out.control, &mut control);
            std::mem::swap(&mut out.bulk, &mut bulk);
            // The runs' frames are the writer's now: later items start new ones.
            out.control_run = None;
            out.bulk_run = None;
            link.bulk_len.store(0, Ordering::Relaxed);
        }
        if control.is_empty() && bulk.is_empty() {
            notified.await;
            continue;
        }
        // Both lanes in one vectored write, control first.
        let mut both = (&mut control).chain(&mut bulk);
        if let Err(e) = w.write_all_buf(&mut both).await {
            tracing::debug!(peer = %link.peer_name, error = %e, "inter-node write failed");
            link.close();
            return;
        }
        control.clear();
        bulk.clear();
    }
    let _ = w.shutdown().await;
}

pub fn put_str(b: &mut BytesMut, s: &str) {
    b.put_u16(s.len() as u16);
    b.put_slice(s.as_bytes());
}

async fn read_str(s: &mut TcpStream) -> Result<String, String> {
    let n = s.read_u16().await.map_err(|e| e.to_string())? as usize;
    let mut v = vec![0u8; n];
    s.read_exact(&mut v).await.map_err(|e| e.to_string())?;
    String::from_utf8(v).map_err(|_| "bad string".to_string())
}

/// Reads what [`put_str`] wrote.
pub fn get_str(b: &mut Bytes) -> Option<String> {
    if b.len() < 2 {
        return None;
    }
    let n = b.get_u16() as usize;
    if b.len() < n {
        return None;
    }
    String::from_utf8(b.split_to(n).to_vec()).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Echoes requests and records one-way messages.
    #[derive(Default)]
    struct Echo(Mutex<Vec<(u8, Bytes)>>);
    impl Handler for Echo {
        fn request(
            &self,
            _: &Arc<Link>,
            service: u8,
            body: Bytes,
        ) -> BoxFuture<Result<Bytes, String>> {
            Box::pin(async move {
                if service == 9 {
                    Err("refused".into())
                } else {
                    Ok(body)
                }
            })
        }
        fn message(&self, _: &Arc<Link>, kind: u8, body: Bytes) {
            self.0.lock().push((kind, body));
        }
        fn link_down(&self, _: &Arc<Link>) {}
    }

    async fn node(name: &str, cookie: &[u8]) -> (Arc<Links>, String) {
        let (links, addr, _) = node_with(name, cookie).await;
        (links, addr)
    }

    async fn node_with(name: &str, cookie: &[u8]) -> (Arc<Links>, String, Arc<Echo>) {
        let l = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = l.local_addr().expect("addr").to_string();
        let links = Links::new(name.into(), addr.clone(), cookie.to_vec());
        let echo = Arc::new(Echo::default());
        links.set_handler(echo.clone());
        tokio::spawn(links.clone().serve(l));
        (links, addr, echo)
    }

    /// A run frame as (head, items), items being `item_len` bytes each.
    fn run_of(mut body: Bytes, head_len: usize, item_len: usize) -> (Bytes, Vec<Bytes>) {
        let head = body.split_to(head_len);
        let n = body.get_u32() as usize;
        assert_eq!(body.len(), n * item_len, "count matches the items");
        (head, (0..n).map(|_| body.split_to(item_len)).collect())
    }

    // A current-thread runtime: the writer cannot take the buffer between two sends below.
    #[tokio::test]
    async fn runs_gather_items_of_one_key_until_another_frame_or_the_size_cap() {
        let (a, _) = node("a", b"secret").await;
        let (_b, b_addr, got) = node_with("b", b"secret").await;
        let link = a.link(&b_addr).await.expect("link");
        let run = |key: u8, item: u8| {
            link.send_run(40, key as u128, |b| b.put_u8(key), |b| b.put_u8(item))
        };
        run(1, 1);
        run(1, 2);
        run(1, 3);
        run(2, 9);
        link.send(40, |b| b.put_slice(b"plain"));
        run(2, 10);
        run(2, 11);
        // Items of 1 KiB for one key: the 64 KiB cap splits them over frames.
        for i in 0..100u8 {
            link.send_run(41, 7, |_| {}, |b| b.put_slice(&[i; 1024]));
        }
        let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
        while got.0.lock().iter().map(|(_, b)| b.len()).sum::<usize>() < 100 * 1024 {
            assert!(tokio::time::Instant::now() < deadline, "frames arrived");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let frames = got.0.lock().clone();
        let small: Vec<_> = frames.iter().filter(|(k, _)| *k == 40).cloned().collect();
        assert_eq!(small.len(), 4, "3 runs and the plain frame between them");
        let items = |f: &Bytes| {
            let (head, items) = run_of(f.clone(), 1, 1);
            (head[0], items.iter().map(|i| i[0]).collect::<Vec<u8>>())
        };
        assert_eq!(items(&small[0].1), (1, vec![1, 2, 3]));
        assert_eq!(items(&small[1].1), (2, vec![9]));
        assert_eq!(&small[2].1[..], b"plain");
        assert_eq!(items(&small[3].1), (2, vec![10, 11]));
        let big: Vec<Vec<Bytes>> = frames
            .iter()
            .filter(|(k, _)| *k == 41)
            .map(|(_, b)| run_of(b.clone(), 0, 1024).1)
            .collect();
        assert!(
            big.len() >= 2,
            "the cap split the run: {} frames",
            big.len()
        );
        assert!(big.iter().all(|f| f.len() * 1024 <= RUN_BYTES + 1024));
        let all: Vec<u8> = big.iter().flatten().map(|i| i[0]).collect();
        assert_eq!(all, (0..100).collect::<Vec<u8>>(), "every item, in order");
    }

    #[tokio::test]
    async fn requests_flow_both_ways_and_a_wrong_cookie_is_refused() {
        let (a, a_addr) = node("a", b"secret").await;
        let (b, b_addr) = node("b", b"secret").await;
        let t = Duration::from_secs(2);
        let r = a.call(&b_addr, 1, b"ping", t).await.expect("a->b");
        assert_eq!(&r[..], b"ping");
        // b reuses the link a dialed.
        let r = b.call(&a_addr, 1, b"pong", t).await.expect("b->a");
        assert_eq!(&r[..], b"pong");
        assert!(
            matches!(a.call(&b_addr, 9, b"x", t).await, Err(LinkError::Remote(_, e)) if e == "refused")
        );
        let (c, _) = node("c", b"other").await;
        assert!(c.call(&a_addr, 1, b"x", t).await.is_err());
        // Many requests in flight at once.
        let calls: Vec<_> = (0..200u32)
            .map(|i| {
                let a = a.clone();
                let b_addr = b_addr.clone();
                tokio::spawn(async move { a.call(&b_addr, 1, &i.to_be_bytes(), t).await })
            })
            .collect();
        for (i, c) in calls.into_iter().enumerate() {
            let r = c.await.expect("join").expect("call");
            assert_eq!(&r[..], &(i as u32).to_be_bytes());
        }
    }
}
