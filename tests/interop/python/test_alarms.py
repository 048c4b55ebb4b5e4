"""Resource alarms against the real binary: a disk alarm blocks publishing connections
(connection.blocked, then no reads), consumers keep working, and clearing it (SIGHUP re-reads the
config file's thresholds) sends connection.unblocked and lets the held publishes in.
Warren only: it needs the broker's config file and signals."""

from __future__ import annotations

import os
import signal
import time

import pika
import pytest

from test_durability import Node

BIN = os.environ.get("WARREN_BIN")
pytestmark = pytest.mark.skipif(not BIN, reason="drives the broker's config and signals: Warren only (WARREN_BIN)")


def test_disk_alarm_blocks_publishers_not_consumers():
    n = Node()
    cfg = os.path.join(n.dir, "warren.toml")
    with open(cfg, "w") as f:
        f.write("[limits]\ndisk_free_limit_bytes = 1000000000000000000\n")  # always "low on disk"
    n.extra_args = ["--config", cfg]
    try:
        n.start()
        c = pika.BlockingConnection(pika.URLParameters(n.url))
        cch = c.channel()
        cch.queue_declare("alarm-q")
        p = pika.BlockingConnection(pika.URLParameters(n.url))
        events: list[str] = []
        p.add_on_connection_blocked_callback(lambda _c, m: events.append("blocked:" + m.method.reason))
        p.add_on_connection_unblocked_callback(lambda _c, m: events.append("unblocked"))
        pch = p.channel()
        pch.basic_publish("", "alarm-q", b"first")
        deadline = time.monotonic() + 10
        while not events and time.monotonic() < deadline:
            p.process_data_events(time_limit=0.05)
        assert events == ["blocked:low on disk space"]
        pch.basic_publish("", "alarm-q", b"held")  # sits in TCP buffers: the broker is not reading
        # Nothing the blocked publisher sent gets in; the consumer side keeps working.
        time.sleep(0.5)
        cch.queue_declare("alarm-other")
        assert cch.basic_get("alarm-other", auto_ack=True)[0] is None
        # "first" may have been read before the block took effect; "held" (sent after the
        # connection.blocked) must not have been.
        assert cch.queue_declare("alarm-q", passive=True).method.message_count <= 1
        assert "disk alarm set" in n.stderr()

        with open(cfg, "w") as f:
            f.write("[limits]\ndisk_free_limit_bytes = 1\n")
        n.proc.send_signal(signal.SIGHUP)
        deadline = time.monotonic() + 10
        while "unblocked" not in events and time.monotonic() < deadline:
            p.process_data_events(time_limit=0.05)
        assert events[-1] == "unblocked"
        deadline = time.monotonic() + 10
        while cch.queue_declare("alarm-q", passive=True).method.message_count < 2:
            assert time.monotonic() < deadline, "held publishes never arrived"
            c.sleep(0.05)
        assert [cch.basic_get("alarm-q", auto_ack=True)[2] for _ in range(2)] == [b"first", b"held"]
        assert "disk alarm cleared" in n.stderr()
        p.close()
        c.close()
    finally:
        n.cleanup()
