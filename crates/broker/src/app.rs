//! rabbitmqctl's `stop_app` / `start_app`: the AMQP listeners close and bind again while the
//! process stays up. Stopping closes every client connection with 320 CONNECTION_FORCED (the
//! text RabbitMQ's stop_app gives: the same as a shutdown) and refuses new ones; queues, their
//! messages and every definition stay as they are, and the management API keeps serving, since
//! `warren ctl` reaches the broker through it. Starting binds the same addresses again.
//!
//! Each listener (AMQP, AMQPS) runs [`serve_listener`], which watches the broker's wanted state
//! (`server::App`) and reports what it did; the management API's handlers wait on that
//! report. [`serve`] runs the broker: its sweeper, its alarms and the AMQP listener.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinSet;

use crate::limits;
use crate::server::Broker;

/// How long a listener waits for its connections to close (320, then close-ok or the
/// close-ok timeout) before it reports stopped and lets the stragglers finish on their own.
const DRAIN_WAIT: Duration = Duration::from_secs(10);

/// A listening socket for AMQP. Accepted sockets inherit its receive buffer: a fixed 192 KiB
/// (RabbitMQ's recommended `recbuf`) instead of autotuning up to several MB, so that when a
/// queue holds a publisher back, what waits in our kernel buffers (and adds to its latency)
/// stays small. SO_REUSEADDR lets start_app bind again at once, whatever TIME_WAIT is left.
pub fn listen(addr: SocketAddr) -> std::io::Result<TcpListener> {
    let socket = if addr.is_ipv4() {
        tokio::net::TcpSocket::new_v4()?
    } else {
        tokio::net::TcpSocket::new_v6()?
    };
    socket.set_reuseaddr(true)?;
    socket.set_recv_buffer_size(limits::SOCKET_RECV_BUFFER_BYTES)?;
    // Inherited by accepted sockets: caps the segments we send (see `SEGMENT_MAX_BYTES`).
    nix::sys::socket::setsockopt(
        &socket,
        nix::sys::socket::sockopt::TcpMaxSeg,
        &limits::SEGMENT_MAX_BYTES,
    )
    .map_err(std::io::Error::from)?;
    socket.bind(addr)?;
    socket.listen(1024)
}

/// Accepts on `listener` and hands each socket to `serve_one` with the signal that closes it
/// (320). On stop_app the listener is dropped (connections refused) and its connections are
/// closed; on start_app the same address is bound again. Returns at shutdown, once its
/// connections closed (bounded).
pub async fn serve_listener<F, Fut>(
    broker: Arc<Broker>,
    listener: TcpListener,
    mut shutdown: watch::Receiver<bool>,
    serve_one: F,
) where
    F: Fn(TcpStream, SocketAddr, watch::Receiver<bool>) -> Fut,
    Fut: Future<Output = ()> + Send + 'static,
{
    let app = &broker.app;
    let mut want = app.want.subscribe();
    want.borrow_and_update();
    let addr = listener.local_addr();
    app.status.send_modify(|s| {
        s.listeners += 1;
        s.listening += 1;
    });
    let mut listener = Some(listener);
    loop {
        if let Some(l) = listener.take() {
            let shutting_down = accept_until_stopped(l, &mut shutdown, &mut want, &serve_one).await;
            if shutting_down {
                return;
            }
            app.status
                .send_modify(|s| s.listening = s.listening.saturating_sub(1));
        }
        tokio::select! {
            _ = shutdown.changed() => return,
            r = want.changed() => if r.is_err() { return },
        }
        if !*want.borrow_and_update() {
            continue;
        }
        let bound = addr
            .as_ref()
            .map_err(|e| e.to_string())
            .and_then(|a| listen(*a).map_err(|e| format!("cannot listen for AMQP on {a}: {e}")));
        match bound {
            Ok(l) => {
                tracing::info!(addr = ?l.local_addr().ok(), "start_app: accepting AMQP connections again");
                listener = Some(l);
                app.status.send_modify(|s| s.listening += 1);
            }
            Err(e) => {
                tracing::warn!(error = %e, "start_app failed");
                app.status.send_modify(|s| s.error = Some(e));
            }
        }
    }
}

/// One serving period: accepts until stop_app (false) or shutdown (true), then closes the
/// listener and this period's connections.
async fn accept_until_stopped<F, Fut>(
    listener: TcpListener,
    shutdown: &mut watch::Receiver<bool>,
    want: &mut watch::Receiver<bool>,
    serve_one: &F,
) -> bool
where
    F: Fn(TcpStream, SocketAddr, watch::Receiver<bool>) -> Fut,
    Fut: Future<Output = ()> + Send + 'static,
{
    // Connections of this period watch `close`, not the process's shutdown signal, so that
    // stop_app can close them while the process goes on.
    let (close, closing) = watch::channel(false);
    let mut conns = JoinSet::new();
    let shutting_down = loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, peer)) => {
                    conns.spawn(serve_one(stream, peer, closing.clone()));
                }
                Err(e) => {
                    // Out of file descriptors and the like: back off instead of spinning.
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            },
            _ = shutdown.changed() => break true,
            r = want.changed() => match r {
                Err(_) => break true,
                Ok(()) if !*want.borrow_and_update() => break false,
                Ok(()) => {}
            },
        }
        while conns.try_join_next().is_some() {}
    };
    let addr = listener.local_addr().ok();
    // Closed first: from here on a connect is refused, not left waiting in the backlog.
    drop(listener);
    let _ = close.send(true);
    let n = conns.len();
    if n > 0 {
        tracing::info!(connections = n, ?addr, "closing client connections");
    }
    let drained = tokio::time::timeout(DRAIN_WAIT, async {
        while conns.join_next().await.is_some() {}
    })
    .await
    .is_ok();
    if !drained && !shutting_down {
        // Still closing (a client that reads nothing): they finish, and clean up, on their own.
        // At shutdown they are dropped with the set instead, before the persister stops.
        conns.detach_all();
    }
    if !shutting_down {
        tracing::info!(?addr, "stop_app: AMQP listener closed");
    }
    shutting_down
}

/// Expires messages whose TTL passed in queues nobody is touching (consumers and publishers
/// expire at the head as they go; this covers idle queues, so dead-lettering by TTL is timely).
async fn sweep_expired(b: Arc<Broker>) {
    let mut tick = tokio::time::interval(Duration::from_millis(limits::TTL_SWEEP_MS));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        for v in b.vhosts() {
            for q in v.expiring_queues() {
                q.expire();
            }
            v.delete_unused();
        }
    }
}

/// Accepts connections until `shutdown` turns true (pausing between stop_app and
/// start_app), then asks every connection to close (connection.close 320) and waits for
/// them, bounded.
pub async fn serve(b: Arc<Broker>, listener: TcpListener, shutdown: watch::Receiver<bool>) {
    let sweeper = tokio::spawn(sweep_expired(b.clone()));
    let alarms = tokio::spawn(b.alarms.clone().run());
    let broker = b.clone();
    serve_listener(b.clone(), listener, shutdown, move |stream, peer, close| {
        crate::connection::serve(broker.clone(), stream, peer, close)
    })
    .await;
    sweeper.abort();
    alarms.abort();
    let p = b.persister.clone();
    let _ = tokio::task::spawn_blocking(move || p.stop()).await;
}
