"""The pool under bursts and failures, run on demand (not a test): ``.venv/bin/python benchmarks/burst_bench.py
[step|soak|all] [soak seconds]``. A real daemon and real demo workers on a fake cgroup tree (tests/harness.py).

1. **step**: a load step (8 clients at once, each a request of 300 ms at a time) on an idle group of concurrency 4
   → a second routable worker, at occupancy_interval 1 s, 2 s and 5 s; beside it, the worker's own start (its
   spawn to routable, from the journal). Goal: the reaction within the start + 0.5 s, at any interval.
2. **soak**: three apps under steady load (two clients each) while app a's only worker is SIGKILLed every 15 s
   (under the crash-loop rule: five deaths within 60 s mark a worker failed, and a failed group answers 503),
   app b's is SIGSTOPped for 1 s every 10 s, and every 20 s a reload removes app c and the next adds it back.
   Counted: every answer by status; a 502 can only be a request that was on a killed worker when it died; 404s
   are app c's while it is removed (the right answer). Goal: no 503 and no 502 beyond the killed requests.
"""

from __future__ import annotations

import http.client
import json
import os
import signal
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

GROUP = """\
          green:
            command: ["{{python}}", "-m", "elasticd.demo"]
            concurrency: 4
            pool: {{min_workers: 1, max_workers: {max_workers}}}
"""


def _app(name: str, root: str, max_workers: int = 1) -> str:
    return (f"      {name}:\n        domains: [{name}.localhost]\n        root: {root}\n        groups:\n"
            + GROUP.format(max_workers=max_workers))


def _tenants(root: str, apps: list[str], max_workers: int = 1) -> str:
    return "tenants:\n  acme:\n    apps:\n" + "".join(_app(name, root, max_workers) for name in apps)


ERRORS: Counter[str] = Counter()  # what a -1 was: the client's own error, by kind


def _get(port: int, host: str, path: str) -> int:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=90)
    try:
        conn.request("GET", path, headers={"Host": host})
        response = conn.getresponse()
        response.read()
        return response.status
    except (OSError, http.client.HTTPException) as exc:
        ERRORS[type(exc).__name__] += 1
        return -1
    finally:
        conn.close()


def _pool(d, app: str) -> dict:
    return json.loads(d.ctl("pool", f"acme/{app}", "--json").stdout)["groups"]["green"]


def bench_step(interval: float) -> None:
    from harness import Daemon

    with tempfile.TemporaryDirectory() as tmp:
        d = Daemon(Path(tmp), _tenants(tmp, ["shop"], max_workers=2),
                   extra_server=f"  occupancy_interval: {int(interval * 1000)}ms\n  sample_interval: 500ms\n")
        d.start()
        try:
            time.sleep(max(2.0, 3 * interval))  # idle, the tenant's cgroup read (a scale-up is never blind)
            stop = threading.Event()

            def load() -> None:
                while not stop.is_set():
                    _get(d.port, "shop.localhost", "/sleep?ms=300")

            step = time.monotonic()
            wall_step = time.time()
            threads = [threading.Thread(target=load, daemon=True) for _ in range(8)]
            for t in threads:
                t.start()
            routable = None
            while time.monotonic() - step < 60:
                pool = _pool(d, "shop")
                if sum(1 for w in pool["workers"] if w["state"] == "running") >= 2:
                    routable = time.monotonic() - step
                    break
                time.sleep(0.02)
            stop.set()
            for t in threads:
                t.join()
            if routable is None:
                print(f"step at occupancy_interval {interval:g}s: no second worker within 60 s")
                return
            up = next(x for x in pool["decisions"] if x["decision"] == "scale-up")
            decided = up["at"] - wall_step
            print(f"step at occupancy_interval {interval:g}s: second worker routable {routable:.2f}s after the step; "
                  f"decided at {decided:.2f}s ({up['reason']}), its own start {routable - decided:.2f}s")
        finally:
            d.stop()
            d.kill_leftovers()


def bench_soak(seconds: float) -> None:
    from harness import Daemon

    with tempfile.TemporaryDirectory() as tmp:
        apps = ["a", "b", "c"]
        d = Daemon(Path(tmp), _tenants(tmp, apps), extra_server="  occupancy_interval: 500ms\n  hung_after: 5s\n")
        d.start()
        statuses: dict[str, Counter[int]] = {app: Counter() for app in apps}
        lock = threading.Lock()
        stop = threading.Event()

        def load(app: str) -> None:
            while not stop.is_set():
                status = _get(d.port, f"{app}.localhost", "/sleep?ms=10")
                with lock:
                    statuses[app][status] += 1

        threads = [threading.Thread(target=load, args=(app,), daemon=True) for app in apps for _ in range(2)]
        for t in threads:
            t.start()
        kills = stops = reloads = 0
        started = time.monotonic()
        try:
            tick = 0
            while time.monotonic() - started < seconds:
                time.sleep(1.0)
                tick += 1
                if tick % 15 == 0:
                    found = [w for w in _pool(d, "a")["workers"] if w["state"] == "running"]
                    if len(found) != 1:
                        print(f"  app a's workers at {tick}s: {[(w['id'], w['pid'], w['state']) for w in found]}")
                    worker = found[0] if found else None
                    if worker is not None:
                        os.kill(worker["pid"], signal.SIGKILL)
                        kills += 1
                if tick % 10 == 0:
                    found = [w for w in _pool(d, "b")["workers"] if w["state"] == "running"]
                    worker = found[0] if found else None
                    if worker is not None:
                        os.kill(worker["pid"], signal.SIGSTOP)
                        time.sleep(1.0)
                        os.kill(worker["pid"], signal.SIGCONT)
                        stops += 1
                if tick % 20 == 0:
                    present = (tick // 20) % 2 == 0
                    d.write_config(_tenants(tmp, apps if present else ["a", "b"]))
                    d.reload()
                    reloads += 1
        finally:
            stop.set()
            for t in threads:
                t.join(30)
            d.stop()
            d.kill_leftovers()
        total = sum(sum(c.values()) for c in statuses.values())
        print(f"soak {seconds:g}s: {total} requests, {kills} SIGKILLs of app a's only worker, {stops} SIGSTOPs "
              f"of app b's (1 s each), {reloads} reloads removing or adding app c")
        for app in apps:
            print(f"  app {app}: {dict(sorted(statuses[app].items()))}")
        failed = sum(count for c in statuses.values() for status, count in c.items() if status >= 500 or status < 0)
        refused = sum(c[503] for c in statuses.values())
        if ERRORS:
            print(f"  the clients' own errors (-1): {dict(ERRORS)}")
        print(f"  failed answers: {failed} (503: {refused}; 502 only where a request was on a killed worker: at "
              f"most {kills * 2}, two clients)")


if __name__ == "__main__":
    what = sys.argv[1] if len(sys.argv) > 1 else "all"
    if what in ("step", "all"):
        for interval in (1.0, 2.0, 5.0):
            bench_step(interval)
    if what in ("soak", "all"):
        bench_soak(float(sys.argv[2]) if len(sys.argv) > 2 else 60.0)
