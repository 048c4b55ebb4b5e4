"""Soak: hundreds of connections churning against one Warren for SOAK_SECONDS (default 600),
loopback only. Workers open connections, publish persistent messages with confirms, consume
with acks and close; victim processes are kill -9'd, some mid-frame. Records the broker's RSS
and open fds before and after, checks that every message confirmed to a (surviving) worker was
either acked by a consumer or is still in its queue, and that the broker answered a probe
throughout. Prints a summary and exits 1 if a message was lost or a probe failed.
Run through bench/soak.sh."""

from __future__ import annotations

import multiprocessing as mp
import os
import random
import signal
import socket
import struct
import sys
import time

import pika

HOST = "127.0.0.1"
PORT = int(os.environ["SOAK_PORT"])
PID = int(os.environ["SOAK_BROKER_PID"])
SECONDS = float(os.environ.get("SOAK_SECONDS", "600"))
WORKERS = int(os.environ.get("SOAK_WORKERS", "16"))
CONNS_PER_WORKER = int(os.environ.get("SOAK_CONNS", "12"))
OUT = os.environ["SOAK_DIR"]


def params() -> pika.ConnectionParameters:
    return pika.ConnectionParameters(HOST, PORT, heartbeat=0, connection_attempts=3, retry_delay=0.5,
                                     blocked_connection_timeout=30, socket_timeout=30)


def rss_fds() -> tuple[int, int]:
    with open(f"/proc/{PID}/status") as f:
        rss = next(int(l.split()[1]) * 1024 for l in f if l.startswith("VmRSS:"))
    return rss, len(os.listdir(f"/proc/{PID}/fd"))


def worker(w: int, deadline: float) -> None:
    """Holds CONNS_PER_WORKER connections; churns one at a time: publish a batch with confirms,
    consume some with acks, close, reopen. Confirmed and acked ids go to files."""
    random.seed(w)
    q = f"soak-{w}"
    confirmed = open(os.path.join(OUT, f"confirmed-{w}"), "a")
    acked = open(os.path.join(OUT, f"acked-{w}"), "a")
    conns: list[pika.BlockingConnection] = []
    seq = 0
    opened = 0
    while time.monotonic() < deadline:
        try:
            while len(conns) < CONNS_PER_WORKER:
                conns.append(pika.BlockingConnection(params()))
                opened += 1
            c = conns.pop(random.randrange(len(conns)))
            ch = c.channel()
            ch.queue_declare(q, durable=True)
            ch.confirm_delivery()
            batch = []
            for _ in range(random.randint(1, 50)):
                seq += 1
                body = f"{w}:{seq}:".encode() + b"p" * random.choice((10, 1000, 20000, 200000))
                ch.basic_publish("", q, body, pika.BasicProperties(delivery_mode=2))  # raises if nacked
                batch.append(seq)
            confirmed.write("".join(f"{s}\n" for s in batch))
            confirmed.flush()
            for _ in range(random.randint(0, 60)):
                m, _props, body = ch.basic_get(q)
                if m is None:
                    break
                ch.basic_ack(m.delivery_tag)
                acked.write(body.split(b":")[1].decode() + "\n")
            acked.flush()
            c.close()
        except Exception as e:  # noqa: BLE001 - a churn error is reported, not fatal
            print(f"worker {w}: {type(e).__name__}: {e}", file=sys.stderr)
            time.sleep(0.2)
            conns = [c for c in conns if c.is_open]
    for c in conns:
        try:
            c.close()
        except Exception:  # noqa: BLE001
            pass
    with open(os.path.join(OUT, f"opened-{w}"), "w") as f:
        f.write(str(opened))


def frame(t: int, ch: int, payload: bytes) -> bytes:
    return struct.pack(">BHI", t, ch, len(payload)) + payload + b"\xce"


def victim(mid_frame: bool) -> None:
    """A client that dies by SIGKILL: mid-frame (raw socket, half a body frame sent) or while
    publishing with pika."""
    if mid_frame:
        s = socket.create_connection((HOST, PORT))
        s.sendall(b"AMQP\x00\x00\x09\x01")
        s.recv(4096)
        ss = lambda x: bytes([len(x)]) + x  # noqa: E731
        start_ok = struct.pack(">HH", 10, 11) + struct.pack(">I", 0) + ss(b"PLAIN") \
            + struct.pack(">I", 12) + b"\x00guest\x00guest" + ss(b"en_US")
        s.sendall(frame(1, 0, start_ok))
        time.sleep(0.05)
        s.sendall(frame(1, 0, struct.pack(">HHHIH", 10, 31, 2047, 131072, 0))
                  + frame(1, 0, struct.pack(">HH", 10, 40) + ss(b"/") + ss(b"") + b"\x00")
                  + frame(1, 1, struct.pack(">HH", 20, 10) + ss(b"")))
        s.sendall(frame(1, 1, struct.pack(">HHH", 60, 40, 0) + ss(b"") + ss(b"soak-victim") + b"\x00")
                  + frame(2, 1, struct.pack(">HHQH", 60, 0, 100000, 0)))
        body = frame(3, 1, b"v" * 100000)
        s.sendall(body[: random.randint(1, len(body) - 1)])
        time.sleep(30)
    else:
        c = pika.BlockingConnection(params())
        ch = c.channel()
        ch.queue_declare("soak-victim")
        while True:
            ch.basic_publish("", "soak-victim", b"v" * 50000)


def main() -> int:
    deadline = time.monotonic() + SECONDS
    time.sleep(1)
    rss0, fds0 = rss_fds()
    procs = [mp.Process(target=worker, args=(w, deadline)) for w in range(WORKERS)]
    for p in procs:
        p.start()
    probes = failed = killed = 0
    worst = 0.0
    peak_rss, peak_fds = rss0, fds0
    while time.monotonic() < deadline:
        v = mp.Process(target=victim, args=(random.random() < 0.5,))
        v.start()
        time.sleep(random.uniform(0.2, 1.0))
        os.kill(v.pid, signal.SIGKILL)
        v.join()
        killed += 1
        t0 = time.monotonic()
        try:
            c = pika.BlockingConnection(params())
            c.channel().queue_declare("soak-probe")
            c.close()
            probes += 1
            worst = max(worst, time.monotonic() - t0)
        except Exception as e:  # noqa: BLE001
            failed += 1
            print(f"probe failed: {e}", file=sys.stderr)
        r, f = rss_fds()
        peak_rss, peak_fds = max(peak_rss, r), max(peak_fds, f)
    for p in procs:
        p.join(120)
    opened = sum(int(open(os.path.join(OUT, f"opened-{w}")).read() or 0)
                 for w in range(WORKERS) if os.path.exists(os.path.join(OUT, f"opened-{w}")))
    # Every confirmed message is acked or still queued.
    lost = total_confirmed = 0
    c = pika.BlockingConnection(params())
    ch = c.channel()
    for w in range(WORKERS):
        conf = set(open(os.path.join(OUT, f"confirmed-{w}")).read().split())
        total_confirmed += len(conf)
        acked = set(open(os.path.join(OUT, f"acked-{w}")).read().split())
        left = set()
        while True:
            m, _p, body = ch.basic_get(f"soak-{w}", auto_ack=True)
            if m is None:
                break
            left.add(body.split(b":")[1].decode())
        lost += len(conf - acked - left)
    for q in ["soak-victim", "soak-probe"] + [f"soak-{w}" for w in range(WORKERS)]:
        ch.queue_delete(q)
    c.close()
    time.sleep(5)  # closed connections' tasks finish
    rss1, fds1 = rss_fds()
    # The allocator hands freed pages back after its decay time (jemalloc: ~10 s); wait for RSS
    # to settle (no longer falling) before calling it the "after" figure, at most 60 s.
    settle_start = time.monotonic()
    while time.monotonic() - settle_start < 60:
        time.sleep(5)
        r, fds1 = rss_fds()
        if r >= rss1 * 0.98:
            rss1 = min(rss1, r)
            break
        rss1 = r
    settled = time.monotonic() - settle_start + 5
    mb = 1024 * 1024
    print(f"soak: {SECONDS:.0f} s, {WORKERS} workers x {CONNS_PER_WORKER} connections, "
          f"{opened} connections opened, {killed} clients killed -9 (about half mid-frame)")
    print(f"soak: messages confirmed {total_confirmed}, lost {lost}")
    print(f"soak: probes ok {probes}, failed {failed}, slowest {worst * 1000:.0f} ms")
    print(f"soak: broker RSS {rss0 / mb:.1f} MiB before, {peak_rss / mb:.1f} MiB peak, {rss1 / mb:.1f} MiB after ({settled:.0f} s after the drain)")
    print(f"soak: broker fds {fds0} before, {peak_fds} peak, {fds1} after")
    return 1 if lost or failed else 0


if __name__ == "__main__":
    sys.exit(main())
