#!/usr/bin/env python3
"""Many mostly idle connections: open N AMQP connections, each with a channel, an exclusive
server-named queue and a consumer on it, hold them, and report the broker's RSS growth per
connection. Loopback only; stops by itself.

    bench/idle_connections.py --url amqp://127.0.0.1:5672 --pid PID [--n 10000] [--hold 10]
                              [--sources 4]

One source address has about 28k ephemeral ports towards one broker port: `--sources K` spreads
the connections over the loopback source addresses 127.0.0.1 .. 127.0.0.K (for 100,000, K = 4 or
more). Raises its own open-files limit to the hard limit; the broker needs one above N too.

Speaks the handshake with raw frames (tests/interop/python/rawamqp.py) over asyncio, so one
process holds 10,000 sockets cheaply. Needs `ulimit -n` above N for this process and the broker.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import resource
import struct
import sys
import time
from urllib.parse import urlparse

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests", "interop", "python"))
import rawamqp as r  # noqa: E402

BASIC_CONSUME = (60, 20)
BASIC_CONSUME_OK = (60, 21)


def rss_kb(pid: int) -> int:
    """The broker's RSS in KiB; 0 once it is gone."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except FileNotFoundError:
        pass
    return 0


async def read_method(reader: asyncio.StreamReader) -> tuple[int, int]:
    """Reads frames until a method frame; returns its (class, method)."""
    while True:
        head = await reader.readexactly(7)
        ftype, _ch, size = struct.unpack(">BHI", head)
        payload = await reader.readexactly(size + 1)
        if ftype == r.FRAME_METHOD:
            return struct.unpack(">HH", payload[:4])


async def expect(reader: asyncio.StreamReader, want: tuple[int, int]) -> None:
    got = await read_method(reader)
    if got != want:
        raise RuntimeError(f"expected {want}, got {got}")


def basic_consume(channel: int, queue: str) -> bytes:
    return r.method_frame(channel, BASIC_CONSUME,
                          struct.pack(">H", 0) + r.shortstr(queue) + r.shortstr("")
                          + r.bits(False, True, False, False) + r.table(None))


async def open_one(host: str, port: int, user: str, password: str, held: list,
                   source: str | None = None) -> None:
    local = (source, 0) if source else None
    reader, writer = await asyncio.open_connection(host, port, local_addr=local)
    writer.write(r.PROTOCOL_HEADER)
    await expect(reader, r.CONNECTION_START)
    writer.write(r.start_ok_plain(user, password))
    await expect(reader, r.CONNECTION_TUNE)
    writer.write(r.tune_ok(2047, 131072, 0) + r.connection_open("/"))
    await expect(reader, r.CONNECTION_OPEN_OK)
    writer.write(r.channel_open(1))
    await expect(reader, r.CHANNEL_OPEN_OK)
    writer.write(r.queue_declare(1, "", exclusive=True))
    head = await reader.readexactly(7)
    _t, _c, size = struct.unpack(">BHI", head)
    payload = await reader.readexactly(size + 1)
    qlen = payload[4]
    queue = payload[5:5 + qlen].decode()
    writer.write(basic_consume(1, queue))
    await expect(reader, BASIC_CONSUME_OK)
    held.append((reader, writer))


async def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--url", default="amqp://guest:guest@127.0.0.1:5672/")
    ap.add_argument("--pid", type=int, required=True, help="broker pid, for its RSS")
    ap.add_argument("--n", type=int, default=10_000)
    ap.add_argument("--hold", type=float, default=10.0, help="seconds to hold them open")
    ap.add_argument("--parallel", type=int, default=100)
    ap.add_argument("--sources", type=int, default=1,
                    help="spread over loopback source addresses 127.0.0.1..127.0.0.K")
    a = ap.parse_args()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    if hard < a.n + 100:
        print(f"open-files hard limit {hard} is below --n {a.n}: raise it (ulimit -Hn)",
              file=sys.stderr)
        return 2
    u = urlparse(a.url)
    host, port = u.hostname or "127.0.0.1", u.port or 5672
    user, password = u.username or "guest", u.password or "guest"
    base = rss_kb(a.pid)
    held: list = []
    sem = asyncio.Semaphore(a.parallel)
    failures = 0

    async def guarded(i: int) -> None:
        nonlocal failures
        source = f"127.0.0.{1 + i % a.sources}" if a.sources > 1 else None
        async with sem:
            try:
                await asyncio.wait_for(open_one(host, port, user, password, held, source), 60)
            except Exception as e:  # noqa: BLE001 - counted and reported
                failures += 1
                if failures <= 3:
                    print(f"connection failed: {e!r}", file=sys.stderr)

    t0 = time.monotonic()
    await asyncio.gather(*(guarded(i) for i in range(a.n)))
    opened = time.monotonic() - t0
    await asyncio.sleep(a.hold)
    after = rss_kb(a.pid)
    n = len(held)
    if after == 0:
        print(f"the broker (pid {a.pid}) died: {n} connections had been opened, {failures} failed")
        return 1
    per = (after - base) * 1024 / n if n else 0
    print(f"connections={n} failed={failures} open_s={opened:.1f} rss_before_kb={base} "
          f"rss_after_kb={after} bytes_per_connection={per:.0f}")
    for _, w in held:
        w.close()
    return 0 if failures == 0 else 1


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
