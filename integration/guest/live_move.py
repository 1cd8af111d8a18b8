"""Scenario 15, the live move (issue #13): under systemd, with the tenant's workers running as its own user in
their cgroup leaf, ``elasticctl drain`` takes the reception out — a replacement starts first (min_workers 2),
every user on it is moved off with its in-process state, then it is retired. The demo's ``/counter`` (state that
lives only in the worker's process) goes on from the survivor: each user's next answer is its count plus one,
from another worker; the journal has a ``move`` per user, each with its package and duration, and the
drained worker's process is gone from the leaf."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from common import (
    BASE,
    PoolWatch,
    browse,
    check,
    elasticctl,
    metric_samples,
    procs,
    running,
    start_with,
    tenant_user,
    wait_for,
)

TENANT, APP, GROUP, HOST = "solo", "counter", "main", "move.localhost"
ROOT = Path("/srv", TENANT, APP)
USERS = 3
COUNT = 5  # each user's count before the drain

CONFIG = f"""\
server:
  listen: 127.0.0.1:8080
  metrics_listen: 127.0.0.1:9464
  cgroups: {{mode: required}}
  stop_timeout: 5s
  occupancy_interval: 1s
  move_timeout: 10s
tenants:
  {TENANT}:
    user: {tenant_user(TENANT)}
    resources: {{cpu: 100%, memory: 512M}}
    apps:
      {APP}:
        domains: [{HOST}]
        root: {ROOT}
        groups:
          {GROUP}:
            command: ["{{python}}", "-m", "elasticd.demo"]
            concurrency: 4
            pool: {{min_workers: 2, max_workers: 3}}
"""

_pool = PoolWatch(TENANT, APP, GROUP)


def _counter(cookie: str | None) -> tuple[dict[str, Any], str]:
    status, body, uid = browse(HOST, "/counter", cookie)
    check(status == 200, f"/counter answered {status}: {body[-300:]!r}")
    answer = json.loads(body)
    return answer, uid or cookie or ""


def s_move() -> tuple[str, dict[str, Any]]:
    ROOT.mkdir(parents=True, exist_ok=True)
    _pool.journal.clear()
    start_with(CONFIG)

    def two_announced() -> dict[str, Any] | None:
        g = _pool()
        up = [w for w in running(g) if w["announced"]]
        return g if len(up) == 2 else None

    group = wait_for(two_announced, 90, 0.5)
    check(group, f"the group did not come up with 2 announced workers: {_pool()['workers']}")
    reception = next(w for w in group["workers"] if w["reception"])
    leaf = BASE / "tenants" / TENANT / APP
    check(reception["pid"] in procs(leaf), f"the reception's pid {reception['pid']} is not in {leaf}")
    cookies = []
    for _ in range(USERS):
        answer, cookie = _counter(None)
        for _ in range(COUNT - 1):
            answer, _ = _counter(cookie)
        check(answer["count"] == COUNT and answer["worker"] == reception["id"],
              f"before the drain: {answer} (expected count {COUNT} on {reception['id']})")
        cookies.append(cookie)

    began = time.monotonic()
    drained = elasticctl("drain", reception["id"], timeout=180)
    seconds = time.monotonic() - began
    check(drained.returncode == 0, f"elasticctl drain exited {drained.returncode}: {drained.stderr.strip()}")
    after: list[dict[str, Any]] = []
    for cookie in cookies:
        answer, _ = _counter(cookie)
        after.append(answer)
    check(all(a["count"] == COUNT + 1 and a["worker"] != reception["id"] for a in after),
          f"after the drain the counters did not go on from another worker: {after}")
    group = _pool()
    ids = [w["id"] for w in group["workers"]]
    check(reception["id"] not in ids, f"{reception['id']} is still in the group: {ids}")
    check(reception["pid"] not in procs(leaf), f"the drained worker's pid {reception['pid']} is still in {leaf}")
    check(len(running(group)) >= 2, f"min_workers 2 was not kept: {group['workers']}")
    moves = [d for d in _pool.decisions() if d["decision"] == "move"]
    aborted = [d for d in _pool.decisions() if d["decision"] == "move-aborted"]
    check(len(moves) == USERS and not aborted, f"journal: {len(moves)} moves, {len(aborted)} aborted: "
          f"{[(d['decision'], d['reason']) for d in _pool.decisions()][-10:]}")
    sizes = sorted(d["numbers"]["package_bytes"] for d in moves)
    durations = sorted(d["numbers"]["ms"] for d in moves)
    moved_total = sum(v for labels, v in metric_samples("elasticd_moves_total")
                      if labels.get("tenant") == TENANT and labels.get("outcome") == "moved")
    check(moved_total == USERS, f"elasticd_moves_total{{outcome=moved}} is {moved_total}, not {USERS}")
    survivors = sorted({a["worker"] for a in after})
    return (f"elasticctl drain {reception['id']} in {seconds:.1f}s: a replacement started first (min_workers 2), "
            f"{USERS} users moved off with their /counter at {COUNT} (packages {sizes} bytes, moves "
            f"{durations} ms), each answered {COUNT + 1} next from {', '.join(survivors)}; the drained worker's "
            f"pid {reception['pid']} left the leaf; elasticd_moves_total{{outcome=\"moved\"}} {moved_total:g}",
            {"moves": moves, "after": after})
