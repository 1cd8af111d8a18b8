"""Forwarding headers through the daemon, behind a real HAProxy (Debian's haproxy) on this host, trusted by its Unix
user (``server.trusted_proxy_users``): what HAProxy says of the client (its address, that it came over TLS) reaches
the app, and the sticky cookie is ``Secure``; the same headers sent by anyone else (root here, on the same loopback
address) are dropped and the front says its own. The user is made and removed here; HAProxy is started as root and
runs as it (``global user``), so its connections to the front are that user's sockets."""

from __future__ import annotations

import http.client
import json
import os
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
from harness import Daemon, free_port

HAPROXY = shutil.which("haproxy")
pytestmark = pytest.mark.skipif(HAPROXY is None or os.geteuid() != 0 or shutil.which("useradd") is None,
                                reason="needs root, useradd and HAProxy (apt install haproxy)")

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

# What the README's snippet has a TLS frontend say (`if { ssl_fc }`): said always here, where nothing is TLS.
HAPROXY_CONFIG = """\
global
    user {user}
    group {user}

defaults
    mode http
    timeout connect 2s
    timeout client 30s
    timeout server 30s
    option forwardfor

frontend web
    bind 127.0.0.1:{port}
    http-request set-header X-Forwarded-Proto https
    default_backend shop

backend shop
    server a 127.0.0.1:{front}
"""

CLAIMS = {"X-Forwarded-For": "203.0.113.9", "X-Forwarded-Proto": "https", "X-Forwarded-Host": "evil.example",
          "Forwarded": "for=203.0.113.9;proto=https", "X-Real-IP": "203.0.113.9", "X_Forwarded_For": "203.0.113.9"}


def _echo(port: int) -> tuple[dict[str, str], str]:
    """GET /echo with every claim: (the headers the app saw, lower-cased; the Set-Cookie the user got)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        conn.request("GET", "/echo", headers={"Host": "shop.localhost", **CLAIMS})
        response = conn.getresponse()
        body: dict[str, Any] = json.loads(response.read())
        assert response.status == 200, body
        return {k.lower(): v for k, v in body["headers"].items()}, response.getheader("Set-Cookie") or ""
    finally:
        conn.close()


def _until_served(port: int, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            _echo(port)
            return
        except (OSError, AssertionError, ValueError, http.client.HTTPException):
            assert time.monotonic() < deadline, "nothing answered through HAProxy"
            time.sleep(0.2)


def test_haproxy_as_a_trusted_user_is_believed_and_a_client_on_the_same_address_is_not(users, tmp_path: Path):
    proxy, _uid, _gid = users()
    root = tmp_path / "shop"
    root.mkdir()
    d = Daemon(tmp_path, APP.format(root=root), extra_server=f"  trusted_proxy_users: [{proxy}]\n")
    port = free_port()
    config = tmp_path / "haproxy.cfg"
    config.write_text(HAPROXY_CONFIG.format(user=proxy, port=port, front=d.port))
    assert HAPROXY is not None
    check = subprocess.run([HAPROXY, "-c", "-f", str(config)], capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr
    d.start()
    log = open(tmp_path / "haproxy.log", "wb")  # noqa: SIM115 - closed below
    haproxy = subprocess.Popen([HAPROXY, "-db", "-f", str(config)], stdout=log, stderr=subprocess.STDOUT)
    try:
        _until_served(port)
        through, cookie = _echo(port)
        # HAProxy's word: the client's address (added to the chain), TLS; the front adds HAProxy's own address
        assert through["x-forwarded-for"].endswith("127.0.0.1, 127.0.0.1"), through
        assert through["x-forwarded-proto"] == "https" and "Secure" in cookie
        assert through["x-forwarded-host"] == "evil.example" and through["forwarded"] == CLAIMS["Forwarded"]
        assert "x_forwarded_for" not in through  # dropped from every peer
        # root's request, straight to the front on the same loopback address: every claim dropped
        direct, cookie = _echo(d.port)
        assert direct["x-forwarded-for"] == "127.0.0.1" and direct["x-forwarded-proto"] == "http", direct
        assert direct["x-forwarded-host"] == "shop.localhost" and "Secure" not in cookie
        for said in ("forwarded", "x-real-ip", "x_forwarded_for"):
            assert said not in direct, said
    finally:
        haproxy.terminate()
        haproxy.wait(10)
        log.close()
        d.stop()
