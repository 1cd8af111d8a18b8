"""A worker that asks elasticd's own listeners for what a tenant must not get: tests/test_listener_guard.py runs it as a
tenant (and scenario 26 in the VM).

``GET /`` answers JSON: for each of ``GET /metrics``, ``GET /monitor``, ``GET /monitor/state?app=$PROBE_OTHER_APP``
on ``$PROBE_METRICS`` (host:port), and a check on ``$PROBE_AGENT`` (HAProxy's agent-check), what came back: the
status line (or the agent's line), ``"closed"`` (nothing, then the end) or the error. ``GET /flood?n=N``: N
connections to ``$PROBE_METRICS`` at once (each sends nothing), then how many were answered and how, and how long
the last answer took. Standard library only (it runs on Debian's python3, inside a tenant's view)."""

from __future__ import annotations

import http.server
import json
import os
import resource
import selectors
import signal
import socket
import socketserver
import sys
import time
from urllib.parse import parse_qs, urlsplit


def _address(variable: str) -> tuple[str, int]:
    host, _, port = os.environ[variable].rpartition(":")
    return host, int(port)


def _ask(address: tuple[str, int], payload: bytes) -> str:
    try:
        with socket.create_connection(address, timeout=5) as sock:
            if payload:
                sock.sendall(payload)
            received = b""
            while len(received) < 65536:
                chunk = sock.recv(65536)
                if not chunk:
                    break
                received += chunk
    except OSError as exc:
        return f"error: {exc.__class__.__name__}: {exc}"
    if not received:
        return "closed"
    return received.split(b"\r\n", 1)[0].split(b"\n", 1)[0].decode("latin-1")


def observe() -> dict[str, str]:
    metrics = _address("PROBE_METRICS")
    other = os.environ.get("PROBE_OTHER_APP", "")
    seen = {}
    for path in ("/metrics", "/monitor", f"/monitor/state?app={other}"):
        seen[path] = _ask(metrics, f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n".encode())
    if os.environ.get("PROBE_AGENT"):
        seen["agent"] = _ask(_address("PROBE_AGENT"), b"\n")
    return seen


def flood(count: int) -> dict[str, object]:
    """``count`` connections at once, each sending a request as soon as it is connected: what each got back, and
    when the last answer came. (A request, not silence: a connection the kernel took by a SYN cookie while the
    listener's backlog was full exists only for the client until its first bytes arrive.)"""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    metrics = _address("PROBE_METRICS")
    selector = selectors.DefaultSelector()
    began = time.monotonic()
    outcomes: dict[str, int] = {}
    sockets = []

    def tally(outcome: str) -> None:
        outcomes[outcome] = outcomes.get(outcome, 0) + 1

    for _ in range(count):
        sock = socket.socket()
        sock.setblocking(False)
        sockets.append(sock)
        sock.connect_ex(metrics)
        selector.register(sock, selectors.EVENT_WRITE, None)
    last = 0.0
    while selector.get_map() and time.monotonic() - began < 20:
        for key, _ in selector.select(timeout=1):
            sock = key.fileobj
            assert isinstance(sock, socket.socket)
            try:
                if key.data is None:  # connected (or failed): send the request, then read
                    sock.send(b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
                    selector.modify(sock, selectors.EVENT_READ, b"")
                    continue
                chunk = sock.recv(4096)
            except OSError as exc:
                outcome = f"error: {exc.strerror}"
            else:
                if chunk:
                    selector.modify(sock, selectors.EVENT_READ, key.data + chunk)
                    continue
                outcome = key.data.split(b"\r\n", 1)[0].decode("latin-1") if key.data else "closed"
            tally(outcome)
            last = time.monotonic() - began
            selector.unregister(sock)
            sock.close()
    unanswered = len(selector.get_map())
    for sock in sockets:
        sock.close()
    return {"outcomes": outcomes, "unanswered": unanswered, "last_answer_s": round(last, 3), "limit": [soft, hard]}


class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        url = urlsplit(self.path)
        if url.path == "/flood":
            answer: object = flood(int(parse_qs(url.query).get("n", ["100"])[0]))
        else:
            answer = observe()
        body = json.dumps(answer).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def address_string(self) -> str:  # (a Unix socket's peer has no host to print)
        return "unix"

    def log_message(self, format: str, *args: object) -> None:
        pass


class Server(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
    server = Server(os.environ["ELASTIC_LISTEN"].removeprefix("unix:"), Handler)
    print("listener probe ready", file=sys.stderr, flush=True)
    server.serve_forever()
