"""A hostile tenant's worker (issue 27): a normal-looking HTTP worker that attacks elasticd from inside its tenant.

Standard library only, so any tenant user can run it with any python3 (Debian's, a venv's). It serves HTTP/1.1
(keep-alive) on ``ELASTIC_LISTEN`` (``unix:PATH``, or ``tcp:HOST:PORT`` when run by hand) like any worker: it is
routable, ``GET /`` answers 200 ``ok``, and ``GET /stats`` answers what the attack did so far as JSON. Meanwhile,
chosen by its first argument or ``$HOSTILE_ATTACK``, it runs one attack flat out until it is killed:

    burn         burn one core, nothing else (the baseline every other attack adds to)
    reports      connect to ELASTIC_CHANNEL, announce with its own ELASTIC_WORKER_ID/ELASTIC_TOKEN, then write
                 valid occupancy report lines as fast as it can (batched), reading and discarding the answers
    garbage      announce, then non-JSON lines, non-objects, unknown types, invalid UTF-8 and invalid reports
    longlines    announce, then 70 KB lines (``$HOSTILE_LINE_KB``), over the channel's line bound
    channel-all  reports + garbage + longlines at once, one connection each (issue 27's row)
    unread       announce, then unknown-type lines flat out, never reading a byte of elasticd's answers
    unannounced  hold as many channel connections as it can (``$HOSTILE_CONNECTIONS``, default 2000) and never
                 announce on any; reopen those that are closed
    stdout       write lines to stdout (elasticd's log relay) flat out
    slowloris    its HTTP server answers ``/hold`` never, ``/drip`` one byte a second, ``/endless`` with a response
                 head that never ends; with ``$HOSTILE_FRONT`` (HOST:PORT of elasticd's front) and ``$HOSTILE_HOST``
                 (its own domain) it also sends those requests to itself through the front, from
                 ``$HOSTILE_CLIENTS`` (default 64) connections, plus request heads sent one header a second
                 (``slowhead``); ``$HOSTILE_SLOW_KINDS`` (e.g. ``endless``) sends only those kinds. Those
                 paths are hostile only while slowloris runs (otherwise they answer 200 ``ok`` like ``/``)
    listeners    connections to elasticd's own ``metrics_listen`` (``$HOSTILE_METRICS``, HOST:PORT) flat out, from
                 ``$HOSTILE_CLIENTS`` threads, each asking ``GET /metrics`` and reading until the end (issue 43:
                 elasticd resets each before reading it)
    none         (the default) serve only

Every attack also burns one core, as ``burn`` does, so each benchmark row burns the same CPU as the baseline; for
a functional test, ``--no-burn`` (``HOSTILE_BURN=0``) leaves it out, and ``--limit N`` (``HOSTILE_LIMIT=N``)
makes the attack small: each part sends at most N lines and makes at most N connections (``slowloris``: N
requests, ``unannounced``: holds at most N), then holds what it has, still reading. E.g.
``hostile_worker.py garbage --no-burn --limit 10`` announces, sends ten bad lines and waits; ``GET /stats`` then
says how many answers came back, whether the announce was refused, whether elasticd closed the connection.
``/stats`` is ``{"attack": NAME, "pid": PID, "parts": {PART: {COUNTER: N, ...}}}``, counters such as ``announced``,
``announce_refused``, ``lines_sent``, ``answer_lines``, ``closed_by_elasticd``, ``reconnects``, ``held``.
``$HOSTILE_CPUS`` (for benchmarks) confines the worker and its parts to those CPUs, as a tenant's ``cpu.max`` of
that many cores would. ``$HOSTILE_CONTROL=FILE`` (for benchmarks): the file holds an attack name; the worker
polls it every 0.1 s and switches to the attack it names (killing the old one's parts, releasing what it held).

A real program against a channel that may become stricter: a closed connection, a refused connect or announce,
EPIPE, a reset or a timeout all mean "reconnect, announce again and go on" (with a 1 ms pause after a failed
connect or a refused announce, as a real attacker would, never a hot loop on a refusal). Each part of an attack
runs in a process of its own (``--part NAME``, a child of this worker: same user, same cgroup, inside the
worker's process tree) so that no part waits on another's GIL; the parts die with the worker (PDEATHSIG, and a
check of the parent pid).
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import http.server
import json
import os
import resource
import select
import selectors
import signal
import socket
import socketserver
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

ATTACKS: dict[str, tuple[str, ...]] = {
    "none": (),
    "burn": (),
    "reports": ("reports",),
    "garbage": ("garbage",),
    "longlines": ("longlines",),
    "channel-all": ("reports", "garbage", "longlines"),
    "unread": ("unread",),
    "unannounced": ("unannounced",),
    "stdout": ("stdout",),
    "slowloris": ("slowloris",),
    "listeners": ("listeners",),
}
SLOW_KINDS = ("hold", "drip", "endless", "slowhead")
_PAUSE = 0.001  # after a refused connect or announce: what a real attacker would wait, and no less
_STATS_EVERY = 0.25  # a part's counters to the worker this often

# ------------------------------------------------------------------------------------------ settings


class Settings:
    """What the environment (and the command line) says; the same in the worker and in its parts."""

    def __init__(self, limit: int | None = None) -> None:
        env = os.environ
        self.listen = env.get("ELASTIC_LISTEN", "")
        self.channel = env.get("ELASTIC_CHANNEL", "").removeprefix("unix:")
        self.worker_id = env.get("ELASTIC_WORKER_ID", "hostile")
        self.token = env.get("ELASTIC_TOKEN", "")
        raw_limit = env.get("HOSTILE_LIMIT")
        self.limit = limit if limit is not None else (int(raw_limit) if raw_limit else None)
        self.connections = int(env.get("HOSTILE_CONNECTIONS", "2000"))
        self.clients = int(env.get("HOSTILE_CLIENTS", "64"))
        self.line_kb = int(env.get("HOSTILE_LINE_KB", "70"))
        self.front = env.get("HOSTILE_FRONT", "")
        self.metrics = env.get("HOSTILE_METRICS", "")
        kinds = [k.strip() for k in env.get("HOSTILE_SLOW_KINDS", "").split(",") if k.strip() in SLOW_KINDS]
        self.slow_kinds = tuple(kinds) or SLOW_KINDS
        self.host = env.get("HOSTILE_HOST", "")
        self.control = env.get("HOSTILE_CONTROL", "")


def _raise_nofile() -> None:
    """As many descriptors as the hard limit allows: the unannounced part wants thousands."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


# ------------------------------------------------------------------------------------------ a part (a child)


class Part:
    """One part of an attack in its own process: counters it sends to the worker, and the worker's liveness."""

    def __init__(self, name: str, settings: Settings, stats_fd: int | None) -> None:
        self.name = name
        self.settings = settings
        # What a reader most wants to see, even at 0 (e.g. "elasticd never closed one").
        shown = {"burn": (), "stdout": ("bytes_written",), "slowloris": ("requests", "bytes_read"),
                 "unannounced": ("held", "closed_by_elasticd")}.get(name, ("announced", "announce_refused",
                                                                           "lines_sent", "closed_by_elasticd"))
        self.counters: dict[str, int] = dict.fromkeys(shown, 0)
        self._stats_fd = stats_fd
        self._parent = os.getppid()
        self.sent = 0  # lines (or connections, or clients): what --limit counts

    def count(self, key: str, n: int = 1) -> None:
        self.counters[key] = self.counters.get(key, 0) + n

    def orphaned(self) -> bool:
        return os.getppid() != self._parent

    def may_connect(self, key: str = "connected") -> bool:
        """Whether the limit allows another connection (counted under ``key``); when it does not, wait a while:
        a small attack holds what it has, it does not spin."""
        if self.settings.limit is None or self.counters.get(key, 0) < self.settings.limit:
            return True
        time.sleep(0.5)
        return False

    def allowance(self, n: int) -> int:
        """How many of ``n`` more lines the limit still allows."""
        return n if self.settings.limit is None else max(0, min(n, self.settings.limit - self.sent))

    def start_reporting(self) -> None:
        threading.Thread(target=self._report_stats, daemon=True).start()

    def _report_stats(self) -> None:
        while True:
            time.sleep(_STATS_EVERY)
            if self.orphaned():
                os._exit(0)
            if self._stats_fd is None:
                continue
            try:
                counters = dict(self.counters)
            except RuntimeError:  # changed size while copied: next time
                continue
            counters["sent"] = self.sent
            try:
                os.write(self._stats_fd, json.dumps(counters).encode() + b"\n")
            except OSError:
                os._exit(0)  # the worker is gone


def _die_with_parent() -> None:
    with contextlib.suppress(Exception):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def burn(part: Part) -> None:
    x = 0
    while True:
        for _ in range(200_000):
            x += 1
        if part.orphaned():
            return


# ------------------------------------------------------------------------------------------ the channel


def _connect_unix(part: Part, path: str, timeout: float = 1.0) -> socket.socket | None:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(timeout)
    try:
        sock.connect(path)
    except OSError as exc:
        part.count(f"connect_failed_{type(exc).__name__}")
        sock.close()
        time.sleep(_PAUSE)
        return None
    part.count("connected")
    return sock


def _announce(part: Part, sock: socket.socket) -> bool:
    """Announce with the worker's own id and token; True when elasticd answered ok (anything else: refused)."""
    s = part.settings
    line = json.dumps({"type": "announce", "worker": s.worker_id, "token": s.token, "pid": os.getpid(),
                       "capabilities": ["occupancy"]}).encode() + b"\n"
    try:
        sock.sendall(line)
        answer = b""
        deadline = time.monotonic() + 2.0
        while b"\n" not in answer and len(answer) < 65536:
            sock.settimeout(max(0.01, deadline - time.monotonic()))
            data = sock.recv(4096)
            if not data:
                break
            answer += data
    except OSError:
        part.count("announce_failed")
        return False
    first = answer.split(b"\n", 1)[0]
    try:
        reply = json.loads(first)
    except ValueError:
        reply = None
    if isinstance(reply, dict) and reply.get("type") == "ok":
        part.count("announced")
        return True
    part.count("announce_refused")
    return False


def _discard_answers(part: Part, sock: socket.socket, done: threading.Event) -> None:
    """Read what elasticd answers (and count its lines) until the connection ends; then wake the sender."""
    try:
        sock_r = sock.dup()
    except OSError:
        done.set()
        return
    sock_r.settimeout(None)
    try:
        while not done.is_set():
            data = sock_r.recv(1 << 16)
            if not data:
                part.count("closed_by_elasticd")
                break
            part.count("answer_lines", data.count(b"\n"))
    except OSError:
        part.count("read_error")
    finally:
        done.set()
        sock_r.close()
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)  # the sender's sendall fails now: reconnect


def _report_line() -> bytes:
    report = {"users": 3, "connections": 1, "active_users": 2, "executor": {"busy": 1, "total": 8, "queue_depth": 0},
              "cpu": 0.42, "rss": 31_457_280, "load": 1.5, "loop_lag": 0.001}
    return json.dumps({"type": "occupancy", "report": report}, separators=(",", ":")).encode() + b"\n"


_GARBAGE = (
    b"this is not json at all\n",
    b"[1, 2, 3]\n",
    b'{"type": "nonsense", "n": 1}\n',
    b'{"type": "occupancy", "report": {"users": -1, "cpu": "lots"}}\n',
    b'{"type": "occupancy", "report": {"evil": true}}\n',
    b"\xff\xfe\xfd not utf-8\n",
    b'{"type": "package", "id": 12345, "bytes": 0}\n',
    b'{"unterminated": \n',
)


def _flood_lines(name: str, settings: Settings) -> Callable[[], tuple[bytes, int]]:
    """A batch of lines for this part and how many lines it holds."""
    if name == "reports":
        line = _report_line()
        batch = line * 64
        return lambda: (batch, 64)
    if name == "garbage":
        batch = b"".join(_GARBAGE) * 8
        n = len(_GARBAGE) * 8
        return lambda: (batch, n)
    if name == "longlines":
        pad = b"a" * (settings.line_kb * 1024)
        line = b'{"type": "occupancy", "report": {"pad": "' + pad + b'"}}\n'
        return lambda: (line, 1)
    # unread: small lines each answered with a longer error, which it never reads
    batch = b'{"type": "x"}\n' * 256
    return lambda: (batch, 256)


def channel_flood(part: Part) -> None:
    """Connect, announce, write lines flat out; on any failure reconnect and announce again."""
    settings = part.settings
    reads = part.name != "unread"
    next_batch = _flood_lines(part.name, settings)
    while not part.orphaned():
        if not part.may_connect():
            continue
        sock = _connect_unix(part, settings.channel)
        if sock is None:
            continue
        done = threading.Event()
        try:
            if not _announce(part, sock):
                time.sleep(_PAUSE)
                continue
            if reads:
                threading.Thread(target=_discard_answers, args=(part, sock, done), daemon=True).start()
            # A send that cannot go on for a second: elasticd stopped reading this connection. A new one (whose
            # announce replaces this one) is read again: reconnect.
            sock.settimeout(1.0)
            while not done.is_set():
                batch, lines = next_batch()
                allowed = part.allowance(lines)
                if allowed == 0:  # the limit: hold the connection, keep reading, until it closes
                    done.wait(1.0)
                    continue
                if allowed < lines:
                    batch = b"".join(batch.splitlines(keepends=True)[:allowed])
                sock.sendall(batch)
                part.sent += allowed
                part.count("lines_sent", allowed)
        except OSError as exc:  # EPIPE, a reset, a timeout: all the same, go again
            part.count(f"send_failed_{type(exc).__name__}")
        finally:
            done.set()
            sock.close()
            part.count("reconnects")


def unannounced(part: Part) -> None:
    """Hold as many channel connections as allowed, never announcing; reopen each one elasticd closes."""
    settings = part.settings
    target = settings.connections if settings.limit is None else min(settings.connections, settings.limit)
    chooser = selectors.DefaultSelector()
    held = 0

    def want_more() -> bool:
        return held < target and (settings.limit is None or part.counters.get("connected", 0) < settings.limit)

    while not part.orphaned():
        while want_more():
            sock = _connect_unix(part, settings.channel)
            if sock is None:
                break  # refused or out of descriptors: paused 1 ms, watch what is held, try again
            sock.setblocking(False)
            chooser.register(sock, selectors.EVENT_READ)
            held += 1
            part.sent = held
            part.counters["held"] = held
        for key, _ in chooser.select(timeout=0.05 if want_more() else 0.5):
            conn = key.fileobj
            assert isinstance(conn, socket.socket)
            try:
                data = conn.recv(4096)
            except BlockingIOError:
                continue
            except OSError:
                data = b""
            if data:
                part.count("answer_bytes", len(data))
                continue
            chooser.unregister(conn)
            conn.close()
            held -= 1
            part.counters["held"] = held
            part.count("closed_by_elasticd")


def stdout_flood(part: Part) -> None:
    lines = b"".join(b"hostile output line %06d: " % i + b"x" * 72 + b"\n" for i in range(640))  # ~64 KB
    while not part.orphaned():
        allowed = part.allowance(640)
        if allowed == 0:
            time.sleep(0.5)
            continue
        chunk = lines if allowed == 640 else b"".join(lines.splitlines(keepends=True)[:allowed])
        try:
            view = memoryview(chunk)
            while view:
                view = view[os.write(1, view):]
        except OSError:  # the pipe is gone: elasticd is not reading any more
            return
        part.sent += allowed
        part.count("bytes_written", len(chunk))


# ------------------------------------------------------------------------------------------ slowloris, client side


def _front_address(settings: Settings) -> tuple[str, int] | None:
    host, _, port = settings.front.rpartition(":")
    return (host or "127.0.0.1", int(port)) if port.isdigit() else None


def _slow_client(part: Part, index: int) -> None:
    """One connection to the front, sending one kind of slow request again and again."""
    settings = part.settings
    address = _front_address(settings)
    assert address is not None
    kind = settings.slow_kinds[index % len(settings.slow_kinds)]
    host = settings.host or "localhost"
    while not part.orphaned():
        if not part.may_connect("requests"):
            continue
        part.count("requests")
        started = time.monotonic()
        try:
            sock = socket.create_connection(address, timeout=5.0)
        except OSError:
            part.count("connect_failed")
            time.sleep(_PAUSE)
            continue
        try:
            if kind == "slowhead":  # a request head that never ends, one header a second
                sock.sendall(f"GET / HTTP/1.1\r\nHost: {host}\r\n".encode())
                n = 0
                while not part.orphaned():
                    readable, _, _ = select.select([sock], [], [], 1.0)
                    if readable and not sock.recv(65536):
                        break
                    sock.sendall(b"X-Slow-%d: %d\r\n" % (n, n))
                    n += 1
            else:
                sock.sendall(f"GET /{kind} HTTP/1.1\r\nHost: {host}\r\n\r\n".encode())
                sock.settimeout(None)
                while data := sock.recv(1 << 16):  # read whatever comes, flat out, until the front closes
                    part.count("bytes_read", len(data))
        except OSError:
            part.count("client_error")
        finally:
            sock.close()
        part.count(f"{kind}_done")
        if time.monotonic() - started < 0.05:
            time.sleep(0.05)  # refused at once (a quota): this attack is about slowness, not a request flood


def slowloris_clients(part: Part) -> None:
    if _front_address(part.settings) is None:  # no front to call: the server side alone
        while not part.orphaned():
            time.sleep(0.5)
        return
    clients = part.settings.clients if part.settings.limit is None else min(part.settings.clients,
                                                                             part.settings.limit)
    for i in range(clients):
        threading.Thread(target=_slow_client, args=(part, i), daemon=True).start()
        part.sent = i + 1
    while not part.orphaned():
        time.sleep(0.5)


def _metrics_client(part: Part, address: tuple[str, int]) -> None:
    while not part.orphaned():
        if not part.may_connect("connections"):
            continue
        part.count("connections")
        try:
            with socket.create_connection(address, timeout=5.0) as sock:
                sock.sendall(b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
                received = 0
                while data := sock.recv(1 << 16):
                    received += len(data)
            part.count("answered" if received else "closed")
            part.count("bytes_read", received)
        except OSError:
            part.count("refused")
            time.sleep(_PAUSE)


def listener_flood(part: Part) -> None:
    host, _, port = part.settings.metrics.rpartition(":")
    if not port.isdigit():  # no listener named: nothing to attack
        while not part.orphaned():
            time.sleep(0.5)
        return
    clients = part.settings.clients if part.settings.limit is None else min(part.settings.clients,
                                                                             part.settings.limit)
    for _ in range(clients):
        threading.Thread(target=_metrics_client, args=(part, (host or "127.0.0.1", int(port))), daemon=True).start()
    while not part.orphaned():
        time.sleep(0.5)


PARTS: dict[str, Callable[[Part], None]] = {
    "burn": burn,
    "reports": channel_flood,
    "garbage": channel_flood,
    "longlines": channel_flood,
    "unread": channel_flood,
    "unannounced": unannounced,
    "stdout": stdout_flood,
    "slowloris": slowloris_clients,
    "listeners": listener_flood,
}


def run_part(name: str, settings: Settings, stats_fd: int | None) -> None:
    _die_with_parent()
    part = Part(name, settings, stats_fd)
    if part.orphaned() or os.getppid() == 1:
        return
    part.start_reporting()
    PARTS[name](part)


# ------------------------------------------------------------------------------------------ the worker


class Worker:
    """The HTTP server, the attack's parts (child processes) and their counters."""

    def __init__(self, attack: str, settings: Settings, burn_too: bool) -> None:
        self.settings = settings
        self.burn_too = burn_too
        self.attack = attack
        self.lock = threading.Lock()
        self.parts: dict[str, subprocess.Popen[bytes]] = {}
        self.stats: dict[str, dict[str, Any]] = {}
        self.slow = threading.Event()  # set while slowloris runs: the hostile paths are hostile
        self.generation = 0  # bumped at every switch: a held request from an older one lets go

    def part_names(self, attack: str) -> tuple[str, ...]:
        parts = ATTACKS[attack]
        return (*parts, "burn") if (attack == "burn" or (self.burn_too and attack != "none")) else parts

    def switch(self, attack: str) -> None:
        with self.lock:
            self._stop_parts()
            self.attack = attack
            self.generation += 1
            self.stats = {}
            if attack == "slowloris":
                self.slow.set()
            else:
                self.slow.clear()
            for name in self.part_names(attack):
                self._start_part(name)

    def stop(self) -> None:
        with self.lock:
            self._stop_parts()

    def _start_part(self, name: str) -> None:
        read_end, write_end = os.pipe()
        argv = [sys.executable, os.path.abspath(__file__), "--part", name, "--stats-fd", str(write_end)]
        if self.settings.limit is not None:
            argv += ["--limit", str(self.settings.limit)]
        process = subprocess.Popen(argv, stdin=subprocess.DEVNULL, pass_fds=(write_end,))
        os.close(write_end)
        self.parts[name] = process
        self.stats[name] = {}
        threading.Thread(target=self._read_stats, args=(name, read_end, self.stats), daemon=True).start()

    def _read_stats(self, name: str, fd: int, into: dict[str, dict[str, Any]]) -> None:
        with os.fdopen(fd, "rb") as stream:
            for line in stream:
                with contextlib.suppress(ValueError):
                    into[name] = json.loads(line)

    def _stop_parts(self) -> None:
        for process in self.parts.values():
            with contextlib.suppress(ProcessLookupError):
                process.kill()
        for process in self.parts.values():
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(5)
        self.parts = {}

    def snapshot(self) -> dict[str, Any]:
        return {"attack": self.attack, "pid": os.getpid(),
                "parts": {name: dict(counters) for name, counters in self.stats.items()}}

    def watch_control(self, path: Path) -> None:
        """Switch to the attack the control file names, whenever it changes."""
        while True:
            try:
                wanted = path.read_text().strip()
            except OSError:
                wanted = ""
            if wanted in ATTACKS and wanted != self.attack:
                self.switch(wanted)
            time.sleep(0.1)


def _handler(worker: Worker) -> type[http.server.BaseHTTPRequestHandler]:
    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        server_version = "hostile"
        sys_version = ""

        def log_message(self, format: str, *args: Any) -> None:
            pass

        def do_GET(self) -> None:
            path = self.path.split("?", 1)[0]
            if path == "/stats":
                self._answer(200, json.dumps(worker.snapshot()).encode() + b"\n", "application/json")
            elif worker.slow.is_set() and path in ("/hold", "/drip", "/endless"):
                self.close_connection = True
                with contextlib.suppress(OSError):
                    getattr(self, "_" + path[1:])(worker.generation)
            else:
                self._answer(200, b"ok\n", "text/plain")

        def _answer(self, status: int, body: bytes, kind: str) -> None:
            self.send_response(status)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def _going_on(self, generation: int) -> bool:
            return worker.generation == generation and worker.slow.is_set()

        def _closed(self, wait: float) -> bool:
            """Whether the front closed its side (checked for ``wait`` seconds)."""
            readable, _, _ = select.select([self.connection], [], [], wait)
            return bool(readable) and not self.connection.recv(65536)

        def _hold(self, generation: int) -> None:  # never a byte
            while self._going_on(generation) and not self._closed(0.5):
                pass

        def _drip(self, generation: int) -> None:  # a response head, one byte a second
            for byte in iter_forever(b"HTTP/1.1 200 OK\r\nX-Drip: " + b"d" * 1_000_000):
                if not self._going_on(generation) or self._closed(1.0):
                    return
                self.connection.sendall(bytes([byte]))

        def _endless(self, generation: int) -> None:  # a response head that never ends, flat out
            self.connection.sendall(b"HTTP/1.1 200 OK\r\n")
            chunk = b"".join(b"X-Endless-%d: %s\r\n" % (i, b"e" * 100) for i in range(128))
            self.connection.settimeout(1.0)
            while self._going_on(generation):
                with contextlib.suppress(TimeoutError):
                    self.connection.sendall(chunk)

    return Handler


def iter_forever(data: bytes) -> Iterator[int]:
    while True:
        yield from data


class _UnixServer(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True
    block_on_close = False
    request_queue_size = 1024


class _TCPServer(socketserver.ThreadingMixIn, socketserver.TCPServer):
    daemon_threads = True
    block_on_close = False
    allow_reuse_address = True
    request_queue_size = 1024


def serve(attack: str, settings: Settings, burn_too: bool) -> int:
    worker = Worker(attack, settings, burn_too)
    handler = _handler(worker)
    server: socketserver.BaseServer
    if settings.listen.startswith("tcp:"):
        host, _, port = settings.listen.removeprefix("tcp:").rpartition(":")
        server = _TCPServer((host or "127.0.0.1", int(port)), handler)
    else:
        path = settings.listen.removeprefix("unix:")
        if not path:
            print("hostile_worker: ELASTIC_LISTEN is not set", file=sys.stderr)
            return 2
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        server = _UnixServer(path, handler)
    stopping = threading.Event()

    def on_signal(signum: int, frame: object) -> None:
        stopping.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    worker.switch(attack)
    if settings.control:
        threading.Thread(target=worker.watch_control, args=(Path(settings.control),), daemon=True).start()
    while not stopping.wait(1.0):
        pass
    worker.stop()
    os._exit(0)


def _confine() -> None:
    """``$HOSTILE_CPUS`` (e.g. ``1``, or ``0,1``): the CPUs this worker and its parts may run on (they inherit it).
    For benchmarks on a fake cgroup tree, where the tenant's ``cpu.max`` holds nothing: one CPU stands for a
    tenant held to one core, so every attack burns the same CPU as the baseline and only what it makes elasticd do
    differs."""
    cpus = os.environ.get("HOSTILE_CPUS", "").strip()
    if cpus:
        os.sched_setaffinity(0, {int(c) for c in cpus.split(",") if c.strip()})


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("attack", nargs="?", default=os.environ.get("HOSTILE_ATTACK", "none"),
                        choices=sorted(ATTACKS), help="the attack (default: $HOSTILE_ATTACK, else none)")
    parser.add_argument("--no-burn", action="store_true", help="do not burn a core beside the attack")
    parser.add_argument("--limit", type=int,
                        help="each part sends at most this many lines and makes at most this many connections")
    parser.add_argument("--part", choices=sorted(PARTS), help=argparse.SUPPRESS)
    parser.add_argument("--stats-fd", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    _raise_nofile()
    _confine()
    settings = Settings(args.limit)
    if args.part:
        run_part(args.part, settings, args.stats_fd)
        return 0
    burn_too = not args.no_burn and os.environ.get("HOSTILE_BURN", "1") != "0"
    return serve(args.attack, settings, burn_too)


if __name__ == "__main__":
    sys.exit(main())
