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
//!
//! This file: the link and this node's links (state, dialing, accepting, requests). Beside it:
//! `send.rs` (appending frames and runs to a link's output), `io.rs` (a link's reader and
//! writer tasks), `handshake.rs` (the cookie challenge-response) and `codec.rs` (strings in
//! payloads).

mod codec;
mod handshake;
mod io;
mod send;

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::{BufMut, Bytes, BytesMut};
use parking_lot::Mutex;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{oneshot, Notify};

pub use codec::{get_str, put_str};

const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(5);
const DIAL_TIMEOUT: Duration = Duration::from_secs(2);

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
    /// The link closed while the request was out: it may or may not have been served.
    #[error("node at {0}: the link closed before it answered")]
    Lost(String),
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
    use crate::cluster::remote::{K_CANCEL_OK, K_DELIVER, K_PUBLISH};
    kind == K_PUBLISH || kind == K_DELIVER || kind == K_CANCEL_OK
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

    /// Sends a request and waits for its reply.
    pub async fn call(
        &self,
        service: u8,
        body: &[u8],
        timeout: Duration,
    ) -> Result<Bytes, LinkError> {
        self.call_headed(service, &[], body, timeout).await
    }

    /// As [`call`](Self::call), the request being `head` then `body` (written into the frame
    /// as they are, not joined first: a Raft request carrying message bodies is copied once).
    pub async fn call_headed(
        &self,
        service: u8,
        head: &[u8],
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
            b.put_slice(head);
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
            // Closed with the request out (`close` drops its sender): it may have been served.
            Ok(Err(_)) => Err(LinkError::Lost(self.peer_addr.clone())),
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
        // Dropped, not answered: each waiting request fails as `LinkError::Lost`.
        self.pending.lock().clear();
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

    /// Forgets that a dial to `addr` failed: the node is known to be up now (it joined the
    /// cluster), so the next caller dials rather than failing fast.
    pub fn forget_failure(&self, addr: &str) {
        self.failed.lock().remove(addr);
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
        self.call_headed(addr, service, &[], body, timeout).await
    }

    /// As [`call`](Self::call), the request being `head` then `body` ([`Link::call_headed`]).
    pub async fn call_headed(
        self: &Arc<Self>,
        addr: &str,
        service: u8,
        head: &[u8],
        body: &[u8],
        timeout: Duration,
    ) -> Result<Bytes, LinkError> {
        let l = tokio::time::timeout(timeout, self.link(addr))
            .await
            .map_err(|_| LinkError::Timeout(addr.to_string()))??;
        l.call_headed(service, head, body, timeout).await
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
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Buf;

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
                match service {
                    9 => Err("refused".into()),
                    // Never answered (a node that dies with the request in hand).
                    8 => std::future::pending().await,
                    _ => Ok(body),
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

    /// A request out when its link closes may have been served: `Lost`, which a Raft forward
    /// does not retry elsewhere; a node that cannot be reached at all is `Unreachable`.
    #[tokio::test]
    async fn a_request_out_when_the_link_closes_is_lost_not_unreachable() {
        let (a, _) = node("a", b"secret").await;
        let (_b, b_addr) = node("b", b"secret").await;
        let link = a.link(&b_addr).await.expect("link");
        let out = {
            let link = link.clone();
            tokio::spawn(async move { link.call(8, b"x", Duration::from_secs(10)).await })
        };
        tokio::time::sleep(Duration::from_millis(100)).await;
        link.close();
        let r = out.await.expect("join");
        assert!(matches!(r, Err(LinkError::Lost(_))), "{r:?}");
        let gone = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let gone_addr = gone.local_addr().expect("addr").to_string();
        drop(gone);
        let r = a.call(&gone_addr, 1, b"x", Duration::from_secs(2)).await;
        assert!(matches!(r, Err(LinkError::Unreachable(..))), "{r:?}");
    }

    /// A dial that failed (a seed dialed before it listened) makes callers fail fast for a
    /// moment; told that the node is up (it joined the cluster), they dial it at once.
    #[tokio::test]
    async fn a_failed_dial_is_forgotten_when_the_node_is_known_up() {
        let t = Duration::from_secs(2);
        let (c, _) = node("c", b"secret").await;
        let dead = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let d_addr = dead.local_addr().expect("addr").to_string();
        drop(dead);
        assert!(c.call(&d_addr, 1, b"x", t).await.is_err());
        let l = TcpListener::bind(&d_addr).await.expect("rebind");
        let d = Links::new("d".into(), d_addr.clone(), b"secret".to_vec());
        d.set_handler(Arc::new(Echo::default()));
        tokio::spawn(d.serve(l));
        assert!(
            c.call(&d_addr, 1, b"x", t).await.is_err(),
            "still failing fast"
        );
        c.forget_failure(&d_addr);
        let r = c.call(&d_addr, 1, b"joined", t).await.expect("c dials d");
        assert_eq!(&r[..], b"joined");
    }
}
