"""Capacity probes through the real daemon: workers that export their own capacity (tests/apps/capacity_app.py,
vLLM's metric names) and a second elasticd routed to as a node, its signed registry read through a proxy that
forges, replays and serves stale snapshots."""

from __future__ import annotations

import http.client
import json
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from harness import browse

APP = Path(__file__).resolve().parent / "apps" / "capacity_app.py"
SERVER = "  occupancy_interval: 200ms\n  hung_after: 3s\n"
FULL = "# HELP vllm:num_requests_running Running.\n# TYPE vllm:num_requests_running gauge\n" \
       'vllm:num_requests_running{model="m"} 4\nvllm:num_requests_waiting{model="m"} 3\n'
ROOM = 'vllm:num_requests_running{model="m"} 1\nvllm:num_requests_waiting{model="m"} 0\n'

PROBED = """\
tenants:
  acme:
    apps:
      shop:
        domains: [shop.localhost]
        root: {root}
        groups:
          green:
            command: ["{python}", "{app}"]
            env: {{CLAIMS_DIR: "{claims}", BUSY_RETRY: "3"}}
            concurrency: 4
            pool: {{min_workers: 2, max_workers: 2}}
            capacity: {{probe: prometheus, path: /metrics, interval: 100ms, max_age: 0, wait: {wait}}}
"""


def _served(claims: Path, worker: str) -> int:
    path = claims / f"{worker}.served"
    return len(path.read_text().splitlines()) if path.exists() else 0


def _capacity(d, worker: str) -> dict:
    return next(w for w in d.pool()["workers"] if w["id"] == worker)["capacity"]


def _get(port: int, path: str) -> tuple[int, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request("GET", path)
        response = conn.getresponse()
        return response.status, response.read()
    finally:
        conn.close()


def _wait(predicate, what: str, timeout: float = 20.0):
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


def _probed_daemon(daemons, tmp_path, wait: str = "600ms"):
    claims = tmp_path / "claims"
    claims.mkdir()
    d = daemons(PROBED.format(root=tmp_path, python=sys.executable, app=APP, claims=claims, wait=wait),
                extra_server=SERVER)
    d.start()
    d.wait_pool(lambda g: sum(1 for w in g["workers"] if w["state"] == "running") == 2, 30, "two workers")
    return d, claims


def test_a_worker_that_says_it_is_full_gets_no_new_user_and_a_failing_probe_forgets(daemons, tmp_path):
    d, claims = _probed_daemon(daemons, tmp_path)
    reception, other = "acme.shop.green.1", "acme.shop.green.2"
    (claims / f"{reception}.prom").write_text(FULL)  # 7 of 4: full, though elasticd sent it nothing
    (claims / f"{other}.prom").write_text(ROOM)
    _wait(lambda: _capacity(d, reception)["full"] and _capacity(d, other)["readings"], "both readings")
    for _ in range(20):  # new users: born on the reception, unless it says it is full
        status, body, cookie = browse(d, "/")
        assert status == 200 and other in body and cookie
    assert _served(claims, reception) == 0 and _served(claims, other) == 20
    pool = d.pool()
    full = next(w for w in pool["workers"] if w["id"] == reception)
    assert full["components"]["capacity"] == 1.0 and full["occupancy"] == 1.0  # the pool sees it full too
    assert full["capacity"]["readings"][0]["source"] == "prometheus"
    assert full["capacity"]["readings"][0]["used"] == 7 and full["capacity"]["readings"][0]["limit"] == 4
    metrics = _get(d.metrics_port, "/metrics")[1].decode()
    assert ('elasticd_capacity_used{app="shop",group="green",node="acme.shop.green.1",source="prometheus",'
            'tenant="acme"} 7.0') in metrics
    assert 'elasticd_capacity_limit{app="shop",group="green",node="acme.shop.green.1"' in metrics
    shown = d.ctl("pool", "acme/shop")
    assert "7/4 prometheus" in shown.stdout and "FULL" in shown.stdout, shown.stdout

    # Its source stops answering (503): the reading is forgotten at the next poll — max_age is 0, so nothing
    # but the failure can take it — and admission falls back to open requests: new users are born there again.
    (claims / f"{reception}.prom").write_text("down")
    started = time.monotonic()
    _wait(lambda: not _capacity(d, reception)["readings"], "the reading forgotten")
    forgotten = time.monotonic() - started
    status, body, _ = browse(d, "/")
    assert status == 200 and reception in body
    assert _capacity(d, reception)["state"] == "unreachable"
    assert "capacity probe of acme.shop.green.1: unreachable (HTTP 503" in d.log_text()

    def failed_polls() -> float:
        lines = [line for line in _get(d.metrics_port, "/metrics")[1].decode().splitlines()
                 if line.startswith('elasticd_capacity_probe_failures_total{app="shop",group="green",'
                                    'node="acme.shop.green.1",reason="unreachable",tenant="acme"}')]
        return float(lines[0].rsplit(" ", 1)[1]) if lines else 0.0

    _wait(lambda: failed_polls() >= 3, "every failed poll counted")
    time.sleep(0.5)  # more failing polls: still one line (said once per change of state, not per tick)
    assert d.log_text().count("capacity probe of acme.shop.green.1: unreachable (HTTP 503") == 1
    print(f"reading forgotten {forgotten:.2f}s after its source failed (interval 0.1s)")


def test_a_sticky_user_of_a_full_worker_waits_for_room_then_gets_503(daemons, tmp_path):
    # (Its wait, 2 s: room must come within it below, after a write and a probe's poll, on a loaded machine too.)
    d, claims = _probed_daemon(daemons, tmp_path, wait="2s")
    for worker in ("acme.shop.green.1", "acme.shop.green.2"):
        (claims / f"{worker}.prom").write_text(ROOM)
    _wait(lambda: all(_capacity(d, w)["readings"] for w in ("acme.shop.green.1", "acme.shop.green.2")), "readings")
    status, body, cookie = browse(d, "/")
    home = body.split()[1]
    browse(d, "/", cookie)  # its cookie back: on the surface, stuck to its worker
    (claims / f"{home}.prom").write_text(FULL)
    _wait(lambda: _capacity(d, home)["full"], "its worker full")
    before = _served(claims, home)

    started = time.monotonic()  # full for good: it waits its 2 s, then 503 with a Retry-After
    conn = http.client.HTTPConnection("127.0.0.1", d.port, timeout=10)
    conn.request("GET", "/", headers={"Host": "shop.localhost", "Cookie": f"elastic_uid={cookie}"})
    response = conn.getresponse()
    waited = time.monotonic() - started
    assert response.status == 503 and response.getheader("Retry-After") == "1", response.read()
    assert "full" in response.read().decode()
    conn.close()
    assert 1.9 <= waited < 8, waited
    assert _served(claims, home) == before  # never sent there, nor re-placed elsewhere
    status, body, _ = browse(d, "/")  # a new user goes to the other worker meanwhile
    assert status == 200 and home not in body

    # Room comes while it waits: it goes to its own worker.
    answer: dict = {}

    def ask() -> None:
        answer["reply"] = browse(d, "/", cookie)

    asker = threading.Thread(target=ask)
    asker.start()
    time.sleep(0.2)
    (claims / f"{home}.prom").write_text(ROOM)
    asker.join(10)
    assert answer["reply"][0] == 200 and home in answer["reply"][1]


def test_a_429_with_retry_after_is_a_back_off_that_outlives_a_blind_probe(daemons, tmp_path):
    d, claims = _probed_daemon(daemons, tmp_path)
    reception, other = "acme.shop.green.1", "acme.shop.green.2"
    for worker in (reception, other):
        (claims / f"{worker}.prom").write_text(ROOM)
    _wait(lambda: _capacity(d, reception)["readings"], "a reading")
    status, _, _ = browse(d, "/busy")  # a new user, born on the reception: it answers 429, Retry-After: 3
    assert status == 429
    (claims / f"{reception}.prom").unlink()  # and its probe goes blind (404): its own reading is forgotten
    capacity = _wait(lambda: (c := _capacity(d, reception)) and c["state"] == "unreachable" and c, "blind")
    assert capacity["full"] and [r["source"] for r in capacity["readings"]] == ["ratelimit"]
    for _ in range(5):
        status, body, _ = browse(d, "/")
        assert status == 200 and other in body
    _wait(lambda: not _capacity(d, reception)["full"], "the back-off over", timeout=10)
    status, body, _ = browse(d, "/")
    assert status == 200 and reception in body


# ------------------------------------------------------------------ two daemons: a node and its signed registry

HOST = """\
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

EDGE = """\
tenants:
  acme:
    apps:
      shop:
        domains: [shop.localhost]
        root: {root}
        groups:
          remote:
            concurrency: 4
            nodes:
              - url: "http://127.0.0.1:{host_port}"
                name: host2
                capacity: {{probe: registry, url: "http://127.0.0.1:{proxy_port}/v1/registry",
                            secret_file: {secret}, key_file: {key}, interval: 100ms}}
"""


class RegistryProxy:
    """Between the edge's probe and the host's registry: passes snapshots on, or forges, replays or serves an
    old one, as the test says."""

    def __init__(self, upstream_port: int, key: str) -> None:
        self.upstream_port, self.key = upstream_port, key
        self.mode = "pass"
        self.first: tuple[bytes, str] | None = None
        self.passed = 0  # snapshots fetched and passed on
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                body, signature = proxy.answer(self.headers.get("Authorization"))
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("X-Elastic-Registry-Signature", signature)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def fetch(self, authorization: str | None) -> tuple[bytes, str]:
        conn = http.client.HTTPConnection("127.0.0.1", self.upstream_port, timeout=5)
        conn.request("GET", "/v1/registry", headers={"Authorization": authorization or ""})
        response = conn.getresponse()
        body, signature = response.read(), response.getheader("X-Elastic-Registry-Signature") or ""
        conn.close()
        return body, signature

    def answer(self, authorization: str | None) -> tuple[bytes, str]:
        if self.mode in ("replay", "stale") and self.first is not None:
            return self.first
        body, signature = self.fetch(authorization)
        self.passed += 1
        if self.first is None:
            self.first = (body, signature)
        if self.mode == "forge":  # the host's signature on a body that says the node is empty
            return body.replace(b'"open":', b'"open":0,"x":').replace(b'"healthy":true', b'"healthy":true '), signature
        return body, signature

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def test_two_daemons_a_node_group_reads_the_hosts_signed_registry_and_refuses_forgeries(daemons, tmp_path):
    secret, key = tmp_path / "registry.key", tmp_path / "reader.key"
    secret.write_text("s" * 40 + "\n")
    key.write_text("reader-key-1\n")
    host = daemons(HOST.format(root=tmp_path), extra_server=SERVER + f"  registry: {{secret_file: {secret}, "
                                                                    f"ttl: 3s, key_file: {key}}}\n")
    host.start()
    host.wait_pool(lambda g: any(w["state"] == "running" for w in g["workers"]), 30, "the host's worker")
    assert _get(host.metrics_port, "/v1/registry")[0] == 401  # a reader without the key
    proxy = RegistryProxy(host.metrics_port, "reader-key-1")
    try:
        body, signature = proxy.fetch("Bearer reader-key-1")
        snapshot = json.loads(body)
        assert snapshot["version"] == 1 and snapshot["ttl"] == 3 and signature.startswith("sha256=")
        assert snapshot["apps"][0]["groups"][0]["workers"][0]["id"] == "acme.shop.green.1"
        assert b"sock" not in body and b"http" not in body and b"ssss" not in body  # no socket, URL or secret
        proxy.first = None

        edge = daemons(EDGE.format(root=tmp_path, host_port=host.port, proxy_port=proxy.port, secret=secret,
                                   key=key), extra_server=SERVER)
        edge.start()
        node = "acme.shop.remote@host2"

        def capacity() -> dict:
            return edge.pool(group="remote")["workers"][0]["capacity"]

        _wait(lambda: capacity()["state"] == "ok", "the snapshot accepted")
        reading = capacity()["readings"][0]
        assert reading["source"] == "registry" and reading["limit"] == 8 and reading["used"] == 0
        conn = http.client.HTTPConnection("127.0.0.1", edge.port, timeout=10)
        conn.request("GET", "/counter", headers={"Host": "shop.localhost"})  # through the edge to the host's worker
        response = conn.getresponse()
        body = response.read().decode()
        cookies = response.msg.get_all("Set-Cookie") or []
        conn.close()
        assert response.status == 200 and json.loads(body)["worker"] == "acme.shop.green.1"
        # One id across the tier: the edge's first request to the node carries the id it gave, so the host's
        # front sets no cookie of its own (two, and a browser would keep the last).
        assert len(cookies) == 1, cookies
        cookie = cookies[0].split("elastic_uid=")[1].split(";")[0]
        assert json.loads(body)["user"] == cookie
        status, body, _ = browse(edge, "/counter", cookie)
        assert status == 200 and json.loads(body)["count"] == 2, body  # sticky on both hosts
        shown = edge.ctl("pool", "acme/shop")
        assert "host2" in shown.stdout and "registry" in shown.stdout, shown.stdout

        for mode, state in (("forge", "bad signature"), ("replay", "replayed"), ("stale", "stale")):
            if mode == "replay":
                proxy.first = None
                proxy.mode = "pass"
                passed = proxy.passed
                deadline = time.monotonic() + 10
                while proxy.passed < passed + 3:  # the first snapshot captured, then newer ones accepted
                    assert time.monotonic() < deadline, "no snapshot passed on"
                    time.sleep(0.05)
                proxy.mode = "replay"
            elif mode == "stale":
                deadline = time.monotonic() + 10
                while json.loads(proxy.first[0])["generated_at"] + 3 > time.time():  # its ttl runs out
                    assert time.monotonic() < deadline
                    time.sleep(0.1)
                proxy.mode = "stale"  # (older than the last accepted too: stale is checked first)
            else:
                proxy.mode = mode
            _wait(lambda s=state: capacity()["state"] == s, f"refused as {state}")
            assert capacity()["readings"] == []  # each refusal forgets the reading
            assert f"capacity probe of {node}: {state}" in edge.log_text()
            proxy.mode, proxy.first = "pass", None
            _wait(lambda: capacity()["state"] == "ok", f"accepted again after {state}")
        status, _, _ = browse(edge, "/")
        assert status == 200
    finally:
        proxy.close()
