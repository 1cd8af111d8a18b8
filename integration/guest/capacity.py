"""Scenario 17, capacity probes (issue #16): under systemd, with the tenant's workers as its own user, each worker's
capacity is read from its own /metrics (the demo exports its requests in flight under vLLM's names). An engineer
sends work straight to the reception's socket, bypassing the front: the front counts nothing open there, yet the
probe reads it full, so new users go to the other worker and none is sent to the full one; once that work ends
the reading says there is room and the reception takes new users again. The host's signed registry
(``GET /v1/registry``) verifies with its secret and carries no socket path."""

from __future__ import annotations

import hashlib
import hmac
import http.client
import json
import socket
import threading
import time
from pathlib import Path
from typing import Any

from common import (
    PoolWatch,
    browse,
    check,
    elasticctl_json,
    metric_samples,
    start_with,
    tenant_user,
    wait_for,
)

TENANT, APP, GROUP = "solo", "infer", "main"
HOST = "capacity.localhost"
ROOT = Path("/srv", TENANT, APP)
SECRET = Path("/etc/elasticd/registry.key")
RUNTIME_DIR = Path("/run/elasticd")
RECEPTION, OTHER = f"{TENANT}.{APP}.{GROUP}.1", f"{TENANT}.{APP}.{GROUP}.2"
BYPASS_MS = 20000  # work the front never sent: long enough for a slow TCG guest to see it (4-6 s here)

CONFIG = """\
server:
  listen: 127.0.0.1:8080
  metrics_listen: 127.0.0.1:9464
  cgroups: {{mode: required}}
  stop_timeout: 5s
  occupancy_interval: 1s
  registry: {{secret_file: {secret}, ttl: 5s}}
tenants:
  {tenant}:
    user: {user}
    resources: {{cpu: 100%, memory: 512M}}
    apps:
      {app}:
        domains: [{host}]
        root: {root}
        groups:
          {group}:
            command: ["{{python}}", "-m", "elasticd.demo"]
            concurrency: 2
            pool: {{min_workers: 2, max_workers: 2}}
            capacity: {{probe: prometheus, path: /metrics, interval: 300ms, max_age: 3s}}
"""


def _workers() -> dict[str, dict[str, Any]]:
    """The group's workers by id, from the admin socket (what `elasticctl pool --json` prints, polled without its
    Python start-up: ~2 s of a guest CPU under TCG for every poll, beside the probes being measured)."""
    return {w["id"]: w for w in PoolWatch(TENANT, APP, GROUP)()["workers"]}


def _reading(worker: str) -> dict[str, Any] | None:
    capacity = _workers().get(worker, {}).get("capacity") or {}
    readings = capacity.get("readings") or []
    return {**readings[0], "full": capacity.get("full")} if readings else None


def _straight_to_the_socket(path: str, done: list[bytes]) -> None:
    """What an engineer with curl does: a request to the worker's own socket, not through the front."""
    with socket.socket(socket.AF_UNIX) as conn:
        conn.settimeout(60)
        conn.connect(path)
        conn.sendall(f"GET /sleep?ms={BYPASS_MS} HTTP/1.1\r\nHost: worker\r\nConnection: close\r\n\r\n".encode())
        answer = b""
        while chunk := conn.recv(65536):
            answer += chunk
        done.append(answer)


def s_capacity() -> tuple[str, dict[str, Any]]:
    ROOT.mkdir(parents=True, exist_ok=True)
    SECRET.parent.mkdir(parents=True, exist_ok=True)
    SECRET.write_bytes(b"k" * 48 + b"\n")
    SECRET.chmod(0o600)
    start_with(CONFIG.format(secret=SECRET, tenant=TENANT, user=tenant_user(TENANT), app=APP, host=HOST, root=ROOT,
                             group=GROUP))
    both = wait_for(lambda: all(_reading(w) is not None for w in (RECEPTION, OTHER)), 90, 0.5)
    check(both, f"no capacity reading for both workers: {json.dumps(_workers())[:2000]}")
    # The operator's command shows the same readings.
    shown = {w["id"]: w for w in elasticctl_json("pool", f"{TENANT}/{APP}")["groups"][GROUP]["workers"]}
    check(all((shown.get(w, {}).get("capacity") or {}).get("readings") for w in (RECEPTION, OTHER)),
          f"elasticctl pool --json shows no capacity reading for both workers: {json.dumps(shown)[:2000]}")

    # Work the front does not see: two requests straight to the reception's socket (its concurrency is 2).
    done: list[bytes] = []
    bypass = [threading.Thread(target=_straight_to_the_socket,
                               args=(str(RUNTIME_DIR / "workers" / TENANT / f"{APP}.{GROUP}.1.sock"), done))
              for _ in range(2)]
    began = time.monotonic()
    for thread in bypass:
        thread.start()
    full = wait_for(lambda: (r := _reading(RECEPTION)) is not None and r["full"] and r, 20, 0.1)
    check(full, f"the reception's probe did not read it full: {_reading(RECEPTION)}")
    seen_full_after = time.monotonic() - began
    answered = []
    for _ in range(4):
        status, body, _ = browse(HOST, "/")
        check(status == 200, f"a new user got {status}: {body[-300:]!r}")
        answered.append(body.decode().split()[1])
    check(answered == [OTHER] * 4, f"new users while the reception said it was full went to {answered}")
    samples = {labels["node"]: value for labels, value in metric_samples("elasticd_capacity_used")}
    check(samples.get(RECEPTION) == 2.0, f"elasticd_capacity_used of the reception: {samples}")

    for thread in bypass:
        thread.join(BYPASS_MS / 1000 + 30)
    check(len(done) == 2 and all(b" 200 " in answer.split(b"\r\n", 1)[0] for answer in done),
          f"the bypassing requests: {[a[:80] for a in done]}")
    room = wait_for(lambda: (r := _reading(RECEPTION)) is not None and not r["full"] and r, 20, 0.1)
    check(room, f"the reception's reading did not come back under its limit: {_reading(RECEPTION)}")
    status, body, _ = browse(HOST, "/")
    check(status == 200 and body.decode().split()[1] == RECEPTION,
          f"a new user once the reception had room again: {status} {body[-200:]!r}")

    # The registry: signed with the host's secret, no socket path, no URL.
    body, signature = _registry()
    snapshot = json.loads(body)
    workers = [w for a in snapshot["apps"] for g in a["groups"] for w in g["workers"]]
    check(sorted(w["id"] for w in workers) == [RECEPTION, OTHER] and all(w["healthy"] for w in workers),
          f"the registry's workers: {workers}")
    check(b"/run/" not in body and b".sock" not in body and b"http" not in body, f"the registry leaks: {body!r}")
    expected = "sha256=" + hmac.new(SECRET.read_bytes().strip(), body, hashlib.sha256).hexdigest()
    check(signature == expected, f"the registry's signature {signature} is not HMAC-SHA256 of its body")
    return (f"two requests sent straight to the reception's socket (bypassing the front) made its own /metrics read "
            f"full {seen_full_after:.1f}s later (2/2); 4 new users then went to {OTHER}, none to the reception; "
            f"once that work ended its reading came back under its limit and a new user went to the reception "
            f"again; GET /v1/registry listed both workers healthy, without a socket path, signed "
            f"{expected[:19]}…", {"seen_full_after": seen_full_after, "answered": answered})


def _registry() -> tuple[bytes, str | None]:
    conn = http.client.HTTPConnection("127.0.0.1", 9464, timeout=30)
    try:
        conn.request("GET", "/v1/registry")
        response = conn.getresponse()
        body = response.read()
        check(response.status == 200, f"GET /v1/registry answered {response.status}: {body[:300]!r}")
        return body, response.getheader("X-Elastic-Registry-Signature")
    finally:
        conn.close()
