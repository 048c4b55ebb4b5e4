#!/usr/bin/env python3
"""Fault-injection checker for Warren's quorum queues and replicated streams (Jepsen-style, on
loopback).

One run: a fresh 3-node cluster in a temp dir (free ports), a quorum queue, a bounded workload
while a seeded schedule of faults is applied, then heal, restart every node, drain and check.

Workload (pika's asyncio adapter, all on this process's event loop): publishers with confirms
(persistent, each body a unique id, --rate per second, at most --window unconfirmed), spread over
the nodes; on a lost connection, on a confirm later than --confirm-timeout or after only nacks for
--nack-switch seconds they move to another node (what was unconfirmed becomes "unknown").
Consumers (manual ack after up to --ack-delay, prefetch --prefetch) on other nodes; they
re-consume elsewhere after a basic.cancel or a lost connection, and close their connection every
3-10 s (unacked messages are requeued). Every message is recorded: sent, confirmed / nacked /
unknown, each delivery (time, consumer, node, redelivered flag), acked.

Checks:
* lost: confirmed and never received (must be 0); also confirmed, delivered, never acked and
  never delivered again (the broker dropped a message a consumer held; must be 0);
* duplicates: received more than once; every delivery after the first must be flagged
  redelivered (a violation otherwise);
* unconfirmed-but-received, nacked-but-received (both fine: at-least-once);
* every node comes back after each fault, and its replica of the queue opens (a replica that
  does not open leaves the node up and the queue a member short: only the node's log says so);
* unavailability windows (> 1 s without any confirm while publishers were publishing: what these
  clients saw, publishers on a cut-off node included) and the failover time of each leader kill
  (kill -> first confirm of a message published after it).

Faults (at most one node affected at a time; each is undone, and the node answers again, before
the next; after a node or replica that does not come back, no further fault is applied):

* kill-leader    kill -9 of the queue's current leader (the node a majority of the nodes' management
                 API names), restarted after the fault's duration (2-5 s);
* kill-follower  kill -9 of a member that is not the leader, restarted likewise;
* pause          SIGSTOP of a node, SIGCONT after the duration;
* partition      the node's inter-node links are cut: every link connection to or from it is
                 aborted and new ones are refused until the heal (see "Network" below);
* torn           kill -9 of a node, then one of its Raft logs (the newest segment of
                 quorum/<group>/log/ or raft/log/; raft.log in earlier versions) is damaged at its
                 end, then it restarts after the duration.
                 --torn-mode truncate (default): 1-64 bytes cut off the end, so the last record,
                 which was fsynced and acknowledged, is damaged (stronger than a real crash can
                 do). --torn-mode append: 1-64 random bytes appended, a partial record that was
                 never acknowledged (what a crash can leave). --torn-files all picks among every
                 file there (vote.json, committed.json, snapshot.bin too, which Warren replaces
                 atomically: a torn copy cannot happen, a truncated one is corruption);
* stall          (opt-in: --faults ...,stall) the node's link connections stay open but no byte
                 passes (a silent partition, TCP holding the bytes) until the heal.

Stream workload (--workload stream; the default is the quorum queue above): the queue is a
durable stream (x-queue-type=stream, 3 members). Publishers as above. Consumers are stream
consumers (prefetch, manual acks that only return credit, x-stream-offset): each starts at
"first", keeps the offset of the last delivery it saw (over AMQP 0-9-1 the client stores its
offset) and, after a lost connection, a server basic.cancel or its own close every 3-10 s,
consumes again on another node from that offset + 1. Every delivery is recorded (offset, body,
node). The leader the faults aim at is the stream's ("leader" in the management API). The torn
fault also picks, beside the Raft logs above, the stream's newest segment file (<first
offset>.seg in vhosts/<vhost>/queues/<id>/) and the newest segment of the stream's Raft group's
log (group/log/); --torn-files all: every file of the stream's directory (applied,
tracking.wrn, group/vote.json, ...). After the heal and the restart of every node, every node's
copy is read from "first" (again every 2 s, up to --drain-timeout, until the copies agree and
hold every confirmed message; a node still catching up is read again). Checks:
* lost: a confirmed body in no copy (must be 0); and in some copy but missing from a node's
  (must be 0);
* the copies: on every node the same list of (offset, body), offsets dense from the first; no
  offset given to two different bodies, in the copies or in what any consumer was given;
* each consumer: offsets increasing, each session starting at the offset it asked for, and
  nothing the stream holds between its first offset and its last skipped (a consumer resuming
  at its stored offset must miss nothing), no offset beyond what the stream holds at the end;
* duplicates (a body at two offsets) are reported, split by confirmed or not, not a failure;
* every node comes back after each fault, and its copy opens (its group and segments: its log
  says so otherwise), as above.

The schedule (kinds, times, durations, which node by index) is a function of --seed, --duration
and --faults; which node is the leader at that moment, and so a fault's role, can vary.

Network: every node advertises a proxy address X_i (this process listens there) and listens on
L_i; its peers are the X addresses. A link between two nodes is one TCP connection dialed by
either side (both may dial; one is kept), so it passes through the proxy of the node that was
dialed. Each proxy reads the dialer's preamble (magic, node name, advertised address) to learn
which node dialed; cutting node N aborts every proxied connection whose source or destination
is N and refuses new ones, whichever side dials. A partition is checked: the isolated node's
/api/nodes must show the others not running, and another node's must show it not running.

The broker binary (--bin, WARREN_BIN, default target/release/warren) is copied first, so that a
rebuild during the run does not restart a node with another version.

Usage:
  checker.py --seed 7 [--duration 30] [--results FILE]   one run; exit 1 on a failure
  checker.py --workload stream --seed 7                   the same on a replicated stream
  checker.py --short                                      the test-suite run: ~18 s, seed 1, a
                                                          leader kill and a pause, no final
                                                          restart; exit 0 ok, non-zero otherwise
Output: a human summary on stdout (with the tail of each node's log on failure); the run's JSON
line appended to --results; the run dir (node logs, checker.log, result.json) kept on failure or
with --keep.
Exit codes: 0 ok; 1 a failure (lost messages, redelivered-flag violations, a node or replica that
did not come back, an incomplete drain; for a stream: copies that differ, an offset given to two
bodies, a consumer that skipped or went back, a copy that could not be read); 2 the harness
failed; 130 interrupted. The JSON line of a stream run carries "workload": "stream". Every node is
stopped on exit, Ctrl-C and exceptions included (and SIGKILLed by the kernel if the checker is).
"""

from __future__ import annotations

import argparse
import asyncio
import atexit
import base64
import ctypes
import datetime
import json
import os
import random
import re
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time
import traceback
import urllib.error
import urllib.request
import uuid
from pathlib import Path

import pika
import pika.exceptions
import pika.spec
from pika.adapters.asyncio_connection import AsyncioConnection

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
DEFAULT_BIN = os.environ.get("WARREN_BIN", str(ROOT / "target" / "release" / "warren"))
QUEUE = "faults-qq"
STREAM = "faults-stream"  # the stream workload's queue
# The link preamble's magic: "WARRENL" and a version digit (L2 since the links' runs; the
# proxy only needs to recognise it, to read the dialer's name and address after it).
MAGIC = b"WARRENL"
PERSISTENT = pika.BasicProperties(delivery_mode=2)
FAULT_KINDS = ("kill-leader", "kill-follower", "pause", "partition", "torn")


def is_log_tail(p: Path) -> bool:
    """A Raft log's end, where a torn write can happen: the newest segment of a log/ directory
    (<hex first index>.seg, the current layout), or an earlier version's single raft.log."""
    if p.name == "raft.log":
        return True
    if p.suffix != ".seg" or p.parent.name != "log":
        return False
    segs = sorted(q.name for q in p.parent.glob("*.seg") if q.stat().st_size > 0)
    return bool(segs) and segs[-1] == p.name
def stream_dirs(data_dir: Path) -> list[Path]:
    """The streams' directories under a node's data dir: vhosts/<vhost>/queues/<id>/ holding
    segment files (*.seg) or a Raft group (group/)."""
    out = []
    for q in sorted(data_dir.glob("vhosts/*/queues/*")):
        if q.is_dir() and ((q / "group").is_dir() or any(q.glob("*.seg"))):
            out.append(q)
    return out


def stream_tear_candidates(data_dir: Path, which: str) -> list[Path]:
    """What the torn fault may damage in a stream's directory: with --torn-files logs the newest
    non-empty segment file (<first offset>.seg, the one being appended to) and its Raft group's
    log tail (group/log/); with all, every non-empty file there (checkpoint `applied`,
    tracking.wrn, group/vote.json, committed.json, snapshot.bin too)."""
    files = []
    for d in stream_dirs(data_dir):
        if which == "all":
            files += [p for p in sorted(d.rglob("*")) if p.is_file() and p.stat().st_size > 0]
            continue
        segs = sorted((p for p in d.glob("*.seg") if p.is_file() and p.stat().st_size > 0),
                      key=lambda p: (len(p.name), p.name))
        if segs:
            files.append(segs[-1])
        log = d / "group" / "log"
        if log.is_dir():
            files += [p for p in sorted(log.glob("*")) if p.is_file() and p.stat().st_size > 0
                      and is_log_tail(p)]
    return files


ALL_KINDS = FAULT_KINDS + ("stall",)
LOG_TAIL_LINES = 60
# A member whose copy of the queue (its Raft group) does not open runs on without it: the node
# answers, the queue has one member fewer. Only its log tells.
REPLICA_FAILED = "cannot open the queue's replica"
# The same for a replicated stream: its group or its segments do not open, or its member stops
# applying (the node answers, the stream runs a member short).
STREAM_REPLICA_FAILED = ("cannot open the stream's group", "cannot open the log of stream",
                         "cannot make this node's copy a member's", "this member stops applying")
SHORT_SEED = 1

_libc = ctypes.CDLL(None, use_errno=True)
# Every node process this checker started: killed at exit whatever happens (atexit), and
# SIGKILLed by the kernel should the checker itself be SIGKILLed (PR_SET_PDEATHSIG).
_PROCS: list[subprocess.Popen] = []


@atexit.register
def _kill_leftovers() -> None:
    for p in _PROCS:
        if p.poll() is None:
            try:
                p.kill()
                p.wait(5)
            except Exception:  # noqa: BLE001
                pass


def _die_with_parent() -> None:
    """In the child before exec: SIGKILL when the checker dies (PR_SET_PDEATHSIG), so that no
    node outlives a checker killed with SIGKILL."""
    _libc.prctl(1, signal.SIGKILL, 0, 0, 0)


_TAKEN: set[int] = set()


def free_port() -> int:
    """A port free now, below the kernel's ephemeral range: a port the kernel hands out (bind to
    0) is free only until some outgoing connection takes it as its source port, and a node that
    then cannot listen fails the run before any fault (seed 442 of 2026-11-27's campaign).
    Never the same port twice in one checker."""
    lo = 20000
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            lo = min(lo, int(f.read().split()[0]) - 1000)
    except (OSError, ValueError, IndexError):
        pass
    rng = random.SystemRandom()
    for _ in range(1000):
        port = rng.randrange(10000, max(lo, 10001))
        if port in _TAKEN:
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        _TAKEN.add(port)
        return port
    raise HarnessError("no free port below the ephemeral range")


def api_get(port: int, path: str, timeout: float = 2.0):
    """(status, JSON) of a management API GET as guest; (None, None) if unreachable."""
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}")
    req.add_header("Authorization", "Basic " + base64.b64encode(b"guest:guest").decode())
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            text = r.read()
            return r.status, (json.loads(text) if text.strip() else None)
    except urllib.error.HTTPError as e:
        return e.code, None
    except (OSError, ValueError):
        return None, None


def snapshot_binary(path: str) -> tuple[str, dict]:
    """A private copy of the broker binary, so that a rebuild during the run (cargo replaces
    target/release/warren) does not restart a node with another version. Copies are cached by
    size and mtime under the temp dir."""
    st = os.stat(path)
    info = {"path": path, "size": st.st_size,
            "mtime": datetime.datetime.fromtimestamp(st.st_mtime).isoformat(timespec="seconds")}
    cache = Path(tempfile.gettempdir()) / "warren-faults-bin" / f"{st.st_size}-{st.st_mtime_ns}"
    dest = cache / "warren"
    if not dest.exists():
        cache.mkdir(parents=True, exist_ok=True)
        tmp = cache / f"warren.{os.getpid()}.tmp"
        shutil.copy2(path, tmp)
        st2 = os.stat(path)
        if (st2.st_size, st2.st_mtime_ns) != (st.st_size, st.st_mtime_ns):
            tmp.unlink()
            raise HarnessError(f"{path} changed while it was copied (a build is writing it?)")
        os.replace(tmp, dest)
        # Copies of older builds, once no run can still be using them: another checker (the
        # test suite's --short run, say) may be running a different binary right now.
        for old in cache.parent.iterdir():
            try:
                stale = time.time() - old.stat().st_mtime > 3600
            except OSError:
                continue
            if old != cache and stale:
                shutil.rmtree(old, ignore_errors=True)
    return str(dest), info


class Clock:
    def __init__(self) -> None:
        self.t0 = time.monotonic()

    def now(self) -> float:
        return time.monotonic() - self.t0


# ---------------------------------------------------------------------------------------------
# Nodes


class Node:
    def __init__(self, run: "Run", i: int):
        self.run = run
        self.i = i
        self.name = f"warren{i}@localhost"
        self.amqp_port = free_port()
        self.http_port = free_port()
        self.listen_port = free_port()  # L_i: where the node's link listener binds
        self.adv_port = 0                # X_i: the proxy, set when it listens
        self.data_dir = run.dir / f"n{i}"
        self.log_path = run.dir / f"n{i}.log"
        self.conf_path = run.dir / f"n{i}.toml"
        self.proc: subprocess.Popen | None = None
        self.paused = False
        self.starts = 0

    @property
    def adv_addr(self) -> str:
        return f"127.0.0.1:{self.adv_port}"

    def write_config(self, cookie: str, peers: list[str]) -> None:
        q = json.dumps  # a JSON string is a valid TOML basic string
        self.conf_path.write_text(
            f"node_name = {q(self.name)}\n"
            f"data_dir = {q(str(self.data_dir))}\n"
            f"amqp_port = {self.amqp_port}\n"
            f"http_port = {self.http_port}\n"
            + ("quorum_queues_on_machine = true\n" if self.run.args.machine else "")
            + f"[cluster]\n"
            f"listen = {q(f'127.0.0.1:{self.listen_port}')}\n"
            f"advertise = {q(self.adv_addr)}\n"
            f"peers = [{', '.join(q(p) for p in peers)}]\n"
            f"cookie = {q(cookie)}\n")

    def start(self) -> None:
        assert not self.running, f"{self.name} already running"
        env = dict(os.environ)
        env.pop("WARREN_COOKIE", None)
        env.pop("WARREN_LOG", None)
        with open(self.log_path, "ab") as log:
            log.write(f"=== checker t={self.run.clock.now():.3f} starting {self.name}\n".encode())
            log.flush()
            self.proc = subprocess.Popen([self.run.bin, "server", "--config", str(self.conf_path)],
                                         env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                                         start_new_session=True, preexec_fn=_die_with_parent)
        _PROCS.append(self.proc)
        self.paused = False
        self.starts += 1

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def mark(self, text: str) -> None:
        try:
            with open(self.log_path, "ab") as log:
                log.write(f"=== checker t={self.run.clock.now():.3f} {text}\n".encode())
        except OSError:
            pass

    async def kill9(self) -> None:
        if self.running:
            self.mark(f"kill -9 {self.name}")
            self.proc.kill()
            await asyncio.to_thread(self.proc.wait, 10)
        self.paused = False

    def pause(self) -> None:
        if self.running:
            self.mark(f"SIGSTOP {self.name}")
            os.kill(self.proc.pid, signal.SIGSTOP)
            self.paused = True

    def resume(self) -> None:
        if self.running and self.paused:
            os.kill(self.proc.pid, signal.SIGCONT)
            self.mark(f"SIGCONT {self.name}")
        self.paused = False

    def stop_now(self, grace: float = 5.0) -> None:
        """Blocking: SIGCONT+SIGTERM, SIGKILL after grace. Used by cleanup."""
        if self.proc is None or self.proc.poll() is not None:
            return
        try:
            os.kill(self.proc.pid, signal.SIGCONT)
            self.proc.terminate()
            self.proc.wait(grace)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)
        except ProcessLookupError:
            pass
        self.paused = False

    async def terminate(self) -> None:
        if self.running:
            self.mark(f"SIGTERM {self.name}")
            await asyncio.to_thread(self.stop_now, 10.0)

    async def api(self, path: str, timeout: float = 2.0):
        return await asyncio.to_thread(api_get, self.http_port, path, timeout)

    async def ready(self) -> bool:
        if not self.running or self.paused:
            return False
        st, _ = await self.api("/api/overview", 2.0)
        return st == 200

    async def wait_ready(self, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while not await self.ready():
            if not self.running:
                raise HarnessError(f"{self.name} exited with status {self.proc.returncode} before it was "
                                   f"ready")
            if time.monotonic() > deadline:
                raise HarnessError(f"{self.name} did not answer /api/overview within {timeout}s")
            await asyncio.sleep(0.1)

    def log_tail(self, lines: int = LOG_TAIL_LINES, quiet: bool = False) -> str:
        """The log's last lines; quiet: without openraft's routine WARN/ERROR lines."""
        try:
            text = self.log_path.read_bytes().decode("utf-8", "replace")
        except OSError:
            return ""
        all_lines = text.splitlines()
        if quiet:
            all_lines = [ln for ln in all_lines if " openraft::" not in ln]
        return "\n".join(all_lines[-lines:])

    def log_grep(self, needle: str) -> list[str]:
        try:
            text = self.log_path.read_bytes().decode("utf-8", "replace")
        except OSError:
            return []
        return [ln for ln in text.splitlines() if needle in ln]

    def log_problems(self) -> list[str]:
        """Log lines at WARN/ERROR level or with a panic (the engineer wants to see them)."""
        try:
            text = self.log_path.read_bytes().decode("utf-8", "replace")
        except OSError:
            return []
        # openraft's own WARN/ERROR lines (unreachable peers, stale votes) are routine under faults
        return [ln for ln in text.splitlines()
                if ("panicked" in ln or " ERROR " in ln or " WARN " in ln) and " openraft::" not in ln]


class HarnessError(Exception):
    pass


# ---------------------------------------------------------------------------------------------
# Network: one TCP proxy per node, in front of its link listener


class Conn:
    __slots__ = ("src", "dst", "client", "server", "closed", "opened")

    def __init__(self, dst: int, client: asyncio.StreamWriter, opened: float):
        self.src: int | None = None
        self.dst = dst
        self.client = client
        self.server: asyncio.StreamWriter | None = None
        self.closed = False
        self.opened = opened

    def abort(self) -> None:
        self.closed = True
        for w in (self.client, self.server):
            if w is not None:
                try:
                    w.transport.abort()
                except Exception:  # noqa: BLE001
                    pass


class Net:
    def __init__(self, run: "Run"):
        self.run = run
        self.cut: set[int] = set()      # isolated: connections aborted, new ones refused
        self.stalled: set[int] = set()  # silent: connections held open, no byte passes
        self.conns: set[Conn] = set()
        self.addr_idx: dict[str, int] = {}
        self.servers: list[asyncio.base_events.Server] = []
        self.refused = 0
        self.accepted = 0
        self.tasks: set[asyncio.Task] = set()
        self._changed = asyncio.Event()

    async def start(self, nodes: list[Node]) -> None:
        for n in nodes:
            srv = await asyncio.start_server(lambda r, w, n=n: self.handle(r, w, n),
                                             "127.0.0.1", 0)
            n.adv_port = srv.sockets[0].getsockname()[1]
            self.addr_idx[n.adv_addr] = n.i
            self.servers.append(srv)

    async def close(self) -> None:
        for s in self.servers:
            s.close()
        for c in list(self.conns):
            c.abort()
        tasks = [t for t in self.tasks if not t.done()]
        if tasks:
            # aborted connections end their pumps; cancel only what is still stuck
            _, stuck = await asyncio.wait(tasks, timeout=2)
            for t in stuck:
                t.cancel()
            await asyncio.gather(*stuck, return_exceptions=True)

    def _signal(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()

    def isolate(self, i: int) -> int:
        self.cut.add(i)
        aborted = 0
        for c in list(self.conns):
            if c.src == i or c.dst == i:
                c.abort()
                aborted += 1
        self._signal()
        return aborted

    def stall(self, i: int) -> None:
        self.stalled.add(i)
        self._signal()

    def heal(self, i: int | None = None) -> None:
        if i is None:
            self.cut.clear()
            self.stalled.clear()
        else:
            self.cut.discard(i)
            self.stalled.discard(i)
        self._signal()

    def is_stalled(self, c: Conn) -> bool:
        return c.src in self.stalled or c.dst in self.stalled

    def links(self) -> list[tuple[int | None, int]]:
        return sorted(((c.src, c.dst) for c in self.conns if not c.closed),
                      key=lambda p: (p[0] or 0, p[1]))

    async def _preamble(self, r: asyncio.StreamReader) -> tuple[bytes, str | None]:
        """The dialer's first bytes: magic (8 bytes), u16-length name, u16-length advertised
        address. A preamble not recognised leaves the connection's source unknown (None): a
        partition then cuts only what was dialed to the victim, not what it dials."""
        raw = await r.readexactly(8)
        if raw[:7] != MAGIC or not raw[7:8].isdigit():
            return raw, None
        n = await r.readexactly(2)
        name = await r.readexactly(struct.unpack(">H", n)[0])
        m = await r.readexactly(2)
        addr = await r.readexactly(struct.unpack(">H", m)[0])
        return raw + n + name + m + addr, addr.decode("utf-8", "replace")

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, node: Node) -> None:
        conn = Conn(node.i, writer, self.run.clock.now())
        me = asyncio.current_task()
        self.tasks.add(me)
        me.add_done_callback(self.tasks.discard)
        try:
            if node.i in self.cut:
                self.refused += 1
                conn.abort()
                return
            head, addr = await asyncio.wait_for(self._preamble(reader), 5)
            conn.src = self.addr_idx.get(addr or "")
            if conn.src in self.cut or node.i in self.cut:
                self.refused += 1
                conn.abort()
                return
            sr, sw = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", node.listen_port), 3)
        except (OSError, asyncio.TimeoutError, asyncio.IncompleteReadError):
            conn.abort()
            return
        conn.server = sw
        self.conns.add(conn)
        self.accepted += 1
        try:
            await asyncio.gather(self._pump(conn, reader, sw, head), self._pump(conn, sr, writer))
        except asyncio.CancelledError:
            pass  # shutting down (a cancelled client_connected_cb task gets logged by asyncio)
        finally:
            conn.abort()
            self.conns.discard(conn)

    async def _pump(self, conn: Conn, r: asyncio.StreamReader, w: asyncio.StreamWriter,
                    data: bytes = b"") -> None:
        """Copies r to w until either side ends; while a stall covers the connection, bytes are
        held (not read further: TCP backs the sender up) until the heal."""
        try:
            while not conn.closed:
                if data:
                    while self.is_stalled(conn) and not conn.closed:
                        await self._changed.wait()
                    if conn.closed:
                        break
                    w.write(data)
                    await w.drain()
                data = await r.read(65536)
                if not data:
                    break
        except (OSError, ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            conn.abort()


# ---------------------------------------------------------------------------------------------
# What happened to every message


class Recorder:
    def __init__(self, clock: Clock, log=None):
        self.clock = clock
        self.log = log
        # id -> dict(pub, node, sent, state, done)
        self.msgs: dict[str, dict] = {}
        # id -> [(t, consumer, node, redelivered, phase)]
        self.deliveries: dict[str, list[tuple]] = {}
        self.acks: dict[str, list[float]] = {}
        self.confirm_times: list[float] = []
        self.events: list[tuple[float, str]] = []
        self.phase = "run"

    def event(self, text: str) -> None:
        self.events.append((round(self.clock.now(), 3), text))
        if self.log is not None:
            self.log(text)

    def sent(self, mid: str, pub: int, node: int) -> None:
        self.msgs[mid] = {"pub": pub, "node": node, "sent": self.clock.now(), "state": "pending",
                          "done": None}

    def settle(self, mid: str, state: str) -> None:
        m = self.msgs.get(mid)
        if m is None or m["state"] != "pending":
            return
        t = self.clock.now()
        m["state"], m["done"] = state, t
        if state == "confirmed":
            self.confirm_times.append(t)

    def delivered(self, mid: str, consumer: str, node: int, redelivered: bool) -> None:
        self.deliveries.setdefault(mid, []).append(
            (round(self.clock.now(), 3), consumer, node, bool(redelivered), self.phase))

    def acked(self, mid: str) -> None:
        self.acks.setdefault(mid, []).append(self.clock.now())


# ---------------------------------------------------------------------------------------------
# Clients (pika's asyncio adapter, on the checker's event loop)


def conn_params(node: Node, heartbeat: int = 3) -> pika.ConnectionParameters:
    return pika.ConnectionParameters(
        host="127.0.0.1", port=node.amqp_port, credentials=pika.PlainCredentials("guest", "guest"),
        heartbeat=heartbeat, connection_attempts=1, socket_timeout=3, stack_timeout=6,
        blocked_connection_timeout=30)


def abort_connection(conn, why: str = "dropped by the checker") -> None:
    """Drop the TCP connection now (a client that gives up on a connection), no close handshake;
    the connection's on_close callback follows (with a StreamLostError)."""
    try:
        if conn.is_closed:
            return
        if getattr(conn, "_opened", False):
            # pika's own path (it records the error the close callback gets, stops heartbeats)
            conn._terminate_stream(pika.exceptions.StreamLostError(why))
        else:
            conn._adapter_disconnect_stream()
    except Exception:  # noqa: BLE001
        try:
            conn.close()
        except Exception:  # noqa: BLE001
            pass


class Client:
    """A pika connection with one channel, opened through futures."""

    def __init__(self, run: "Run", label: str, seed_key: str):
        self.run = run
        self.label = label
        self.rng = random.Random(seed_key)
        self.stop = False
        self.conn = None
        self.ch = None
        self.node: Node | None = None
        self.closed: asyncio.Future | None = None
        self.last_node: int | None = None
        self.connects = 0
        self.connect_failures = 0

    def pick_node(self) -> Node:
        nodes = self.run.nodes
        choices = [n for n in nodes if n.i != self.last_node] or nodes
        n = self.rng.choice(choices)
        self.last_node = n.i
        return n

    async def open(self, node: Node, setup) -> bool:
        """Connection + channel; setup(ch, done_future) finishes the channel's setup."""
        loop = asyncio.get_running_loop()
        opened = loop.create_future()
        closed = loop.create_future()
        self.closed = closed
        self.node = node

        def finish(fut, v):
            if not fut.done():
                fut.set_result(v)

        def on_channel(ch):
            self.ch = ch
            ch.add_on_close_callback(lambda c, reason: on_channel_closed(c, reason))
            setup(ch, opened)

        def on_channel_closed(ch, reason):
            if not isinstance(reason, pika.exceptions.ChannelClosedByClient):
                self.run.rec.event(f"{self.label}: channel closed on {node.name}: {reason!r}")
            if conn.is_open:
                conn.close()
            finish(opened, False)

        def on_open(c):
            c.channel(on_open_callback=on_channel)

        def on_open_error(c, err):
            finish(opened, False)
            finish(closed, err)

        def on_close(c, reason):
            finish(opened, False)
            finish(closed, reason)

        try:
            conn = AsyncioConnection(conn_params(node), on_open_callback=on_open,
                                     on_open_error_callback=on_open_error,
                                     on_close_callback=on_close, custom_ioloop=loop)
        except Exception as e:  # noqa: BLE001
            self.run.rec.event(f"{self.label}: cannot connect to {node.name}: {e!r}")
            return False
        self.conn = conn
        try:
            ok = await asyncio.wait_for(asyncio.shield(opened), 8)
        except asyncio.TimeoutError:
            ok = False
        if not ok:
            self.connect_failures += 1
            if not closed.done():
                abort_connection(conn)
                try:
                    await asyncio.wait_for(asyncio.shield(closed), 3)
                except asyncio.TimeoutError:
                    pass
            return False
        self.connects += 1
        return True

    async def close(self, graceful: bool = True) -> None:
        if self.conn is None or self.closed is None or self.closed.done():
            return
        if graceful and self.conn.is_open:
            try:
                self.conn.close()
            except Exception:  # noqa: BLE001
                pass
            try:
                await asyncio.wait_for(asyncio.shield(self.closed), 3)
                return
            except asyncio.TimeoutError:
                pass
        abort_connection(self.conn)
        try:
            await asyncio.wait_for(asyncio.shield(self.closed), 3)
        except asyncio.TimeoutError:
            pass


class Publisher(Client):
    def __init__(self, run: "Run", pid: int):
        super().__init__(run, f"publisher {pid}", f"{run.seed}-pub-{pid}")
        # the first connection: publishers spread over the nodes (rotated by the seed)
        self.first_node: Node | None = run.nodes[(run.seed + pid) % 3]
        self.pid = pid
        self.seq = 0
        self.outstanding: dict[int, str] = {}
        self.next_tag = 1
        self.gen = 0
        self.timeouts = 0
        self.nack_switches = 0
        self.last_ack = 0.0
        self.last_nack = 0.0

    def _setup(self, ch, opened):
        gen = self.gen

        def on_ack_nack(frame):
            if gen != self.gen:
                return
            m = frame.method
            state = "confirmed" if isinstance(m, pika.spec.Basic.Ack) else "nacked"
            if m.multiple:
                tags = [t for t in self.outstanding if t <= m.delivery_tag]
            else:
                tags = [m.delivery_tag]
            for t in tags:
                mid = self.outstanding.pop(t, None)
                if mid is not None:
                    self.run.rec.settle(mid, state)
            if state == "confirmed":
                self.last_ack = time.monotonic()
            else:
                self.last_nack = time.monotonic()

        ch.confirm_delivery(ack_nack_callback=on_ack_nack,
                            callback=lambda _f: opened.done() or opened.set_result(True))

    def _lost_connection(self) -> None:
        for mid in self.outstanding.values():
            self.run.rec.settle(mid, "unknown")
        self.outstanding.clear()

    async def run_loop(self) -> None:
        a = self.run.args
        interval = 1.0 / a.rate
        loop = asyncio.get_running_loop()
        while not self.stop:
            if self.first_node is not None:
                node, self.first_node = self.first_node, None
                self.last_node = node.i
            else:
                node = self.pick_node()
            self.gen += 1
            self.next_tag = 1
            self.outstanding = {}
            if not await self.open(node, self._setup):
                await asyncio.sleep(self.rng.uniform(0.2, 0.5))
                continue
            self.run.rec.event(f"{self.label}: connected to {node.name}")
            next_t = loop.time()
            self.last_ack = time.monotonic()
            while not self.stop and not self.closed.done():
                if (self.last_nack > self.last_ack
                        and time.monotonic() - self.last_ack > a.nack_switch):
                    # only nacks for a while (the node cannot reach a leader): try another node
                    self.nack_switches += 1
                    self.run.rec.event(f"{self.label}: only nacks for {a.nack_switch}s on {node.name}: "
                                       f"switching node")
                    abort_connection(self.conn)
                    break
                if self.outstanding:
                    oldest = self.run.rec.msgs[next(iter(self.outstanding.values()))]["sent"]
                    if self.run.clock.now() - oldest > a.confirm_timeout:
                        self.timeouts += 1
                        self.run.rec.event(f"{self.label}: no confirm within {a.confirm_timeout}s on "
                                           f"{node.name} ({len(self.outstanding)} outstanding): "
                                           f"dropping the connection")
                        abort_connection(self.conn)
                        break
                if len(self.outstanding) < a.window and self.ch is not None and self.ch.is_open:
                    self.seq += 1
                    mid = f"p{self.pid}-{self.seq}"
                    try:
                        self.ch.basic_publish("", self.run.queue, mid.encode(), PERSISTENT)
                    except Exception:  # noqa: BLE001 - the channel/connection just closed
                        self.seq -= 1
                    else:
                        self.run.rec.sent(mid, self.pid, node.i)
                        self.outstanding[self.next_tag] = mid
                        self.next_tag += 1
                next_t += interval
                if next_t < loop.time() - 1.0:
                    next_t = loop.time()
                await asyncio.sleep(max(0.0, next_t - loop.time()))
            if self.stop and not self.closed.done():
                # the end: wait for the outstanding confirms, then leave
                deadline = time.monotonic() + a.final_confirm_wait
                while self.outstanding and not self.closed.done() and time.monotonic() < deadline:
                    await asyncio.sleep(0.05)
                await self.close()
            else:
                try:
                    await asyncio.wait_for(asyncio.shield(self.closed), 5)
                except asyncio.TimeoutError:
                    pass
                reason = self.closed.result() if self.closed.done() else "?"
                self.run.rec.event(f"{self.label}: connection to {node.name} gone: {reason!r}; "
                                   f"{len(self.outstanding)} publishes unknown")
            self._lost_connection()
            if not self.stop:
                await asyncio.sleep(self.rng.uniform(0.1, 0.4))


class ConsumingClient(Client):
    """What both consumers do: ack (while their connection is the current one), and sessions
    one after another through the nodes until stopped (`_started` and `_ended` tell a session
    apart)."""

    def _ack(self, ch, gen, tag, mid):
        if gen != self.gen or not ch.is_open:
            return
        try:
            ch.basic_ack(tag)
        except Exception:  # noqa: BLE001
            return
        self.run.rec.acked(mid)

    def _started(self, node: Node) -> str:
        """The event text of a session that has begun."""
        return f"{self.label}: consuming through {node.name}"

    def _ended(self) -> None:
        """A session's connection is over (before it is closed)."""

    async def run_loop(self) -> None:
        loop = asyncio.get_running_loop()
        while not self.stop:
            if self.first_node is not None:
                node, self.first_node = self.first_node, None
                self.last_node = node.i
            else:
                node = self.pick_node()
            self.gen += 1
            self.cancelled = loop.create_future()
            if not await self.open(node, self._setup):
                await asyncio.sleep(self.rng.uniform(0.3, 0.8))
                continue
            self.run.rec.event(self._started(node))
            lifetime = self.rng.uniform(*self.churn) if self.churn else 1e9
            end = time.monotonic() + lifetime
            while (not self.stop and not self.closed.done() and not self.cancelled.done()
                   and time.monotonic() < end):
                await asyncio.sleep(0.05)
            self._ended()
            if not self.closed.done():
                await self.close(graceful=True)
            else:
                self.run.rec.event(f"{self.label}: connection to {node.name} gone: "
                                   f"{self.closed.result()!r}")
            if not self.stop:
                await asyncio.sleep(self.rng.uniform(0.2, 1.0))



class Consumer(ConsumingClient):
    def __init__(self, run: "Run", cid: str, prefetch: int, ack_delay: float,
                 churn: tuple[float, float] | None, node: Node | None = None):
        super().__init__(run, f"consumer {cid}", f"{run.seed}-con-{cid}")
        self.cid = cid
        self.prefetch = prefetch
        self.ack_delay = ack_delay
        self.churn = churn
        self.first_node = node
        self.cancelled: asyncio.Future | None = None
        self.gen = 0
        self.server_cancels = 0
        self.last_delivery = time.monotonic()
        self.count = 0

    def _setup(self, ch, opened):
        gen = self.gen
        node = self.node
        cancelled = self.cancelled

        def on_message(c, method, props, body):
            mid = body.decode("utf-8", "replace")
            self.count += 1
            self.last_delivery = time.monotonic()
            self.run.rec.delivered(mid, self.cid, node.i, method.redelivered)
            tag = method.delivery_tag
            if self.ack_delay <= 0:
                self._ack(c, gen, tag, mid)
            else:
                asyncio.get_running_loop().call_later(self.rng.uniform(0, self.ack_delay),
                                                      self._ack, c, gen, tag, mid)

        def on_cancel(frame):
            self.server_cancels += 1
            self.run.rec.event(f"{self.label}: basic.cancel from {node.name}")
            if not cancelled.done():
                cancelled.set_result(True)

        def on_qos(_f):
            ch.add_on_cancel_callback(on_cancel)
            ch.basic_consume(self.run.queue, on_message, auto_ack=False,
                             callback=lambda _f: opened.done() or opened.set_result(True))

        ch.basic_qos(prefetch_count=self.prefetch, callback=on_qos)


class StreamConsumer(ConsumingClient):
    """A stream consumer (the stream workload): prefetch, manual acks (they only return credit),
    x-stream-offset. It starts at "first" and keeps the offset of the last delivery it saw (the
    client stores its offset: over AMQP 0-9-1 nothing else does); after a lost connection, a
    server basic.cancel or its own churn close it consumes again on another node from that
    offset + 1. Every delivery is recorded per session: (offset, body, time)."""

    def __init__(self, run: "Run", cid: str, prefetch: int, ack_delay: float,
                 churn: tuple[float, float] | None, node: Node | None = None):
        super().__init__(run, f"consumer {cid}", f"{run.seed}-con-{cid}")
        self.cid = cid
        self.prefetch = prefetch
        self.ack_delay = ack_delay
        self.churn = churn
        self.first_node = node
        self.cancelled: asyncio.Future | None = None
        self.gen = 0
        self.server_cancels = 0
        self.last_delivery = time.monotonic()
        self.count = 0
        self.last_offset: int | None = None  # the stored offset: the last one seen
        self.no_offset = 0                   # deliveries without an x-stream-offset header
        # one per basic.consume that was answered: node, start argument, deliveries [(offset, body, t)]
        self.sessions: list[dict] = []

    def _setup(self, ch, opened):
        gen = self.gen
        node = self.node
        cancelled = self.cancelled
        start = "first" if self.last_offset is None else self.last_offset + 1
        session = {"node": node.i, "start": start, "t": round(self.run.clock.now(), 3), "deliveries": []}

        def on_message(c, method, props, body):
            if gen != self.gen:
                return
            mid = body.decode("utf-8", "replace")
            off = (props.headers or {}).get("x-stream-offset")
            if not isinstance(off, int) or isinstance(off, bool):
                self.no_offset += 1
                off = None
            self.count += 1
            self.last_delivery = time.monotonic()
            session["deliveries"].append((off, mid, round(self.run.clock.now(), 3)))
            self.run.rec.delivered(mid, self.cid, node.i, method.redelivered)
            if off is not None:
                self.last_offset = off
            tag = method.delivery_tag
            if self.ack_delay <= 0:
                self._ack(c, gen, tag, mid)
            else:
                asyncio.get_running_loop().call_later(self.rng.uniform(0, self.ack_delay),
                                                      self._ack, c, gen, tag, mid)

        def on_cancel(frame):
            self.server_cancels += 1
            self.run.rec.event(f"{self.label}: basic.cancel from {node.name}")
            if not cancelled.done():
                cancelled.set_result(True)

        def on_consume_ok(_f):
            session["consume_ok"] = True
            if not opened.done():
                opened.set_result(True)

        def on_qos(_f):
            ch.add_on_cancel_callback(on_cancel)
            self.sessions.append(session)
            ch.basic_consume(self.run.queue, on_message, auto_ack=False,
                             arguments={"x-stream-offset": start}, callback=on_consume_ok)

        ch.basic_qos(prefetch_count=self.prefetch, callback=on_qos)

    def _started(self, node: Node) -> str:
        return (f"{self.label}: consuming through {node.name} from "
                f"{self.sessions[-1]['start'] if self.sessions else '?'}")

    def _ended(self) -> None:
        # nothing of this connection counts any more (a late delivery after the close
        # would be at an offset the next session reads again)
        self.gen += 1


# ---------------------------------------------------------------------------------------------
# The run


def make_schedule(seed: int, duration: float, kinds: list[str]) -> list[dict]:
    """The fault schedule: a pure function of the seed, the duration and the kinds enabled."""
    rng = random.Random(seed)
    t = 3.0 + rng.uniform(0, 1.0)
    out = []
    while True:
        kind = rng.choice(kinds)
        dur = round(rng.uniform(2.0, 5.0), 2)
        f = {"kind": kind, "at": round(t, 2), "dur": dur, "pick": round(rng.random(), 4)}
        if kind == "torn":
            f["bytes"] = rng.randint(1, 64)
            f["file_pick"] = round(rng.random(), 4)
        if t + dur > duration - 2.0:
            break
        out.append(f)
        t += dur + rng.uniform(3.0, 5.0)
    return out


def short_schedule() -> list[dict]:
    return [{"kind": "kill-leader", "at": 3.0, "dur": 3.0, "pick": 0.0},
            {"kind": "pause", "at": 10.0, "dur": 2.5, "pick": 0.5}]


class Run:
    def __init__(self, args):
        self.args = args
        self.seed = args.seed
        self.stream = args.workload == "stream"
        self.queue = STREAM if self.stream else QUEUE
        self.clock = Clock()
        self.dir = Path(tempfile.mkdtemp(prefix=f"warren-faults-s{args.seed}-", dir=args.tmp_root))
        self.rec = Recorder(self.clock, self.log)
        self.cookie = uuid.uuid4().hex
        self.nodes = [Node(self, i) for i in (1, 2, 3)]
        self.net: Net | None = None
        self.faults: list[dict] = []
        self.pub_end = 0.0
        self.setup = {}
        self.drain = {}
        self.broken: dict[str, str] = {}  # nodes that did not come back: name -> why
        self.replica_broken: dict[str, str] = {}  # nodes up whose replica of the queue did not open
        self.checker_log = open(self.dir / "checker.log", "a", buffering=1)
        self.bin, self.bin_info = snapshot_binary(args.bin)

    def log(self, text: str) -> None:
        line = f"[{self.clock.now():7.2f}] {text}"
        self.checker_log.write(line + "\n")
        if self.args.verbose:
            print(line, file=sys.stderr, flush=True)

    def replica_failed_lines(self, n: Node) -> list[str]:
        """The node's log lines saying that its replica of the queue (or stream) did not open."""
        if not self.stream:
            return n.log_grep(REPLICA_FAILED)
        return [ln for ln in n.log_grep("") if any(p in ln for p in STREAM_REPLICA_FAILED)]

    def by_name(self, name: str) -> Node | None:
        return next((n for n in self.nodes if n.name == name), None)

    async def leader_views(self) -> dict[str, str | None]:
        """What the management API of each healthy node names as the queue's leader ("node")."""
        healthy = [n for n in self.nodes if n.running and not n.paused
                   and n.i not in self.net.cut and n.i not in self.net.stalled]
        answers = await asyncio.gather(*(n.api(f"/api/queues/%2F/{self.queue}") for n in healthy))
        # a quorum queue's "node" is its leader; a stream's is "leader" (its "node" is where it
        # was declared)
        field = "leader" if self.stream else "node"
        return {n.name: (body.get(field) if st == 200 and isinstance(body, dict) else None)
                for n, (st, body) in zip(healthy, answers)}

    async def leader(self, timeout: float = 10.0) -> Node | None:
        """The queue's leader: the node that a majority of the cluster's nodes (2 of 3) name in
        the management API, running and not paused. One node's word is not taken: a node
        that has just restarted, or whose replica did not open, may name a stale leader."""
        deadline = time.monotonic() + timeout
        while True:
            views = await self.leader_views()
            names = [v for v in views.values() if v]
            for name in set(names):
                ld = self.by_name(name)
                if (names.count(name) >= 2 and ld is not None and ld.running and not ld.paused
                        and views.get(name) == name):
                    return ld
            if time.monotonic() > deadline:
                self.log(f"no agreed leader within {timeout}s; last views {views}")
                return None
            await asyncio.sleep(0.2)

    async def start_cluster(self) -> None:
        self.net = Net(self)
        await self.net.start(self.nodes)
        peers = [n.adv_addr for n in self.nodes]
        for n in self.nodes:
            n.data_dir.mkdir(parents=True, exist_ok=True)
            n.write_config(self.cookie, peers)
        for n in self.nodes:
            n.start()
        for n in self.nodes:
            await n.wait_ready(40)
        self.log("nodes ready: " + ", ".join(
            f"{n.name} amqp {n.amqp_port} http {n.http_port} link {n.listen_port} via {n.adv_port}"
            for n in self.nodes))
        await self.declare()
        ld = await self.leader(30)
        if ld is None:
            raise HarnessError(f"the {'stream' if self.stream else 'quorum queue'} has no leader 30 s after its "
                               f"declaration")
        # every node must see 3 members and the others running
        deadline = time.monotonic() + 20
        while True:
            views = [await n.api("/api/nodes") for n in self.nodes]
            ok = all(st == 200 and isinstance(b, list) and len(b) == 3
                     and all(x.get("running") for x in b) for st, b in views)
            if ok:
                break
            if time.monotonic() > deadline:
                raise HarnessError(f"/api/nodes does not show 3 running nodes everywhere: {views}")
            await asyncio.sleep(0.2)
        self.setup = {"leader": ld.name, "links": [list(x) for x in self.net.links()]}
        self.log(f"queue {self.queue} declared, leader {ld.name}; proxied links (src,dst): "
                 f"{self.net.links()}")

    async def declare(self) -> None:
        qtype = "stream" if self.stream else "quorum"

        def run():
            last = None
            for _ in range(40):
                for n in self.nodes:
                    try:
                        c = pika.BlockingConnection(conn_params(n, heartbeat=10))
                        try:
                            c.channel().queue_declare(self.queue, durable=True,
                                                      arguments={"x-queue-type": qtype})
                            return
                        finally:
                            try:
                                c.close()
                            except Exception:  # noqa: BLE001
                                pass
                    except Exception as e:  # noqa: BLE001
                        last = e
                time.sleep(0.5)
            raise HarnessError(f"cannot declare {self.queue}: {last!r}")
        await asyncio.to_thread(run)

    # -- faults ---------------------------------------------------------------------------

    async def fault_loop(self, schedule: list[dict]) -> None:
        for f in schedule:
            wait = f["at"] - self.clock.now()
            if wait > 0:
                await asyncio.sleep(wait)
            if self.broken or self.replica_broken:
                # a node (or its replica of the queue) is down for good: another fault would
                # take the majority down
                down = sorted(set(self.broken) | set(self.replica_broken))
                self.faults.append({"kind": f["kind"], "planned_at": f["at"], "dur": f["dur"],
                                    "skipped": f"down for good: {', '.join(down)}"})
                continue
            if self.clock.now() + f["dur"] > self.args.duration - 1.0:
                self.log(f"skipping {f['kind']}: the fault phase ends before it would")
                break
            rec = {"kind": f["kind"], "planned_at": f["at"], "dur": f["dur"]}
            self.faults.append(rec)
            try:
                await self.apply(f, rec)
            except HarnessError as e:
                rec["error"] = str(e)
                self.log(f"fault {f['kind']} failed: {e}")
                raise

    async def apply(self, f: dict, rec: dict) -> None:
        kind = f["kind"]
        leader = await self.leader(8)
        rec["leader_before"] = leader.name if leader else None
        if kind == "kill-leader":
            if leader is None:
                rec["skipped"] = "no leader found"
                self.log("kill-leader skipped: no leader")
                return
            victim = leader
        elif kind == "kill-follower":
            followers = [n for n in self.nodes if n is not leader]
            if leader is None:
                rec["skipped"] = "no leader found"
                return
            victim = followers[int(f["pick"] * len(followers))]
        else:
            victim = self.nodes[int(f["pick"] * len(self.nodes))]
        rec["node"] = victim.name
        rec["role"] = "leader" if victim is leader else "follower"
        rec["at"] = round(self.clock.now(), 3)
        self.rec.event(f"fault {kind} on {victim.name} ({rec['role']}) for {f['dur']}s")
        try:
            if kind in ("kill-leader", "kill-follower", "torn"):
                await victim.kill9()
                if kind == "torn":
                    rec["torn"] = self.tear(victim, f)
                    self.log(f"torn write: {rec['torn']}")
                await asyncio.sleep(f["dur"])
            elif kind == "pause":
                victim.pause()
                await asyncio.sleep(f["dur"])
            elif kind == "partition":
                rec["aborted_links"] = self.net.isolate(victim.i)
                victim.mark(f"partitioned {victim.name} (aborted {rec['aborted_links']} links)")
                rec["isolation_seen_s"] = await self.check_isolation(victim, f["dur"])
                rest = f["dur"] - (self.clock.now() - rec["at"])
                if rest > 0:
                    await asyncio.sleep(rest)
            elif kind == "stall":
                self.net.stall(victim.i)
                victim.mark(f"stalled the links of {victim.name}")
                await asyncio.sleep(f["dur"])
        finally:
            await self.restore(victim, kind, rec)

    async def restore(self, victim: Node, kind: str, rec: dict) -> None:
        rec["end"] = round(self.clock.now(), 3)
        if kind in ("kill-leader", "kill-follower", "torn"):
            victim.start()
        elif kind == "pause":
            victim.resume()
        elif kind in ("partition", "stall"):
            self.net.heal(victim.i)
            victim.mark(f"healed {victim.name}")
        self.log(f"restored {victim.name} after {kind}")
        before = len(self.replica_failed_lines(victim))
        if await self.ensure_up(victim, 30, f"after {kind}", start=False):
            rec["ready"] = round(self.clock.now(), 3)
            await asyncio.sleep(0.5)
            new = self.replica_failed_lines(victim)[before:]
            if new:
                rec["replica_failed"] = new[0][-300:]
                self.replica_broken[victim.name] = new[0][-300:]
                self.rec.event(f"{victim.name} is up but its replica of the queue did not open: {new[0][-200:]}")
        else:
            rec["ready"] = None
            rec["restart_failed"] = self.broken[victim.name]

    async def ensure_up(self, n: Node, timeout: float, when: str, start: bool = True) -> bool:
        """Starts n if it is not running and waits for it; a node that exits or does not answer
        is recorded in self.broken (a finding: the run fails) and the run goes on without it."""
        if start and not n.running:
            n.start()
        try:
            await n.wait_ready(timeout)
            self.broken.pop(n.name, None)
            return True
        except HarnessError as e:
            last = [ln for ln in n.log_tail(20).splitlines() if ln.startswith("warren:") or " ERROR " in ln]
            self.broken[n.name] = f"{when}: {e}" + (f"; log: {last[-1][:300]}" if last else "")
            self.rec.event(f"{n.name} did not come back {when}: {self.broken[n.name]}")
            if n.running:
                await n.kill9()
            return False

    def tear(self, victim: Node, f: dict) -> dict:
        files = []
        for sub in ("quorum", "raft"):
            base = victim.data_dir / sub
            if base.is_dir():
                for p in sorted(base.rglob("*")):
                    if p.is_file() and p.stat().st_size > 0:
                        if self.args.torn_files == "logs" and not is_log_tail(p):
                            continue
                        files.append(p)
        if self.stream:
            files += stream_tear_candidates(victim.data_dir, self.args.torn_files)
        if not files:
            return {"file": None}
        p = files[int(f["file_pick"] * len(files))]
        size = p.stat().st_size
        out = {"file": str(p.relative_to(victim.data_dir)), "size": size, "candidates": len(files),
               "mode": self.args.torn_mode}
        if self.args.torn_mode == "truncate":
            # the last record loses its end: a record that was fsynced (and acknowledged)
            cut = min(f["bytes"], size)
            with open(p, "r+b") as fh:
                fh.truncate(size - cut)
            out["cut"] = cut
        else:
            # a partial record after the last one: a write that never completed, so never
            # acknowledged (what a crash can really leave); bytes from the seed
            junk = random.Random(f"{self.seed}-{f['at']}").randbytes(f["bytes"])
            with open(p, "ab") as fh:
                fh.write(junk)
            out["appended"] = len(junk)
        return out

    async def check_isolation(self, victim: Node, limit: float) -> float | None:
        """Seconds until the isolated node's /api/nodes shows every other node not running, and
        another node's shows the isolated one not running (None: not within the fault)."""
        t0 = time.monotonic()
        body = other_view = None
        other = next(n for n in self.nodes if n is not victim)
        while time.monotonic() - t0 < min(limit, 6.0):
            st, body = await victim.api("/api/nodes", 1.5)
            st2, other_view = await other.api("/api/nodes", 1.5)
            if st == 200 and isinstance(body, list) and st2 == 200 and isinstance(other_view, list):
                others = [x for x in body if x.get("name") != victim.name]
                seen_by_other = [x for x in other_view if x.get("name") == victim.name]
                if (others and not any(x.get("running") for x in others)
                        and seen_by_other and not seen_by_other[0].get("running")):
                    return round(time.monotonic() - t0, 3)
            await asyncio.sleep(0.2)
        self.log(f"isolation of {victim.name} not seen: its /api/nodes {body}; {other.name}'s {other_view}")
        return None

    # -- phases ---------------------------------------------------------------------------

    async def workload(self) -> None:
        a = self.args
        schedule = short_schedule() if a.short else make_schedule(a.seed, a.duration, a.kinds)
        self.schedule = schedule
        self.log(f"schedule: {json.dumps(schedule)}")
        self.clock.t0 = time.monotonic()
        pubs = [Publisher(self, i + 1) for i in range(a.publishers)]
        ccls = StreamConsumer if self.stream else Consumer
        cons = [ccls(self, f"c{i + 1}", a.prefetch, a.ack_delay, (3.0, 10.0),
                     node=self.nodes[(a.seed + i + 2) % 3]) for i in range(a.consumers)]
        self.consumers = cons
        tasks = [asyncio.create_task(c.run_loop()) for c in pubs + cons]
        faults = asyncio.create_task(self.fault_loop(schedule))
        ticker = asyncio.create_task(self.ticker(pubs, cons))
        try:
            while self.clock.now() < a.duration:
                if faults.done() and faults.exception():
                    raise faults.exception()
                for t in tasks:
                    if t.done() and t.exception():
                        raise t.exception()
                await asyncio.sleep(0.2)
            await faults  # the fault in progress is undone first
        finally:
            if not faults.done():
                faults.cancel()
                await asyncio.gather(faults, return_exceptions=True)
            self.pub_end = self.clock.now()
            ticker.cancel()
            for c in pubs + cons:
                c.stop = True
            res = await asyncio.gather(*tasks, return_exceptions=True)
            for r in res:
                if isinstance(r, BaseException) and not isinstance(r, asyncio.CancelledError):
                    self.log(f"client task failed: {''.join(traceback.format_exception(r))}")
        self.clients = {"publishers": [{"connects": p.connects, "connect_failures": p.connect_failures,
                                        "confirm_timeouts": p.timeouts, "nack_switches": p.nack_switches,
                                        "sent": p.seq} for p in pubs],
                        "consumers": [{"connects": c.connects, "connect_failures": c.connect_failures,
                                       "server_cancels": c.server_cancels, "deliveries": c.count,
                                       **({"sessions": len(c.sessions), "last_offset": c.last_offset}
                                          if self.stream else {})}
                                      for c in cons]}

    async def ticker(self, pubs, cons) -> None:
        """Once a second in the checker's log: confirms, nacks and deliveries of the last second,
        and where each client is connected."""
        last = (0, 0, 0)
        while True:
            await asyncio.sleep(1.0)
            st = [m["state"] for m in self.rec.msgs.values()]
            now = (st.count("confirmed"), st.count("nacked"),
                   sum(len(d) for d in self.rec.deliveries.values()))
            where = " ".join(f"{c.label.split()[-1]}@{c.node.i if c.node else '-'}"
                             f"{'' if c.closed is not None and not c.closed.done() else '(x)'}"
                             for c in pubs + cons)
            self.log(f"tick: +{now[0] - last[0]} confirmed, +{now[1] - last[1]} nacked, "
                     f"+{now[2] - last[2]} delivered; {where}")
            last = now

    async def heal_and_restart(self) -> None:
        self.net.heal()
        for n in self.nodes:
            n.resume()
            if not n.running:
                n.start()
        for n in self.nodes:
            await self.ensure_up(n, 30, "at the final heal", start=False)
        mode = self.args.final_restart
        self.log(f"healed; final restart: {mode}")
        if mode != "none":
            for n in self.nodes:
                if mode == "kill":
                    await n.kill9()
                else:
                    await n.terminate()
            for n in self.nodes:
                n.start()
            for n in self.nodes:
                await self.ensure_up(n, 40, f"after the final restart ({mode})", start=False)

    async def drain_queue(self) -> None:
        self.rec.phase = "drain"
        t0 = self.clock.now()
        if len(self.broken) >= 2:
            self.drain = {"complete": False, "skipped": f"a majority of the nodes is down: {sorted(self.broken)}"}
            self.log(f"drain skipped: {self.drain['skipped']}")
            return
        ld = await self.leader(30)
        self.drain = {"leader": ld.name if ld else None,
                      "leader_after_s": round(self.clock.now() - t0, 3),
                      "leader_views": await self.leader_views()}
        if ld is None:
            self.log("drain: no leader within 30 s")
        c = Consumer(self, "drain", 500, 0.0, None, node=ld or self.nodes[0])
        task = asyncio.create_task(c.run_loop())
        deadline = time.monotonic() + self.args.drain_timeout
        complete = False
        empty_checks = 0
        try:
            while time.monotonic() < deadline:
                await asyncio.sleep(0.5)
                if task.done():
                    break
                if time.monotonic() - c.last_delivery < 2.0 or c.ch is None or not c.ch.is_open:
                    continue
                count = await self.ready_count()
                if count == 0:
                    empty_checks += 1
                    if empty_checks >= 2:
                        complete = True
                        break
                else:
                    empty_checks = 0
        finally:
            c.stop = True
            await asyncio.gather(task, return_exceptions=True)
        if complete:
            # the API agrees (its stats lag a little): no message left, ready or unacked
            for _ in range(12):
                counts = await self.api_message_count()
                if all(v == 0 for v in counts.values()):
                    break
                await asyncio.sleep(0.5)
            self.drain["api_messages"] = counts
            if not all(v == 0 for v in counts.values()):
                complete = False
        self.drain.update({"complete": complete, "deliveries": c.count,
                           "took_s": round(self.clock.now() - t0, 3)})
        self.log(f"drain: {self.drain}")

    async def ready_count(self) -> int | None:
        """The queue's ready messages by a passive queue.declare through its agreed leader (on a
        connection of its own); None if there is no leader or it does not answer."""
        ld = await self.leader(5)
        if ld is None:
            return None

        def run():
            try:
                conn = pika.BlockingConnection(conn_params(ld, heartbeat=10))
            except Exception:  # noqa: BLE001
                return None
            try:
                return conn.channel().queue_declare(self.queue, passive=True).method.message_count
            except Exception:  # noqa: BLE001
                return None
            finally:
                try:
                    conn.close()
                except Exception:  # noqa: BLE001
                    pass
        return await asyncio.to_thread(run)

    async def api_message_count(self) -> dict[str, object]:
        """"messages" (ready + unacked) of the queue in its agreed leader's API."""
        ld = await self.leader(5)
        if ld is None:
            return {"leader": None}
        st, body = await ld.api(f"/api/queues/%2F/{self.queue}")
        return {ld.name: body.get("messages") if st == 200 and isinstance(body, dict) else None}

    # -- the stream workload's end: every node's copy read from "first" -------------------

    def read_stream_blocking(self, node: Node, idle: float = 2.0, first_wait: float = 6.0,
                             limit: float = 90.0) -> dict:
        """The node's copy of the stream, read from "first" over AMQP on a connection of its
        own (prefetch 1000, acks to return credit) until nothing more comes for `idle` seconds:
        {"messages": [(offset, body)], "no_offset": deliveries without the header} or
        {"error": why}."""
        out: list[tuple[int | None, str]] = []
        no_offset = 0
        t0 = time.monotonic()
        try:
            conn = pika.BlockingConnection(conn_params(node, heartbeat=30))
        except Exception as e:  # noqa: BLE001
            return {"error": f"cannot connect: {e!r}"}
        try:
            ch = conn.channel()
            ch.basic_qos(prefetch_count=1000)
            last_tag = None
            for method, props, body in ch.consume(self.queue, auto_ack=False, inactivity_timeout=idle,
                                                  arguments={"x-stream-offset": "first"}):
                if method is None:
                    if out or time.monotonic() - t0 > first_wait:
                        break
                    continue
                off = (props.headers or {}).get("x-stream-offset")
                if not isinstance(off, int) or isinstance(off, bool):
                    no_offset += 1
                    off = None
                out.append((off, body.decode("utf-8", "replace")))
                last_tag = method.delivery_tag
                if len(out) % 250 == 0:
                    ch.basic_ack(last_tag, multiple=True)
                if time.monotonic() - t0 > limit:
                    return {"error": f"still reading after {limit}s ({len(out)} messages)",
                            "messages": out, "no_offset": no_offset}
            if last_tag is not None:
                ch.basic_ack(last_tag, multiple=True)
            try:
                ch.cancel()
            except Exception:  # noqa: BLE001
                pass
            return {"messages": out, "no_offset": no_offset}
        except Exception as e:  # noqa: BLE001
            return {"error": f"{e!r} after {len(out)} messages", "messages": out, "no_offset": no_offset}
        finally:
            try:
                conn.close()
            except Exception:  # noqa: BLE001
                pass

    async def read_stream_everywhere(self) -> None:
        """After the heal and the restart: every node's copy read from "first", again every 2 s
        (copies catching up after the restart) until they are identical and hold every
        confirmed message, or --drain-timeout. What was read last is what analyze checks."""
        self.rec.phase = "read"
        t0 = self.clock.now()
        self.final_reads: dict[str, dict] = {}
        if len(self.broken) >= 2:
            self.drain = {"complete": False, "skipped": f"a majority of the nodes is down: {sorted(self.broken)}"}
            self.log(f"final read skipped: {self.drain['skipped']}")
            return
        ld = await self.leader(30)
        self.drain = {"leader": ld.name if ld else None,
                      "leader_after_s": round(self.clock.now() - t0, 3),
                      "leader_views": await self.leader_views()}
        if ld is None:
            self.log("final read: no leader within 30 s")
        confirmed = {k for k, m in self.rec.msgs.items() if m["state"] == "confirmed"}
        nodes = [n for n in self.nodes if n.name not in self.broken]
        deadline = time.monotonic() + self.args.drain_timeout
        rounds = 0
        while True:
            rounds += 1
            for n in nodes:
                self.final_reads[n.name] = await asyncio.to_thread(self.read_stream_blocking, n)
            lists = [r.get("messages") if not r.get("error") else None for r in self.final_reads.values()]
            sizes = {k: (len(r.get("messages") or []), r.get("error")) for k, r in self.final_reads.items()}
            self.log(f"final read, round {rounds}: {sizes}")
            done = (all(x is not None for x in lists) and all(x == lists[0] for x in lists)
                    and confirmed <= {b for _, b in lists[0]})
            # copies that differ (neither a prefix of the other) will not agree by waiting
            longest = max((x for x in lists if x is not None), key=len, default=[])
            diverged = any(x is not None and x != longest[:len(x)] for x in lists)
            if diverged:
                self.log("final read: the copies differ (not a prefix of one another): not waiting")
            if done or diverged or time.monotonic() > deadline:
                break
            await asyncio.sleep(2.0)
        self.drain.update({"complete": all(not r.get("error") for r in self.final_reads.values()),
                           "rounds": rounds, "converged": done,
                           "read": {k: len(r.get("messages") or []) for k, r in self.final_reads.items()},
                           "errors": {k: r["error"] for k, r in self.final_reads.items() if r.get("error")},
                           "took_s": round(self.clock.now() - t0, 3)})
        self.log(f"final read: {self.drain}")

    def analyze_stream(self, consumers: list["StreamConsumer"]) -> dict:
        """The stream workload's checks (see the docstring): lost, the copies, each consumer's
        offsets, duplicates."""
        rec = self.rec
        msgs = rec.msgs
        states = {"confirmed": 0, "nacked": 0, "unknown": 0, "pending": 0}
        for m in msgs.values():
            states[m["state"]] += 1
        confirmed = {k for k, m in msgs.items() if m["state"] == "confirmed"}
        reads = {k: r.get("messages") or [] for k, r in getattr(self, "final_reads", {}).items()}
        bodies_by_node = {k: {b for _, b in ms} for k, ms in reads.items()}
        union = set().union(*bodies_by_node.values()) if bodies_by_node else set()

        # (a) lost: confirmed and in no copy; and confirmed but missing from some node's copy
        lost = sorted(confirmed - union, key=lambda k: msgs[k]["sent"])
        lost_on = {k: sorted(confirmed - b, key=lambda x: msgs[x]["sent"]) for k, b in bodies_by_node.items()}
        lost_on_some = sorted(set().union(*lost_on.values()) if lost_on else set(), key=lambda k: msgs[k]["sent"])

        # (b) the copies: offsets dense from the first; the same (offset, body) on every node
        copy_problems = []
        for k, ms in reads.items():
            no_off = sum(1 for o, _ in ms if o is None)
            if no_off:
                copy_problems.append({"node": k, "problem": "deliveries without x-stream-offset", "count": no_off})
            offs = [o for o, _ in ms if o is not None]
            bad = [(i, a, b) for i, (a, b) in enumerate(zip(offs, offs[1:])) if b != a + 1]
            if bad:
                copy_problems.append({"node": k, "problem": "offsets not dense", "count": len(bad),
                                      "first": [{"after": a, "next": b} for _, a, b in bad[:10]]})
        # the reference copy: the one most nodes hold (the longest among equals)
        ref_name = max(reads, key=lambda k: (sum(1 for v in reads.values() if v == reads[k]), len(reads[k])),
                       default=None)
        ref = reads.get(ref_name, [])
        ref_body = {o: b for o, b in ref if o is not None}
        copies = {}
        for k, ms in reads.items():
            if ms == ref:
                copies[k] = "identical"
                continue
            i = next((i for i, (a, b) in enumerate(zip(ms, ref)) if a != b), None)
            if i is None:
                copies[k] = f"behind by {len(ref) - len(ms)} (a prefix of {ref_name}'s {len(ref)})"
                copy_problems.append({"node": k, "problem": "copy behind", "read": len(ms), "ref": ref_name,
                                      "ref_read": len(ref)})
            else:
                copies[k] = f"differs from {ref_name}'s at position {i}: {ms[i]} vs {ref[i]}"
                copy_problems.append({"node": k, "problem": "copy differs", "position": i, "here": ms[i],
                                      "ref": ref_name, "there": ref[i]})
        # an offset given to two bodies, in the copies or in what the consumers were given
        by_offset: dict[int, set[str]] = {}
        for ms in reads.values():
            for o, b in ms:
                if o is not None:
                    by_offset.setdefault(o, set()).add(b)
        for c in consumers:
            for sess in c.sessions:
                for o, b, _t in sess["deliveries"]:
                    if o is not None:
                        by_offset.setdefault(o, set()).add(b)
        conflicts = sorted(o for o, bs in by_offset.items() if len(bs) > 1)

        # (c) each consumer: increasing offsets, resumed at its stored offset + 1, nothing of what
        # the stream holds between its start and its last offset skipped
        ref_offs = [o for o, _ in ref if o is not None]
        ref_first = ref_offs[0] if ref_offs else None
        ref_last = ref_offs[-1] if ref_offs else None
        consumer_report = []
        violations = []
        for c in consumers:
            seen: list[int] = []
            prev = None
            first_start = None
            got_bodies: set[str] = set()
            mismatched = []
            for si, sess in enumerate(c.sessions):
                for o, b, t in sess["deliveries"]:
                    got_bodies.add(b)
                    if o is not None and o in ref_body and ref_body[o] != b:
                        mismatched.append({"session": si, "node": sess["node"], "offset": o, "got": b,
                                           "reference": ref_body[o], "t": t})
                offs = [o for o, _b, _t in sess["deliveries"] if o is not None]
                if not offs:
                    continue
                start = sess["start"]
                if first_start is None:
                    first_start = ref_first if start == "first" else start
                want = (ref_first if start == "first" else start)
                if want is not None and offs[0] != want:
                    violations.append({"consumer": c.cid, "session": si, "node": sess["node"],
                                       "problem": "did not start where asked", "asked": start,
                                       "first_offset": offs[0], "t": sess["t"]})
                for o in offs:
                    if prev is not None and o <= prev:
                        violations.append({"consumer": c.cid, "session": si, "node": sess["node"],
                                           "problem": "offset not increasing", "after": prev, "got": o})
                    prev = o
                    seen.append(o)
            missing = []
            beyond = []
            if seen and first_start is not None:
                seen_set = set(seen)
                missing = [o for o in ref_offs if first_start <= o <= seen[-1] and o not in seen_set]
                beyond = [o for o in seen if ref_last is None or o > ref_last]
            if missing:
                violations.append({"consumer": c.cid, "problem": "offsets skipped", "count": len(missing),
                                   "first": missing[:20]})
            # by body: what the reference copy holds between the consumer's first and last
            # offsets and the consumer never got (under any offset), and deliveries whose body
            # is not the reference's at that offset (a copy that numbers differently)
            bodies_missed = []
            if seen and first_start is not None:
                bodies_missed = [(o, b) for o, b in ref if o is not None and first_start <= o <= seen[-1]
                                 and b not in got_bodies]
            if bodies_missed:
                violations.append({"consumer": c.cid, "problem": "messages the stream holds in its range never "
                                   "delivered to it", "count": len(bodies_missed), "first": bodies_missed[:10]})
            if mismatched:
                violations.append({"consumer": c.cid, "problem": "deliveries whose body is not the reference "
                                   "copy's at that offset", "count": len(mismatched), "first": mismatched[:5]})
            if beyond:
                violations.append({"consumer": c.cid, "problem": "offsets beyond what the stream holds now",
                                   "count": len(beyond), "first": beyond[:20], "stream_last": ref_last})
            if c.no_offset:
                violations.append({"consumer": c.cid, "problem": "deliveries without x-stream-offset",
                                   "count": c.no_offset})
            consumer_report.append({"consumer": c.cid, "sessions": len(c.sessions),
                                    "deliveries": sum(len(x["deliveries"]) for x in c.sessions),
                                    "first": first_start, "last": seen[-1] if seen else None,
                                    "resumes": [[x["node"], x["start"]] for x in c.sessions][:40],
                                    "skipped": len(missing), "bodies_missed": len(bodies_missed),
                                    "mismatched": len(mismatched)})

        # duplicates: a body at two offsets (at-least-once: reported, not a failure)
        where: dict[str, list[int]] = {}
        for o, b in ref:
            where.setdefault(b, []).append(o)
        dups = {b: os_ for b, os_ in where.items() if len(os_) > 1}
        dup_confirmed = sorted(b for b in dups if b in confirmed)
        phantom = sorted(set(where) - set(msgs))
        in_stream = set(where)
        unconfirmed_in = sum(1 for k in in_stream if k in msgs and msgs[k]["state"] in ("unknown", "pending"))
        nacked_in = sum(1 for k in in_stream if k in msgs and msgs[k]["state"] == "nacked")
        deliveries = sum(len(x["deliveries"]) for c in consumers for x in c.sessions)
        windows, max_unavail, failover = self.availability()
        problems, patterns = self.log_patterns()
        return {
            "published": len(msgs), **states,
            "stream_messages": len(ref), "stream_first": ref_first, "stream_last": ref_last,
            "received": len(set(rec.deliveries)), "deliveries": deliveries, "redelivered_deliveries": 0,
            "lost": len(lost), "lost_ids": lost[:50],
            "lost_detail": [{"id": k, **{kk: (round(v, 3) if isinstance(v, float) else v)
                                         for kk, v in msgs[k].items()}} for k in lost[:20]],
            "lost_on_some_node": len(lost_on_some),
            "lost_on_node": {k: {"count": len(v), "first": v[:20]} for k, v in lost_on.items() if v},
            "lost_after_delivery": 0, "lost_after_delivery_detail": [],
            "copies": copies, "copy_problems": copy_problems[:20], "copy_problem_count": len(copy_problems),
            "offset_conflicts": len(conflicts),
            "offset_conflict_detail": [{"offset": o, "bodies": sorted(by_offset[o])} for o in conflicts[:20]],
            "duplicates": len(dups), "duplicates_confirmed": len(dup_confirmed),
            "duplicate_detail": [{"id": b, "offsets": dups[b][:10], "state": msgs.get(b, {}).get("state")}
                                 for b in list(dups)[:20]],
            "violations": len(violations), "violation_detail": violations[:20],
            "consumers": consumer_report,
            "acked_then_redelivered": 0,
            "unconfirmed_received": unconfirmed_in, "nacked_received": nacked_in,
            "phantom": len(phantom), "phantom_ids": phantom[:20],
            "max_unavailable_s": round(max_unavail, 3), "unavailable": windows,
            "failover_ms": failover,
            "replica_failures": {n.name: self.replica_failed_lines(n)[:3] for n in self.nodes
                                 if self.replica_failed_lines(n)},
            "log_warn_error_lines": {k: len(v) for k, v in problems.items()},
            "log_warn_error_top": patterns,
        }

    # -- results --------------------------------------------------------------------------

    def analyze(self) -> dict:
        rec = self.rec
        msgs = rec.msgs
        states = {"confirmed": 0, "nacked": 0, "unknown": 0, "pending": 0}
        for m in msgs.values():
            states[m["state"]] += 1
        confirmed = {k for k, m in msgs.items() if m["state"] == "confirmed"}
        received = set(rec.deliveries)
        lost = sorted(confirmed - received, key=lambda k: msgs[k]["sent"])
        # delivered, never acked by any consumer, and never delivered again: dropped by the broker
        # while a consumer held it (a requeue must bring it back)
        lost_after_delivery = sorted((k for k in confirmed & received if not rec.acks.get(k)),
                                     key=lambda k: msgs[k]["sent"])
        phantom = sorted(received - set(msgs))
        dups = {k: ds for k, ds in rec.deliveries.items() if len(ds) > 1}
        violations = []
        acked_then_redelivered = 0
        for k, ds in dups.items():
            bad = [d for d in ds[1:] if not d[3]]
            if bad:
                violations.append({"id": k, "msg": {kk: (round(v, 3) if isinstance(v, float) else v)
                                                   for kk, v in msgs.get(k, {}).items()},
                                   "deliveries": [list(d) for d in ds]})
            acks = rec.acks.get(k, [])
            if acks and any(d[0] > acks[0] for d in ds[1:]):
                acked_then_redelivered += 1
        unconfirmed_received = sum(1 for k in received if k in msgs and msgs[k]["state"] in ("unknown", "pending"))
        nacked_received = sum(1 for k in received if k in msgs and msgs[k]["state"] == "nacked")
        deliveries = sum(len(ds) for ds in rec.deliveries.values())
        redelivered = sum(1 for ds in rec.deliveries.values() for d in ds if d[3])
        windows, max_unavail, failover = self.availability()
        problems, patterns = self.log_patterns()
        return {
            "published": len(msgs), **states,
            "received": len(received), "deliveries": deliveries, "redelivered_deliveries": redelivered,
            "lost": len(lost), "lost_ids": lost[:50],
            "lost_after_delivery": len(lost_after_delivery),
            "lost_after_delivery_detail": [{"id": k, "deliveries": [list(d) for d in rec.deliveries[k]]}
                                           for k in lost_after_delivery[:20]],
            "lost_detail": [{"id": k, **{kk: (round(v, 3) if isinstance(v, float) else v)
                                         for kk, v in msgs[k].items()}} for k in lost[:20]],
            "duplicates": len(dups), "violations": len(violations), "violation_detail": violations[:20],
            "acked_then_redelivered": acked_then_redelivered,
            "unconfirmed_received": unconfirmed_received, "nacked_received": nacked_received,
            "phantom": len(phantom), "phantom_ids": phantom[:20],
            "max_unavailable_s": round(max_unavail, 3), "unavailable": windows,
            "failover_ms": failover,
            "replica_failures": {n.name: self.replica_failed_lines(n)[:3] for n in self.nodes
                                 if self.replica_failed_lines(n)},
            "log_warn_error_lines": {k: len(v) for k, v in problems.items()},
            "log_warn_error_top": patterns,
        }

    def availability(self) -> tuple[list[dict], float, list]:
        """Unavailability windows, the longest, and the failover time of each leader kill (each
        fault gets its next_confirm_ms)."""
        msgs = self.rec.msgs
        # unavailability: gaps without a confirm while publishers were publishing
        cts = sorted(t for t in self.rec.confirm_times if t <= self.pub_end)
        points = [0.0] + cts + [self.pub_end]
        windows = []
        for a, b in zip(points, points[1:]):
            if b - a > 1.0:
                during = [f"{f['kind']}@{f.get('at')}" for f in self.faults
                          if f.get("at") is not None and f["at"] <= b and f.get("end", b) >= a - 1.0]
                windows.append({"from": round(a, 3), "to": round(b, 3), "s": round(b - a, 3),
                                "faults": during})
        max_unavail = max((w["s"] for w in windows), default=0.0)

        # recovery after each fault: first confirm of a message published after it began
        confirmed_after = sorted((m["sent"], m["done"]) for m in msgs.values() if m["state"] == "confirmed")
        failover = []
        for f in self.faults:
            if f.get("at") is None:
                continue
            nxt = min((d for s, d in confirmed_after if s >= f["at"]), default=None)
            f["next_confirm_ms"] = None if nxt is None else round((nxt - f["at"]) * 1000)
            if f["kind"] in ("kill-leader",) or (f["kind"] == "torn" and f.get("role") == "leader"):
                failover.append(f["next_confirm_ms"])
        return windows, max_unavail, failover

    def log_patterns(self) -> tuple[dict, dict]:
        """Each node's WARN/ERROR lines, and their commonest patterns (numbers masked)."""
        problems = {n.name: n.log_problems() for n in self.nodes}
        patterns = {}
        for name, lines in problems.items():
            seen: dict[str, int] = {}
            for ln in lines:
                msg = re.sub(r"^\S+\s+", "", ln, count=1)        # the timestamp
                msg = re.sub(r"\d{3,}", "N", msg)[:220]          # ports, ids, sizes
                seen[msg] = seen.get(msg, 0) + 1
            patterns[name] = sorted(([c, m] for m, c in seen.items()), reverse=True)[:8]
        return problems, patterns


def human_summary(r: dict) -> str:
    c = r.get("counts", {})
    lines = [f"seed {r['seed']}: {'OK' if r['ok'] else 'FAIL'} ({r.get('wall_s')} s wall; dir {r.get('dir')})"]
    if r.get("error"):
        lines.append(f"  harness error: {r['error']}")
    for why in r.get("failures") or []:
        lines.append(f"  FAILURE: {why}")
    for f in r.get("faults", []):
        extra = ""
        if f.get("torn"):
            extra += f" torn {f['torn']}"
        if f.get("kind") == "partition":
            extra += f" isolation seen after {f.get('isolation_seen_s')}s, {f.get('aborted_links')} links aborted"
        if f.get("skipped"):
            extra += f" SKIPPED ({f['skipped']})"
        if f.get("replica_failed"):
            extra += f" REPLICA DID NOT OPEN: {f['replica_failed']}"
        if f.get("restart_failed"):
            extra += f" DID NOT COME BACK: {f['restart_failed']}"
        lines.append(f"  t={f.get('at', f.get('planned_at'))}: {f['kind']} {f.get('node', '')} "
                     f"({f.get('role', '')}) {f['dur']}s -> ready t={f.get('ready')}, next confirm "
                     f"{f.get('next_confirm_ms')} ms{extra}")
    if c and r.get("workload") == "stream":
        lines.append(f"  published {c['published']}: confirmed {c['confirmed']}, nacked {c['nacked']}, "
                     f"unknown {c['unknown'] + c['pending']}; the stream holds {c['stream_messages']} "
                     f"(offsets {c['stream_first']}..{c['stream_last']}); consumers got {c['deliveries']} "
                     f"deliveries")
        lines.append(f"  LOST {c['lost']} (missing from some node's copy: {c['lost_on_some_node']}); "
                     f"copies {c['copies']}; offsets given to two bodies {c['offset_conflicts']}")
        lines.append(f"  consumer violations {c['violations']} (order, skipped offsets, start); "
                     f"duplicates {c['duplicates']} (of confirmed publishes {c['duplicates_confirmed']}); "
                     f"unconfirmed in the stream {c['unconfirmed_received']}, nacked in it "
                     f"{c['nacked_received']}, phantom {c['phantom']}")
        for x in c["consumers"]:
            lines.append(f"  consumer {x['consumer']}: {x['sessions']} sessions, {x['deliveries']} deliveries, "
                         f"offsets {x['first']}..{x['last']}, skipped {x['skipped']}, messages missed "
                         f"{x.get('bodies_missed')}, deliveries unlike the reference copy {x.get('mismatched')}")
        lines.append(f"  max unavailable {c['max_unavailable_s']} s; windows "
                     f"{[(w['from'], w['s']) for w in c['unavailable']]}; failover ms {c['failover_ms']}")
        lines.append(f"  final read: {r.get('drain')}; node log WARN/ERROR lines: {c['log_warn_error_lines']}")
        if c["lost"]:
            lines.append(f"  lost ids (first): {c['lost_ids'][:10]}")
        for v in c["violation_detail"][:5]:
            lines.append(f"  violation: {v}")
        for d in c["duplicate_detail"][:5]:
            lines.append(f"  duplicate: {d}")
    elif c:
        lines.append(f"  published {c['published']}: confirmed {c['confirmed']}, nacked {c['nacked']}, "
                     f"unknown {c['unknown'] + c['pending']}; received {c['received']} "
                     f"({c['deliveries']} deliveries, {c['redelivered_deliveries']} redelivered)")
        lines.append(f"  LOST {c['lost']} (and {c['lost_after_delivery']} delivered but never acked nor "
                     f"redelivered); duplicates {c['duplicates']} (violations of the redelivered flag "
                     f"{c['violations']}, acked-then-redelivered {c['acked_then_redelivered']}); "
                     f"unconfirmed-received {c['unconfirmed_received']}, nacked-received "
                     f"{c['nacked_received']}, phantom {c['phantom']}")
        lines.append(f"  max unavailable {c['max_unavailable_s']} s; windows "
                     f"{[(w['from'], w['s']) for w in c['unavailable']]}; failover ms {c['failover_ms']}")
        lines.append(f"  drain: {r.get('drain')}; node log WARN/ERROR lines: {c['log_warn_error_lines']}")
        if c["lost"]:
            lines.append(f"  lost ids (first): {c['lost_ids'][:10]}")
        for v in c["violation_detail"][:5]:
            lines.append(f"  violation: {v}")
    return "\n".join(lines)


async def main_async(args) -> int:
    run = Run(args)
    result: dict = {"seed": args.seed, **({"workload": "stream"} if args.workload == "stream" else {}),
                    "short": bool(args.short), "duration": args.duration,
                    "torn": f"{args.torn_mode}/{args.torn_files}",
                    "batch": args.batch, "started": datetime.datetime.now().isoformat(timespec="seconds"),
                    "dir": str(run.dir), "kinds": args.kinds, "machine": bool(args.machine)}
    wall0 = time.monotonic()
    code = 0
    try:
        return await run_and_report(run, args, result, wall0)
    except asyncio.CancelledError:
        print(f"interrupted; nodes stopped; run dir kept: {run.dir}", file=sys.stderr, flush=True)
        raise


async def run_and_report(run: "Run", args, result: dict, wall0: float) -> int:
    code = 0
    try:
        try:
            await run.start_cluster()
            result["setup"] = run.setup
            await run.workload()
            await run.heal_and_restart()
            if run.stream:
                await run.read_stream_everywhere()
                counts = run.analyze_stream(run.consumers)
            else:
                await run.drain_queue()
                counts = run.analyze()
            result["counts"] = counts
            failures = []
            if counts["lost"]:
                failures.append(f"{counts['lost']} confirmed messages lost")
            if run.stream:
                if counts["lost_on_some_node"] > counts["lost"]:
                    failures.append(f"{counts['lost_on_some_node']} confirmed messages missing from some "
                                    f"node's copy: {({k: v['count'] for k, v in counts['lost_on_node'].items()})}")
                if counts["offset_conflicts"]:
                    failures.append(f"{counts['offset_conflicts']} offsets given to two different bodies")
                for cp in counts["copy_problems"]:
                    failures.append(f"{cp['node']}'s copy: {cp['problem']} ({json.dumps(cp, default=str)[:300]})")
                for v in counts["violation_detail"]:
                    failures.append(f"consumer {v['consumer']}: {v['problem']} "
                                    f"({json.dumps(v, default=str)[:300]})")
                if counts["violations"] > len(counts["violation_detail"]):
                    failures.append(f"... {counts['violations']} consumer violations in all")
            if counts["lost_after_delivery"]:
                failures.append(f"{counts['lost_after_delivery']} confirmed messages delivered, never acked "
                                f"and never delivered again")
            if counts["violations"] and not run.stream:
                failures.append(f"{counts['violations']} redeliveries not flagged redelivered")
            # Nothing deletes the queue during a run: a server basic.cancel is a failover's.
            cancels = sum(c["server_cancels"] for c in getattr(run, "clients", {}).get("consumers", []))
            counts["server_cancels"] = cancels
            if args.machine and cancels:
                failures.append(f"{cancels} consumers cancelled by the server (a failover must not, "
                                f"on the replicated machine)")
            if run.stream and not run.drain.get("complete"):
                failures.append("the stream was not read on every node" + (
                    f" ({run.drain['skipped']})" if run.drain.get("skipped") else
                    f": {run.drain.get('errors')}"))
            elif not run.drain.get("complete"):
                failures.append("the queue was not drained" + (f" ({run.drain['skipped']}): the lost count "
                                                               f"includes what it still holds"
                                                               if run.drain.get("skipped") else ""))
            for name, lines in counts["replica_failures"].items():
                failures.append(f"{name}'s replica of the queue did not open: {lines[0][-260:]}")
            for name, why in run.broken.items():
                failures.append(f"{name} did not come back ({why})")
            result["failures"] = failures
            code = 1 if failures else 0
        except HarnessError as e:
            result["error"] = str(e)
            code = 2
        except Exception as e:  # noqa: BLE001
            result["error"] = "".join(traceback.format_exception(e))
            code = 2
        result["schedule"] = getattr(run, "schedule", None)
        result["faults"] = run.faults
        result["drain"] = run.drain
        result["broken_nodes"] = run.broken
        result["binary"] = run.bin_info
        if run.net is not None:
            result["proxy"] = {"accepted": run.net.accepted, "refused": run.net.refused}
        result["clients"] = getattr(run, "clients", None)
        result["events"] = run.rec.events[-200:] if code else []
    finally:
        result["wall_s"] = round(time.monotonic() - wall0, 1)
        # every node down, whatever happened
        if run.net is not None:
            try:
                await asyncio.wait_for(run.net.close(), 5)
            except BaseException:  # noqa: BLE001 - cleanup goes on
                pass
        for n in run.nodes:
            n.stop_now(5.0)
    result["ok"] = code == 0
    result["exit"] = code
    text = human_summary(result)
    print(text, flush=True)
    if code != 0:
        print("\n--- node logs (tail) ---", flush=True)
        for n in run.nodes:
            print(f"--- {n.name} ({n.log_path}; without openraft's lines) ---\n{n.log_tail(quiet=True)}",
                  flush=True)
            probs = n.log_problems()
            if probs:
                print(f"--- {n.name}: WARN/ERROR lines ({len(probs)}, last 30) ---\n" + "\n".join(probs[-30:]),
                      flush=True)
    line = json.dumps(result, default=str)
    if args.results:
        with open(args.results, "a") as f:
            f.write(line + "\n")
    if args.json:
        print(line, flush=True)
    (run.dir / "result.json").write_text(line + "\n")
    run.checker_log.close()
    if code == 0 and not args.keep:
        shutil.rmtree(run.dir, ignore_errors=True)
    else:
        print(f"run dir kept: {run.dir}", flush=True)
    return code


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--workload", choices=("quorum", "stream"), default="quorum",
                   help="a quorum queue (default), or a replicated stream (x-queue-type=stream): "
                        "stream consumers resuming at their stored offsets, every node's copy "
                        "read and compared at the end")
    p.add_argument("--duration", type=float, default=30.0, help="seconds of workload and faults")
    p.add_argument("--short", action="store_true",
                   help=f"test-suite mode: seed {SHORT_SEED}, 15 s, a leader kill and a pause, no final restart")
    p.add_argument("--faults", default=",".join(FAULT_KINDS),
                   help=f"comma-separated kinds among {','.join(ALL_KINDS)}")
    p.add_argument("--publishers", type=int, default=2)
    p.add_argument("--consumers", type=int, default=2)
    p.add_argument("--rate", type=float, default=100.0, help="publishes per second per publisher")
    p.add_argument("--window", type=int, default=300, help="unconfirmed publishes per publisher at most")
    p.add_argument("--confirm-timeout", type=float, default=6.0,
                   help="a publisher drops its connection when a confirm is this late")
    p.add_argument("--nack-switch", type=float, default=3.0,
                   help="a publisher that got only nacks for this long moves to another node")
    p.add_argument("--final-confirm-wait", type=float, default=8.0)
    p.add_argument("--prefetch", type=int, default=50)
    p.add_argument("--ack-delay", type=float, default=0.02, help="consumers ack after up to this (s)")
    p.add_argument("--final-restart", choices=("kill", "term", "none"), default="kill",
                   help="after the heal, every node is kill -9'd (or SIGTERMed) and restarted")
    p.add_argument("--torn-files", choices=("logs", "all"), default="logs",
                   help="torn: pick among the Raft logs' newest segments, or among every file under quorum/ "
                        "and raft/")
    p.add_argument("--torn-mode", choices=("truncate", "append"), default="truncate",
                   help="torn: cut 1-64 bytes off the file's end (the last, fsynced record is damaged), "
                        "or append 1-64 random bytes (a partial record that was never acknowledged)")
    p.add_argument("--drain-timeout", type=float, default=60.0,
                   help="the drain (stream: reading every node's copy until they agree) gives up after this")
    p.add_argument("--results", help="append the run's JSON line to this file")
    p.add_argument("--batch", default=None, help="a label stored in the JSON line (run.sh's)")
    p.add_argument("--json", action="store_true", help="print the JSON line too")
    p.add_argument("--keep", action="store_true", help="keep the run dir even when the run passes")
    p.add_argument("--tmp-root", default=None)
    p.add_argument("--bin", default=DEFAULT_BIN)
    p.add_argument("--machine", action="store_true",
                   help="quorum queues on the replicated queue machine (quorum_queues_on_machine): "
                        "a consumer cancelled by the server fails the run")
    p.add_argument("-v", "--verbose", action="store_true")
    args = p.parse_args(argv)
    if args.short:
        args.seed = SHORT_SEED
        args.duration = 15.0
        args.final_restart = "none"
    args.kinds = [k.strip() for k in args.faults.split(",") if k.strip()]
    bad = [k for k in args.kinds if k not in ALL_KINDS]
    if bad or not args.kinds:
        p.error(f"unknown fault kinds {bad}; known: {ALL_KINDS}")
    if not os.access(args.bin, os.X_OK):
        p.error(f"no warren binary at {args.bin} (WARREN_BIN or --bin)")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    def on_loop_error(lp, ctx):
        # pika callbacks raising after their connection went away: noise, not the checker's
        exc = ctx.get("exception")
        if exc is not None and any("pika" in (fr.filename or "")
                                   for fr in traceback.extract_tb(exc.__traceback__)):
            return
        lp.default_exception_handler(ctx)
    loop.set_exception_handler(on_loop_error)
    task = loop.create_task(main_async(args))
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        loop.add_signal_handler(sig, task.cancel)
    try:
        return loop.run_until_complete(task)
    except asyncio.CancelledError:
        print("interrupted", file=sys.stderr)
        return 130
    finally:
        loop.close()


if __name__ == "__main__":
    sys.exit(main())
