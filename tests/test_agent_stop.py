"""A stop behind a balancer, through the real daemon: SIGTERM with server.stop_drain answers `drain` first while the
front still serves, a second SIGTERM stops at once, SIGINT (a terminal's Ctrl-C) stops at once, and a stop_drain
no agent could announce is said at start and waits for nothing."""

from __future__ import annotations

import http.client
import signal
import socket
import time

from harness import browse, free_port

APP = """\
tenants:
  acme:
    apps:
      shop:
        domains: [shop.localhost]
        root: {root}
        groups:
          green:
            command: ["{{python}}", "-m", "elasticd.demo"]
            pool: {{min_workers: 1, max_workers: 1}}
"""


def agent(port: int, send: bytes = b"shop.localhost\n") -> str:
    with socket.create_connection(("127.0.0.1", port), timeout=5) as conn:
        conn.sendall(send)
        answer = b""
        while chunk := conn.recv(4096):
            answer += chunk
    return answer.decode()


def _exited_within(d, seconds: float) -> float:
    began = time.monotonic()
    assert d.process is not None
    d.process.wait(seconds)
    return time.monotonic() - began


def test_sigterm_drains_first_and_a_second_sigterm_stops_at_once(daemons, tmp_path):
    port = free_port()
    d = daemons(APP.format(root=tmp_path), extra_server=f"  agent_listen: 127.0.0.1:{port}\n  stop_drain: 20s\n")
    d.start()
    assert agent(port).startswith("up ready ")
    kept = http.client.HTTPConnection(d.host, d.port, timeout=10)  # a balancer's kept-alive connection
    kept.request("GET", "/", headers={"Host": "shop.localhost"})
    first = kept.getresponse()
    first.read()
    assert first.status == 200 and first.getheader("Connection") is None
    d.signal(signal.SIGTERM)
    deadline = time.monotonic() + 5
    while not agent(port).startswith("drain"):
        assert time.monotonic() < deadline, "no drain after SIGTERM"
        time.sleep(0.05)
    assert agent(port) == "drain #acme/shop: elasticd is stopping\n"
    assert agent(port, b"\n") == "drain #elasticd is stopping\n"
    status, body, _ = browse(d, "/")  # still serving while it drains
    assert status == 200 and "worker acme.shop.green.1" in body
    # A kept-alive connection ends with its next answer, announced: none is left idle for the stop to close under a
    # request (RFC 9112 9.6: HAProxy would answer that request 502).
    kept.request("GET", "/", headers={"Host": "shop.localhost"})
    last = kept.getresponse()
    assert last.status == 200 and last.getheader("Connection") == "close"
    last.read()
    assert kept.sock is None or kept.sock.recv(1) == b""  # closed by the front
    d.notify.wait_for("STATUS", "stopping: answering drain to HAProxy for 20s first", timeout=5)  # systemctl status
    d.signal(signal.SIGTERM)  # the operator insists: no more waiting for the drain
    assert _exited_within(d, 15) < 15 and d.process.returncode == 0
    assert "stopping: the agent answers drain for 20s first" in d.log_text()


def test_sigint_stops_at_once_and_a_drain_no_agent_hears_waits_for_nothing(daemons, tmp_path):
    port = free_port()
    d = daemons(APP.format(root=tmp_path), extra_server=f"  agent_listen: 127.0.0.1:{port}\n  stop_drain: 20s\n")
    d.start()
    d.signal(signal.SIGINT)
    assert _exited_within(d, 15) < 15 and d.process.returncode == 0
    assert "answers drain" not in d.log_text()

    lone = daemons(APP.format(root=tmp_path), extra_server="  stop_drain: 20s\n")
    lone.start()
    assert "server.stop_drain is set without server.agent_listen" in lone.log_text()
    lone.signal(signal.SIGTERM)
    assert _exited_within(lone, 15) < 15 and lone.process.returncode == 0
