//! What a node does with the one-way frames from another (publishes, confirms, deliveries,
//! settles, credit, cancels), at the end of each read (settles and credit gathered over it), and
//! when a link goes down.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use bytes::{Buf, BufMut, Bytes};

use super::proxy::Proxy;
use super::serve::local_queue;
use super::sink::LinkSink;
use super::wire::{
    get_bytes, get_forwarded, get_message, get_u32, get_u64, get_u8, K_CANCEL, K_CANCEL_OK,
    K_CONFIRM, K_CREDIT, K_DELIVER, K_PUBLISH, K_PUB_CREDIT, K_SETTLE, SETTLE_ACK, SETTLE_REQUEUE,
};
use super::{entry, lid, send_confirm, send_settle, GetDelivery};
use crate::cluster::link::{get_str, put_str, Link};
use crate::cluster::Cluster;
use crate::cluster::ClusterQueue;
use crate::confirm::{ConfirmHandle, ConfirmTarget};
use crate::queue::{fan_out, ConfirmTo, Consumer, FannedOut, Queue, QueueRef, Settled};

/// A one-way frame from another node.
pub fn on_message(c: &Arc<Cluster>, link: &Arc<Link>, kind: u8, mut body: Bytes) {
    match kind {
        K_PUBLISH => {
            let (Some(vhost), Some(name), Some(n)) = (
                get_bytes(&mut body),
                get_bytes(&mut body),
                get_u32(&mut body),
            ) else {
                return;
            };
            let q = forwarded_to(c, &vhost, &name);
            let target = q.clone().map(QueueRef::Local);
            let to: Arc<dyn ConfirmTarget> = link.clone();
            let mut took = 0;
            for _ in 0..n {
                let Some(id) = get_u64(&mut body) else { break };
                let Some(msg) = get_forwarded(&mut body) else {
                    break;
                };
                let Some(q) = &target else {
                    // Not taken here: deleted meanwhile, led by another node now (a replicated
                    // queue), or not known yet (this node has just restarted and not replayed
                    // its metadata). Nacked, never confirmed: a confirm must mean stored. A
                    // publisher that resends to a queue that is really gone gets it
                    // unroutable, and confirmed then. The publishing node's credit goes with
                    // the queue.
                    if id != 0 {
                        send_confirm(link, id, false);
                    }
                    continue;
                };
                // Id 0: the publisher wants no confirm.
                let confirm = (id != 0).then_some(ConfirmTo::Target(&to, id));
                let out = fan_out(&Arc::new(msg), std::slice::from_ref(q), confirm, |_| {});
                if let (FannedOut::Settled { accepted }, true) = (out, id != 0) {
                    send_confirm(link, id, accepted);
                }
                took += 1;
            }
            let Some(q) = q else { return };
            let mut owed = c.remote.owed.lock();
            match owed
                .iter_mut()
                .find(|(l, oq, _)| Arc::ptr_eq(l, link) && Arc::ptr_eq(oq, &q))
            {
                Some(o) => o.2 += took,
                None => owed.push((link.clone(), q, took)),
            }
        }
        K_PUB_CREDIT => {
            let (Some(vhost), Some(name), Some(n)) =
                (get_str(&mut body), get_str(&mut body), get_u32(&mut body))
            else {
                return;
            };
            let rq = c
                .broker()
                .and_then(|b| b.vhost(&vhost))
                .and_then(|v| v.queue(&name))
                .and_then(|q| q.remote());
            if let Some(rq) = rq {
                rq.credited(n);
            }
        }
        K_CONFIRM => {
            let Some(n) = get_u32(&mut body) else { return };
            let done: Vec<(Arc<ConfirmHandle>, bool)> = {
                let mut confirms = c.remote.confirms.lock();
                (0..n)
                    .map_while(|_| Some((get_u64(&mut body)?, get_u8(&mut body)?)))
                    .filter_map(|(id, ok)| Some((confirms.remove(&(lid(link), id))?, ok == 1)))
                    .collect()
            };
            crate::confirm::complete_all(done);
        }
        K_DELIVER => {
            let (Some(key), Some(n)) = (get_u64(&mut body), get_u32(&mut body)) else {
                return;
            };
            let proxy = c.remote.proxies.lock().get(&key).cloned();
            let mut got = 0;
            for _ in 0..n {
                let (Some(id), Some(redelivered)) = (get_u64(&mut body), get_u8(&mut body)) else {
                    break;
                };
                let Some(msg) = get_message(&mut body) else {
                    break;
                };
                got += 1;
                let m = entry(id, msg, redelivered != 0);
                match &proxy {
                    Some(p) => {
                        let mut early = p.early.lock();
                        match early.as_mut() {
                            Some(v) => v.push(m),
                            None => {
                                drop(early);
                                p.deliver(&m);
                            }
                        }
                    }
                    // Its consumer is gone: straight back.
                    None => send_settle(link, SETTLE_REQUEUE, key + 1, id),
                }
            }
            if proxy.as_ref().is_some_and(|p| p.withhold(link, got)) {
                return;
            }
            let mut owed = c.remote.credit_owed.lock();
            match owed
                .iter_mut()
                .find(|(l, k, _)| *k == key && Arc::ptr_eq(l, link))
            {
                Some(o) => o.2 += got,
                None => owed.push((link.clone(), key, got)),
            }
        }
        K_SETTLE => {
            let (Some(how), Some(consumer), Some(n)) =
                (get_u8(&mut body), get_u64(&mut body), get_u32(&mut body))
            else {
                return;
            };
            let n = (n as usize).min(body.len() / 8);
            let ids = (0..n).map(|_| body.get_u64());
            let peer = lid(link);
            let mut settles = c.remote.settles.lock();
            let mut add = |q: &Arc<Queue>, m: Settled| match settles.last_mut() {
                Some((l, sq, h, v)) if Arc::ptr_eq(l, link) && Arc::ptr_eq(sq, q) && *h == how => {
                    v.push(m)
                }
                _ => settles.push((link.clone(), q.clone(), how, vec![m])),
            };
            if consumer == 0 {
                // basic.get deliveries: a run may hold several queues' (one home, one link).
                let mut gets = c.remote.gets.lock();
                for id in ids {
                    if let Some((q, m)) = gets.remove(&(peer, id)) {
                        add(&q, m);
                    }
                }
                return;
            }
            let key = consumer - 1;
            let Some(sink) = c.remote.served.lock().get(&(peer, key)).cloned() else {
                return;
            };
            let mut u = sink.unacked.lock();
            for id in ids {
                if let Some(m) = u.remove(id) {
                    add(&sink.queue, m);
                }
            }
            let drained = u.0.is_empty();
            drop(u);
            if drained && sink.consumer.lock().is_none() {
                c.remote.served.lock().remove(&(peer, key));
            }
        }
        K_CREDIT => {
            let (Some(key), Some(n)) = (get_u64(&mut body), get_u32(&mut body)) else {
                return;
            };
            let sink = c.remote.served.lock().get(&(lid(link), key)).cloned();
            if let Some(s) = sink {
                s.credit(n);
            }
        }
        K_CANCEL_OK => {
            let Some(key) = get_u64(&mut body) else {
                return;
            };
            let p = c.remote.proxies.lock().remove(&key);
            if let Some(tx) = p.and_then(|p| p.cancelling.lock().take()) {
                let _ = tx.send(());
            }
        }
        K_CANCEL => {
            let Some(key) = get_u64(&mut body) else {
                return;
            };
            let p = c.remote.proxies.lock().remove(&key);
            if let Some(p) = p {
                crate::queue::notify_cancelled(std::slice::from_ref(&p.consumer));
            }
        }
        _ => tracing::debug!(kind, "unknown inter-node message"),
    }
}

/// The queue a forwarded publish names, from the recent ones when it is there.
fn forwarded_to(c: &Cluster, vhost: &Bytes, name: &Bytes) -> Option<Arc<Queue>> {
    {
        let recent = c.remote.recent.lock();
        for (v, n, q) in recent.iter() {
            if v == vhost && n == name {
                if let Some(q) = q.upgrade().filter(|q| !q.is_deleted()) {
                    return Some(q);
                }
            }
        }
    }
    let q = local_queue(
        c,
        std::str::from_utf8(vhost).ok()?,
        std::str::from_utf8(name).ok()?,
    )
    .ok()?;
    let mut recent = c.remote.recent.lock();
    recent.retain(|(v, n, w)| w.strong_count() > 0 && !(v == vhost && n == name));
    if recent.len() >= 64 {
        recent.remove(0);
    }
    recent.push((vhost.clone(), name.clone(), Arc::downgrade(&q)));
    Some(q)
}

/// After a read from `link`: credit the publishes it brought, now for queues keeping up, once
/// relieved for pressured ones.
pub fn on_batch_end(c: &Arc<Cluster>, link: &Arc<Link>) {
    apply_settles(c, link);
    let credit = take_for(&mut c.remote.credit_owed.lock(), link, |o| &o.0);
    for (l, key, n) in credit {
        l.send(K_CREDIT, |b| {
            b.put_u64(key);
            b.put_u32(n);
        });
    }
    let mine = take_for(&mut c.remote.owed.lock(), link, |o| &o.0);
    for (l, q, n) in mine {
        if !q.pressured() {
            pub_credit(&l, &q, n);
            continue;
        }
        tokio::spawn(async move {
            while q.pressured() && !l.is_closed() {
                q.stall(Duration::from_millis(crate::limits::CREDIT_RECHECK_MS))
                    .await;
            }
            pub_credit(&l, &q, n);
        });
    }
}

/// Applies the settles from `link` gathered so far (at the end of a read; and for a `Q_SYNC`,
/// which its sender's reply waits on, before that read ends).
pub(super) fn apply_settles(c: &Cluster, link: &Arc<Link>) {
    let settles = take_for(&mut c.remote.settles.lock(), link, |s| &s.0);
    for (_, q, how, msgs) in settles {
        match how {
            SETTLE_ACK => q.settle(msgs, true),
            SETTLE_REQUEUE => q.requeue(msgs),
            _ => q.discard(msgs, true),
        }
    }
}

/// The entries of `all` for `link`, taken out. Usually every entry is (one link brings most of
/// a node's traffic): then the vector is taken whole, without sorting or allocating.
fn take_for<T>(all: &mut Vec<T>, link: &Arc<Link>, of: impl Fn(&T) -> &Arc<Link>) -> Vec<T> {
    if all.iter().all(|x| Arc::ptr_eq(of(x), link)) {
        return std::mem::take(all);
    }
    let (mine, rest) = all.drain(..).partition(|x| Arc::ptr_eq(of(x), link));
    *all = rest;
    mine
}

fn pub_credit(l: &Link, q: &Queue, n: u32) {
    l.send(K_PUB_CREDIT, |b| {
        put_str(b, &q.vhost);
        put_str(b, &q.name);
        b.put_u32(n);
    });
}

/// A link went down: requeue what went over it, cancel consumers of its node's queues, nack
/// publishes waiting for its confirms.
pub fn on_link_down(c: &Arc<Cluster>, link: &Arc<Link>) {
    let peer = &lid(link);
    let sinks: Vec<Arc<LinkSink>> = {
        let mut s = c.remote.served.lock();
        let keys: Vec<_> = s.keys().filter(|(p, _)| p == peer).cloned().collect();
        keys.into_iter().filter_map(|k| s.remove(&k)).collect()
    };
    for s in sinks {
        if s.remove() {
            super::sink::spawn_delete(&s.queue);
        }
        let msgs: Vec<Settled> = s.unacked.lock().0.drain(..).map(|(_, m)| m).collect();
        s.queue.requeue(msgs);
    }
    let gets: Vec<GetDelivery> = {
        let mut g = c.remote.gets.lock();
        let keys: Vec<_> = g.keys().filter(|(p, _)| p == peer).cloned().collect();
        keys.into_iter().filter_map(|k| g.remove(&k)).collect()
    };
    for (q, m) in gets {
        q.requeue([m]);
    }
    let confirms: Vec<Arc<ConfirmHandle>> = {
        let mut m = c.remote.confirms.lock();
        let keys: Vec<_> = m.keys().filter(|(p, _)| p == peer).cloned().collect();
        keys.into_iter().filter_map(|k| m.remove(&k)).collect()
    };
    crate::confirm::complete_all(confirms.into_iter().map(|h| (h, false)));
    let name = link.peer_name.clone();
    let proxies: Vec<Arc<Proxy>> = {
        let mut p = c.remote.proxies.lock();
        let keys: Vec<u64> = p
            .iter()
            .filter(|(_, x)| x.queue.home == name)
            .map(|(k, _)| *k)
            .collect();
        keys.into_iter().filter_map(|k| p.remove(&k)).collect()
    };
    // A cancel waiting for that node's K_CANCEL_OK: nothing more comes.
    for p in &proxies {
        if let Some(tx) = p.cancelling.lock().take() {
            let _ = tx.send(());
        }
    }
    let consumers: Vec<Arc<Consumer>> = proxies.into_iter().map(|p| p.consumer.clone()).collect();
    crate::queue::notify_cancelled(&consumers);
    // Publishers held back by that node's credit are let go (their publishes now fail fast).
    if let Some(b) = c.broker() {
        for v in b.vhosts() {
            for q in v.snapshot().queues.values() {
                if let Some(r) = q.remote().filter(|r| r.home == name) {
                    r.in_flight.store(0, Ordering::Relaxed);
                    r.relieved.notify_waiters();
                }
            }
        }
    }
}
