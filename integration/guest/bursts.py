"""Scenario 21, issue #31 (the pool under bursts and failures), under systemd on real cgroups:

1. **Held, not refused**: the only worker of a tenant with ``cpu: 30%`` (its restart is slow: the interpreter starts
   under the quota) is SIGKILLed while four clients keep a request each in flight. Every answer is counted: no 503
   and no connection refused or reset by the front; only the requests that were on the worker may fail, at most one
   per client: 502, or a cut answer when the worker had sent part of it (aiohttp 3.8, Debian 12's, writes an
   answer's head and body in two sends, and the kill can fall between them: the front then cuts the client's
   connection rather than pass on a truncated answer as whole). Its replacement runs in the app's leaf.
2. **Recycled before the kernel kills it**: a handler that leaks (``/mem?mb=30``: each request keeps 30 MiB) under
   ``pool.max_rss: 120M`` in a tenant of ``memory: 400M, swap: 0``: the worker is recycled (a ``recycle``
   decision naming max_rss, a new worker first, the old one's pid gone) and the tenant's ``memory.events`` oom_kill
   does not move; every request is answered 200.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

from common import (
    BASE,
    UNIT,
    PoolWatch,
    check,
    elasticctl_json,
    front,
    journal_cursor,
    journal_since,
    leaf,
    procs,
    read_kv,
    say,
    start_with,
    status,
    suite_config,
    systemctl,
    tenant_user,
    wait_for,
    workers,
    write_config,
)

TENANT, APP, GROUP, HOST = "bursty", "web", "main", "bursty.localhost"
ROOT = Path("/srv", TENANT, APP)
CLIENTS = 4
LEAK_MB, MAX_RSS_MB, MEMORY_MB = 30, 120, 400

CONFIG = f"""\
server:
  listen: 127.0.0.1:8080
  metrics_listen: 127.0.0.1:9464
  cgroups: {{mode: required}}
  stop_timeout: 5s
  occupancy_interval: 500ms
  sample_interval: 1s
  hung_after: 10s
tenants:
  {TENANT}:
    user: {tenant_user(TENANT)}
    resources: {{cpu: 30%, memory: {MEMORY_MB}M, swap: 0}}
    apps:
      {APP}:
        domains: [{HOST}]
        root: {ROOT}
        groups:
          {GROUP}:
            command: ["{{python}}", "-m", "elasticd.demo"]
            concurrency: 4
            pool: {{min_workers: 1, max_workers: 1, max_rss: {MAX_RSS_MB}M}}
"""


def s_bursts() -> tuple[str, dict[str, Any]]:
    try:
        return _scenario()
    finally:
        systemctl("stop", UNIT)
        write_config(suite_config())


def _worker() -> dict[str, Any] | None:
    # (a pid too: a worker just killed reads "running" with no pid for the moment before its exit is handled)
    found = [w for w in workers(status(), TENANT, APP) if w["state"] == "running" and w["pid"] is not None]
    return found[0] if len(found) == 1 else None


def _scenario() -> tuple[str, dict[str, Any]]:
    ROOT.mkdir(parents=True, exist_ok=True)
    cursor = journal_cursor()
    start_with(CONFIG)
    first = wait_for(_worker, 60, 0.3)
    check(first, "the tenant's worker did not come up:\n" + journal_since(cursor)[-3000:])
    killed, killed_details = _killed_under_load(first)
    recycled, recycled_details = _recycled_before_oom()
    return f"{killed}; {recycled}", {**killed_details, **recycled_details}


def _killed_under_load(worker: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    statuses: Counter[int | str] = Counter()  # a status, or the client's error's name when it got none
    lock = threading.Lock()
    stop = threading.Event()

    def load() -> None:
        while not stop.is_set():
            code, body = front(HOST, "/sleep?ms=50", timeout=60)
            with lock:
                statuses[code if code is not None else body.decode(errors="replace").split(":", 1)[0]] += 1

    threads = [threading.Thread(target=load, daemon=True) for _ in range(CLIENTS)]
    for thread in threads:
        thread.start()
    try:
        time.sleep(2.0)
        before = sum(statuses.values())
        killed_at = time.monotonic()
        os.kill(worker["pid"], signal.SIGKILL)
        back = wait_for(lambda: (w := _worker()) is not None and w["pid"] != worker["pid"] and w, 60, 0.1)
        check(back, f"the killed worker was not restarted: {workers(status(), TENANT, APP)}")
        restart = time.monotonic() - killed_at
        time.sleep(2.0)  # served by the restarted one
    finally:
        stop.set()
        for thread in threads:
            thread.join(90)
    say(f"    under a SIGKILL: {dict(statuses)}; restarted in {restart:.2f}s")
    app = leaf(TENANT, APP)
    check(back["pid"] in procs(app) or any(back["pid"] in procs(p) for p in app.rglob("*") if p.is_dir()),
          f"the restarted worker (pid {back['pid']}) is not under {app}")
    # IncompleteRead: the head came, then the connection was cut (the answer had begun on the killed worker)
    failed = {k: v for k, v in statuses.items() if k not in (200, 502, "IncompleteRead")}
    check(not failed, f"answers while the worker restarted: {dict(statuses)}")
    in_flight = statuses[502] + statuses["IncompleteRead"]
    check(in_flight <= CLIENTS, f"more failures than requests in flight at the kill: {dict(statuses)}")
    check(statuses[200] > before, f"nothing served after the restart: {dict(statuses)}")
    return (f"SIGKILL of the only worker of a cpu: 30% tenant under {CLIENTS} clients: {statuses[200]} x 200, "
            f"{statuses[502]} x 502 and {statuses['IncompleteRead']} cut (in flight), 0 x 503; "
            f"restarted in {restart:.2f}s",
            {"killed": {str(k): v for k, v in statuses.items()}, "restart_seconds": round(restart, 2)})


def _recycled_before_oom() -> tuple[str, dict[str, Any]]:
    tenant_cgroup = BASE / "tenants" / TENANT
    kills0 = read_kv(tenant_cgroup / "memory.events").get("oom_kill", 0)
    old = _worker()
    check(old, "no running worker before the leak")
    assert old is not None
    answers: Counter[int | None] = Counter()
    started = time.monotonic()

    # Polled from the admin socket (what `elasticctl pool --json` prints), not by the command: its Python start-up,
    # ~2 s of a guest CPU under TCG at every poll, competed with the replacement starting in its 30 %.
    watch = PoolWatch(TENANT, APP, GROUP)

    def recycled() -> dict[str, Any] | None:
        watch()
        decisions = [d for d in watch.decisions() if d["decision"] == "recycle"]
        now = _worker()
        return {"decision": decisions[-1], "worker": now} if decisions and now and now["pid"] != old["pid"] else None

    done = None
    while time.monotonic() - started < 60 and done is None:
        code, _ = front(HOST, f"/mem?mb={LEAK_MB}", timeout=60)
        answers[code] += 1
        time.sleep(0.5)
        done = recycled()
    # Decided, its replacement may still be starting under the tenant's 30 % of a CPU (TCG, two guests at once):
    # it is waited for, the leak no longer fed. (240 s: on a slow day, every scenario at 1.5-2 times its usual time,
    # neither release's replacement was running 90 s after the decision.)
    done = done or wait_for(recycled, 240, 0.5)
    check(done, f"no recycle within 60 s (and its replacement within 240 s more): answers {dict(answers)}, pool "
          f"{watch.decisions()[-5:]}")
    assert done is not None
    shown = elasticctl_json("pool", f"{TENANT}/{APP}")["groups"][GROUP]["decisions"]
    check(any(d["decision"] == "recycle" for d in shown), f"elasticctl pool --json shows no recycle: {shown[-5:]}")
    gone = wait_for(lambda: not Path(f"/proc/{old['pid']}").exists(), 30, 0.2)
    check(gone, f"the recycled worker (pid {old['pid']}) is still alive")
    kills = read_kv(tenant_cgroup / "memory.events").get("oom_kill", 0)
    check(kills == kills0, f"memory.events oom_kill went {kills0} → {kills}: the kernel killed before the recycle")
    check(set(answers) == {200}, f"answers during the leak: {dict(answers)}")
    took = time.monotonic() - started
    reason = done["decision"]["reason"]
    check("max_rss" in reason, f"the recycle's reason: {reason}")
    return (f"a {LEAK_MB} MiB-per-request leak recycled at max_rss {MAX_RSS_MB}M after {sum(answers.values())} "
            f"requests ({took:.1f}s; pid {old['pid']}→{done['worker']['pid']}), oom_kill {kills0}→{kills} under "
            f"memory.max {MEMORY_MB}M",
            {"recycle": reason, "leak_answers": {str(k): v for k, v in answers.items()}})
