"""The elastic pool's costs, run on demand (not a test): ``.venv/bin/python benchmarks/pool_bench.py``.

1. the combined decision at a login — placement + admission + the cgroup budget (the tenant's recent samples →
   CPU wall and holds) + the scale-up check — for a 16-worker group with full windows (goal: under 50 µs);
2. archiving and evaluating one report (the budget, the ledger and scale-up checks included);
3. the reaction time from a load step to a new routable worker, with a real daemon and real demo workers
   (goal: one occupancy_interval plus the worker's own start time).
"""

from __future__ import annotations

import http.client
import json
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from collections import deque

from elasticd.accounting.parse import Pressure
from elasticd.accounting.sample import Sample
from elasticd.config.model import PoolSettings, Resources
from elasticd.pool.budget import Budget, budget_of
from elasticd.pool.evaluator import METRICS_WINDOW
from elasticd.pool.manager import PoolManager
from elasticd.pool.report import Executor, Report

KEY = ("acme", "shop", "green")


class _Worker:
    def __init__(self, n: int) -> None:
        self.id = f"acme.shop.green.{n}"
        self.pid = 1000 + n
        self.routable = True
        self.state = "running"


class _Supervisor:
    def __init__(self, n: int) -> None:
        self.workers = [_Worker(i) for i in range(1, n + 1)]

    def workers_of(self, key: Any) -> list[_Worker]:
        return self.workers

    def counted(self, key: Any) -> int:
        return len(self.workers)

    held = counted  # (the name before issue 30: the same script measures a checkout from before it)

    def add_worker(self, key: Any) -> _Worker:
        raise AssertionError("the benchmark's group must not grow")


class _Counters:
    requests = 100
    errors = 0
    seconds = 1.0
    answered = 100


class _Accounting:
    def worker(self, worker_id: str) -> _Counters:
        return _Counters()

    def open_by_worker(self) -> dict[str, int]:
        return {}

    def oldest_open_by_worker(self) -> dict[str, float]:
        return {}


class _Surface:
    def on(self, worker: str) -> list:
        return []

    def assign(self, user: str, worker: str, now: float) -> None:
        pass


def _manager(n: int) -> PoolManager:
    from elasticd.config.model import App, Config, Group, Quotas, Server, Tenant
    pool = PoolSettings(min_workers=n, max_workers=n, memory_limit=512 * 1024**2)
    group = Group(name="green", command=("app",), pool=pool)
    app = App(name="shop", domains=("shop.localhost",), root="/", default_group="green", groups={"green": group})
    config = Config(server=Server(), tenants={"acme": Tenant("acme", Resources(), Quotas(), {"shop": app})})
    # The tenant's cgroup as the sampler keeps it: 13 samples (one smoothing window at a 5 s tick), 8 cores of
    # cpu.max, 6 of them in use, memory and pids well under their limits: nothing binds, every number is read.
    history = deque((Sample(5.0 * i, cpu_usage_usec=int(6e6 * 5 * i), cpu_periods=50 * i,
                            cpu_throttled_periods=i, memory_bytes=3 << 30, memory_events={"max": 0, "oom_kill": 0},
                            pids=300, cpu_pressure=Pressure(0, 1.5), memory_pressure=Pressure(0, 0.0),
                            io_pressure=Pressure(0, 0.2)) for i in range(13)), maxlen=13)
    resources = Resources(cpu=800.0, memory=16 << 30, pids=4096)

    def budget(tenant: str, app: str) -> Budget:
        return budget_of(history, resources, app_samples=history)  # the app leaf read as the tenant is

    manager = PoolManager(_Supervisor(n), _Surface(), _Accounting(), interval=5.0, budget=budget)
    manager.apply(config)
    return manager


def _report(i: int, w: int) -> Report:
    # The reception busy (over its keep threshold: every login is passed), the others moderately loaded.
    cpu = 0.7 if w == 1 else 0.2 + 0.03 * w
    return Report(cpu=cpu, rss=200 * 1024**2, executor=Executor(busy=w % 4, total=8))


def bench_decisions(n: int = 16, rounds: int = 20000) -> None:
    manager = _manager(n)
    for i in range(METRICS_WINDOW):
        for w in range(1, n + 1):
            manager.on_report(f"acme.shop.green.{w}", _report(i, w), float(i))
    start = time.perf_counter()
    for r in range(rounds):
        manager.on_login(KEY, f"user{r}")
    per_login = (time.perf_counter() - start) / rounds
    start = time.perf_counter()
    for r in range(rounds):
        manager.on_report(f"acme.shop.green.{r % n + 1}", _report(r, r % n + 1), 100.0 + r)
    per_report = (time.perf_counter() - start) / rounds
    start = time.perf_counter()
    budget = manager._budget
    for _ in range(rounds):
        budget("acme", "shop")
    per_budget = (time.perf_counter() - start) / rounds
    print(f"placement + admission + budget + scale-up check, {n} workers with full windows ({METRICS_WINDOW} "
          f"rows): {per_login * 1e6:.1f} µs per login (goal < 50 µs; the budget alone {per_budget * 1e6:.1f} µs)")
    print(f"archive + evaluate one report (budget, scale-up and ledger checks included): {per_report * 1e6:.1f} µs")


def _get(port: int, path: str) -> None:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        conn.request("GET", path, headers={"Host": "shop.localhost"})
        conn.getresponse().read()
    finally:
        conn.close()


def bench_reaction(interval: float = 1.0) -> None:
    from harness import Daemon  # tests/harness.py: a real elasticd on a fake cgroup tree

    with tempfile.TemporaryDirectory() as tmp:
        d = Daemon(Path(tmp), f"""\
            tenants:
              acme:
                apps:
                  shop:
                    domains: [shop.localhost]
                    root: {tmp}
                    groups:
                      green:
                        command: ["{{python}}", "-m", "elasticd.demo"]
                        pool: {{min_workers: 1, max_workers: 2}}
            """, extra_server=f"  occupancy_interval: {int(interval * 1000)}ms\n")
        d.start()
        try:
            stop = threading.Event()

            def load() -> None:
                while not stop.is_set():
                    _get(d.port, "/cpu?ms=100")

            # An idle worker with a full smoothing window of idle reports: the step has to outweigh them.
            time.sleep(8 * interval)
            step = time.monotonic()
            threads = [threading.Thread(target=load, daemon=True) for _ in range(2)]
            for t in threads:
                t.start()
            routable = None
            while time.monotonic() - step < 60:
                data = json.loads(d.ctl("pool", "acme/shop", "--json").stdout)
                running = [w for w in data["groups"]["green"]["workers"] if w["state"] == "running"]
                if len(running) >= 2:
                    routable = time.monotonic() - step
                    break
                time.sleep(0.05)
            stop.set()
            for t in threads:
                t.join()
            if routable is None:
                print("reaction: no second worker within 60 s")
            else:
                print(f"reaction, load step on an idle worker → second routable worker: {routable:.2f} s "
                      f"(occupancy_interval {interval:g} s; occupancy averages the last 6 reports, so a full "
                      f"step reads over reception_threshold 0.5 only after about 3 of them)")
        finally:
            d.stop()
            d.kill_leftovers()


if __name__ == "__main__":
    bench_decisions()
    bench_reaction()
