"""Tiny AMQP 0-9-1 frame encoder/decoder over a plain socket, for the raw-frame tests.

Only what the tests need: field tables, the handshake, a few methods, and parsing of
whatever the server sends back (method frames are decoded into (class_id, method_id, args)
for the methods we care about; anything else is kept as raw bytes).
"""

from __future__ import annotations

import socket
import struct
import time
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any
from urllib.parse import urlparse

PROTOCOL_HEADER = b"AMQP\x00\x00\x09\x01"
FRAME_END = 0xCE

FRAME_METHOD = 1
FRAME_HEADER = 2
FRAME_BODY = 3
FRAME_HEARTBEAT = 8

# (class_id, method_id)
CONNECTION_START = (10, 10)
CONNECTION_START_OK = (10, 11)
CONNECTION_SECURE = (10, 20)
CONNECTION_TUNE = (10, 30)
CONNECTION_TUNE_OK = (10, 31)
CONNECTION_OPEN = (10, 40)
CONNECTION_OPEN_OK = (10, 41)
CONNECTION_CLOSE = (10, 50)
CONNECTION_CLOSE_OK = (10, 51)
CHANNEL_OPEN = (20, 10)
CHANNEL_OPEN_OK = (20, 11)
CHANNEL_CLOSE = (20, 40)
CHANNEL_CLOSE_OK = (20, 41)
EXCHANGE_DECLARE = (40, 10)
QUEUE_DECLARE = (50, 10)
QUEUE_DECLARE_OK = (50, 11)
BASIC_QOS = (60, 10)
BASIC_PUBLISH = (60, 40)
BASIC_GET = (60, 70)
BASIC_GET_OK = (60, 71)
BASIC_GET_EMPTY = (60, 72)


# ---------------------------------------------------------------- encoding


def shortstr(s: str | bytes) -> bytes:
    b = s.encode() if isinstance(s, str) else s
    assert len(b) < 256
    return bytes([len(b)]) + b


def longstr(s: str | bytes) -> bytes:
    b = s.encode() if isinstance(s, str) else s
    return struct.pack(">I", len(b)) + b


def field_value(v: Any) -> bytes:
    if isinstance(v, bool):
        return b"t" + (b"\x01" if v else b"\x00")
    if isinstance(v, int):
        if -(2**31) <= v < 2**31:
            return b"I" + struct.pack(">i", v)
        return b"l" + struct.pack(">q", v)
    if isinstance(v, float):
        return b"d" + struct.pack(">d", v)
    if isinstance(v, (str, bytes)):
        return b"S" + longstr(v)
    if isinstance(v, dict):
        return b"F" + table(v)
    if isinstance(v, (list, tuple)):
        body = b"".join(field_value(x) for x in v)
        return b"A" + struct.pack(">I", len(body)) + body
    if v is None:
        return b"V"
    raise TypeError(f"cannot encode {v!r}")


def table(d: dict[str, Any] | None) -> bytes:
    body = b"".join(shortstr(k) + field_value(v) for k, v in (d or {}).items())
    return struct.pack(">I", len(body)) + body


def frame(ftype: int, channel: int, payload: bytes, end: int = FRAME_END) -> bytes:
    return struct.pack(">BHI", ftype, channel, len(payload)) + payload + bytes([end])


def method_frame(channel: int, cm: tuple[int, int], args: bytes = b"") -> bytes:
    return frame(FRAME_METHOD, channel, struct.pack(">HH", *cm) + args)


def header_frame(channel: int, body_size: int, class_id: int = 60, flags: int = 0,
                 props: bytes = b"") -> bytes:
    return frame(FRAME_HEADER, channel,
                 struct.pack(">HHQH", class_id, 0, body_size, flags) + props)


def body_frame(channel: int, body: bytes) -> bytes:
    return frame(FRAME_BODY, channel, body)


def bits(*flags: bool) -> bytes:
    v = 0
    for i, f in enumerate(flags):
        if f:
            v |= 1 << i
    return bytes([v])


def start_ok_plain(user: str = "guest", password: str = "guest",
                   mechanism: str = "PLAIN", response: bytes | None = None,
                   client_properties: dict | None = None) -> bytes:
    if response is None:
        response = b"\x00" + user.encode() + b"\x00" + password.encode()
    props = client_properties if client_properties is not None else {
        "product": "warren-interop-raw",
        "capabilities": {"authentication_failure_close": True},
    }
    return method_frame(0, CONNECTION_START_OK,
                        table(props) + shortstr(mechanism) + longstr(response) + shortstr("en_US"))


def amqplain_response(user: str, password: str) -> bytes:
    # AMQPLAIN: a field table *without* its 4-byte length prefix.
    return table({"LOGIN": user, "PASSWORD": password})[4:]


def tune_ok(channel_max: int, frame_max: int, heartbeat: int) -> bytes:
    return method_frame(0, CONNECTION_TUNE_OK, struct.pack(">HIH", channel_max, frame_max, heartbeat))


def connection_open(vhost: str = "/") -> bytes:
    return method_frame(0, CONNECTION_OPEN, shortstr(vhost) + shortstr("") + bits(False))


def connection_close(code: int = 200, text: str = "bye") -> bytes:
    return method_frame(0, CONNECTION_CLOSE, struct.pack(">H", code) + shortstr(text) + struct.pack(">HH", 0, 0))


def connection_close_ok() -> bytes:
    return method_frame(0, CONNECTION_CLOSE_OK)


def channel_open(channel: int) -> bytes:
    return method_frame(channel, CHANNEL_OPEN, shortstr(""))


def channel_close_ok(channel: int) -> bytes:
    return method_frame(channel, CHANNEL_CLOSE_OK)


def queue_declare(channel: int, name: str, passive=False, durable=False, exclusive=False,
                  auto_delete=False, nowait=False, arguments: dict | None = None) -> bytes:
    return method_frame(channel, QUEUE_DECLARE,
                        struct.pack(">H", 0) + shortstr(name)
                        + bits(passive, durable, exclusive, auto_delete, nowait) + table(arguments))


def basic_publish(channel: int, exchange: str, routing_key: str, mandatory=False, immediate=False) -> bytes:
    return method_frame(channel, BASIC_PUBLISH,
                        struct.pack(">H", 0) + shortstr(exchange) + shortstr(routing_key)
                        + bits(mandatory, immediate))


def basic_get(channel: int, queue: str, no_ack=True) -> bytes:
    return method_frame(channel, BASIC_GET, struct.pack(">H", 0) + shortstr(queue) + bits(no_ack))


# ---------------------------------------------------------------- decoding


class Reader:
    def __init__(self, data: bytes):
        self.data = data
        self.pos = 0

    def take(self, n: int) -> bytes:
        if self.pos + n > len(self.data):
            raise ValueError("short read")
        b = self.data[self.pos:self.pos + n]
        self.pos += n
        return b

    def unpack(self, fmt: str):
        size = struct.calcsize(fmt)
        return struct.unpack(fmt, self.take(size))

    def octet(self) -> int:
        return self.unpack(">B")[0]

    def short(self) -> int:
        return self.unpack(">H")[0]

    def long(self) -> int:
        return self.unpack(">I")[0]

    def longlong(self) -> int:
        return self.unpack(">Q")[0]

    def shortstr(self) -> str:
        return self.take(self.octet()).decode("utf-8", "replace")

    def longstr(self) -> bytes:
        return self.take(self.long())

    def table(self) -> dict[str, Any]:
        sub = Reader(self.longstr())
        out = {}
        while sub.pos < len(sub.data):
            k = sub.shortstr()
            out[k] = sub.value()
        return out

    def value(self) -> Any:
        t = self.take(1)
        if t == b"t":
            return self.octet() != 0
        if t == b"b":
            return self.unpack(">b")[0]
        if t == b"B":
            return self.octet()
        if t == b"s":
            return self.unpack(">h")[0]
        if t == b"u":
            return self.short()
        if t == b"I":
            return self.unpack(">i")[0]
        if t == b"i":
            return self.long()
        if t == b"l":
            return self.unpack(">q")[0]
        if t == b"f":
            return self.unpack(">f")[0]
        if t == b"d":
            return self.unpack(">d")[0]
        if t == b"D":
            scale = self.octet()
            return Decimal(self.unpack(">i")[0]).scaleb(-scale)
        if t == b"S":
            return self.longstr().decode("utf-8", "replace")
        if t == b"x":
            return self.longstr()
        if t == b"A":
            sub = Reader(self.longstr())
            arr = []
            while sub.pos < len(sub.data):
                arr.append(sub.value())
            return arr
        if t == b"T":
            return self.longlong()
        if t == b"F":
            return self.table()
        if t == b"V":
            return None
        raise ValueError(f"unknown field type {t!r}")


@dataclass
class Frame:
    type: int
    channel: int
    payload: bytes
    method: tuple[int, int] | None = None
    args: dict[str, Any] = field(default_factory=dict)

    def __repr__(self) -> str:
        if self.method:
            return f"Frame(method={self.method}, ch={self.channel}, args={self.args})"
        return f"Frame(type={self.type}, ch={self.channel}, payload={self.payload[:40]!r})"


def decode_method(f: Frame) -> None:
    r = Reader(f.payload)
    f.method = (r.short(), r.short())
    a = f.args
    if f.method == CONNECTION_START:
        a["version_major"] = r.octet()
        a["version_minor"] = r.octet()
        a["server_properties"] = r.table()
        a["mechanisms"] = r.longstr().decode()
        a["locales"] = r.longstr().decode()
    elif f.method == CONNECTION_TUNE:
        a["channel_max"], a["frame_max"], a["heartbeat"] = r.unpack(">HIH")
    elif f.method in (CONNECTION_CLOSE, CHANNEL_CLOSE):
        a["reply_code"] = r.short()
        a["reply_text"] = r.shortstr()
        a["class_id"] = r.short()
        a["method_id"] = r.short()
    elif f.method == QUEUE_DECLARE_OK:
        a["queue"] = r.shortstr()
        a["message_count"] = r.long()
        a["consumer_count"] = r.long()
    elif f.method == BASIC_GET_OK:
        a["delivery_tag"] = r.longlong()
        a["redelivered"] = r.octet() != 0
        a["exchange"] = r.shortstr()
        a["routing_key"] = r.shortstr()
        a["message_count"] = r.long()


class ConnectionLost(Exception):
    pass


class RawConnection:
    """A blocking socket speaking raw AMQP frames."""

    def __init__(self, host: str, port: int, timeout: float = 10.0):
        self.sock = socket.create_connection((host, port), timeout=timeout)
        self.sock.settimeout(timeout)
        self.buf = b""
        self.server_properties: dict[str, Any] = {}
        self.mechanisms = ""
        self.tune: dict[str, int] = {}

    @classmethod
    def from_url(cls, url: str, timeout: float = 10.0) -> "RawConnection":
        u = urlparse(url)
        return cls(u.hostname or "127.0.0.1", u.port or 5672, timeout)

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def _fill(self, n: int, deadline: float) -> None:
        while len(self.buf) < n:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(f"timed out waiting for {n} bytes, have {self.buf!r}")
            self.sock.settimeout(remaining)
            try:
                chunk = self.sock.recv(65536)
            except ConnectionResetError as e:
                raise ConnectionLost(str(e)) from e
            except socket.timeout as e:
                raise TimeoutError(f"timed out waiting for {n} bytes") from e
            if not chunk:
                raise ConnectionLost(f"EOF with {len(self.buf)} buffered bytes")
            self.buf += chunk

    def recv_raw(self, n: int, timeout: float = 10.0) -> bytes:
        self._fill(n, time.monotonic() + timeout)
        out, self.buf = self.buf[:n], self.buf[n:]
        return out

    def recv_frame(self, timeout: float = 10.0, skip_heartbeats: bool = True) -> Frame:
        deadline = time.monotonic() + timeout
        while True:
            self._fill(7, deadline)
            ftype, channel, size = struct.unpack(">BHI", self.buf[:7])
            self._fill(7 + size + 1, deadline)
            payload = self.buf[7:7 + size]
            end = self.buf[7 + size]
            self.buf = self.buf[7 + size + 1:]
            if end != FRAME_END:
                raise ValueError(f"bad frame end from server: {end:#x}")
            f = Frame(ftype, channel, payload)
            if ftype == FRAME_METHOD:
                decode_method(f)
            if ftype == FRAME_HEARTBEAT and skip_heartbeats:
                continue
            return f

    def expect(self, cm: tuple[int, int], timeout: float = 10.0) -> Frame:
        f = self.recv_frame(timeout)
        assert f.method == cm, f"expected method {cm}, got {f!r}"
        return f

    def wait_closed(self, timeout: float = 10.0) -> bool:
        """Read (and discard) until the peer closes the socket; True if it did within timeout."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.sock.settimeout(max(0.01, deadline - time.monotonic()))
            try:
                chunk = self.sock.recv(65536)
            except socket.timeout:
                return False
            except (ConnectionResetError, BrokenPipeError):
                return True
            if not chunk:
                return True
        return False

    # -- handshake --------------------------------------------------------

    def start(self) -> Frame:
        self.send(PROTOCOL_HEADER)
        f = self.expect(CONNECTION_START)
        self.server_properties = f.args["server_properties"]
        self.mechanisms = f.args["mechanisms"]
        return f

    def handshake(self, user="guest", password="guest", vhost="/", heartbeat=0,
                  frame_max: int | None = None, channel_max: int | None = None,
                  mechanism="PLAIN") -> None:
        self.start()
        if mechanism == "AMQPLAIN":
            self.send(start_ok_plain(mechanism="AMQPLAIN", response=amqplain_response(user, password)))
        else:
            self.send(start_ok_plain(user, password))
        t = self.expect(CONNECTION_TUNE)
        self.tune = dict(t.args)
        cm = t.args["channel_max"] if channel_max is None else channel_max
        fm = t.args["frame_max"] if frame_max is None else frame_max
        self.tune.update(channel_max=cm, frame_max=fm, heartbeat=heartbeat)
        self.send(tune_ok(cm, fm, heartbeat))
        self.send(connection_open(vhost))
        self.expect(CONNECTION_OPEN_OK)

    def open_channel(self, channel: int = 1) -> None:
        self.send(channel_open(channel))
        self.expect(CHANNEL_OPEN_OK)

    def expect_connection_close(self, timeout: float = 10.0) -> Frame:
        """Wait for connection.close (skipping other frames), answer close-ok, return it."""
        deadline = time.monotonic() + timeout
        while True:
            f = self.recv_frame(max(0.01, deadline - time.monotonic()))
            if f.method == CONNECTION_CLOSE:
                try:
                    self.send(connection_close_ok())
                except OSError:
                    pass
                return f
