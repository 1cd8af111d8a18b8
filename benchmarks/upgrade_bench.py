"""Upgrading elasticd under load, run on demand (not a test): ``.venv/bin/python benchmarks/upgrade_bench.py
[load|idle|all] [rounds]``. A real daemon and real demo workers on a fake cgroup tree (tests/harness.py).

1. **load**: four apps of two workers, logged-in users, four clients (two a connection per request, two a kept-alive
   connection, flat out). The way an upgrade went before issue 32 — the daemon stopped and started (what
   ``dh_installsystemd``'s restart did) — and ``elasticctl upgrade``, ``rounds`` times each, in one run. Counted:
   requests failed, workers restarted (pids before and after), users whose in-process counter went back, the
   accept gap (the report's: the old image stops accepting → the new one accepts), the longest a client waited for
   one answer across the step, and the step's wall time. Goals: 0 failed, 0 restarted, 0 users reset.
2. **hostile**: the same, but tenant a holds long requests in flight (a long poll, or a hostile tenant's handler
   that never answers): one sent before the upgrade; then a storm, a 3 s request every 250 ms, so that one has just
   begun whenever the old image stops accepting; then a flood, one every 100 ms, past its workers' concurrency, so
   that requests wait in its group's queue. Before issue 32's last step the old image waited for them up to the
   grace (``server.stop_timeout``, 5 s here) while no one's new connection was accepted, and cut them; now they are
   carried (awaiting their answer, or not yet sent) and answered by the new image. Counted: the neighbours' (b, c,
   d) failures and longest wait, and what became of a's requests.
3. **idle**: 1,000 apps at ``min_workers: 0`` (idle: no worker) and one app of two workers: ``elasticctl upgrade``'s
   wall time and accept gap, against 10 apps on the same machine (what the apps' count costs a re-exec).
"""

from __future__ import annotations

import http.client
import json
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Final

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

APPS = ("a", "b", "c", "d")


def _app(name: str, root: str, workers: int) -> str:
    return (f"      {name}:\n        domains: [{name}.localhost]\n        root: {root}\n        groups:\n"
            f"          green:\n            command: [\"{{python}}\", \"-m\", \"elasticd.demo\"]\n"
            f"            pool: {{min_workers: {workers}, max_workers: {max(workers, 1)}}}\n")


def _tenants(root: str, apps: dict[str, int]) -> str:
    return "tenants:\n  acme:\n    apps:\n" + "".join(_app(name, root, n) for name, n in apps.items())


class Clients:
    def __init__(self, d, hosts: list[str]) -> None:
        self.d = d
        self.hosts = hosts
        self.stop = threading.Event()
        self.codes: Counter[str] = Counter()
        self.slowest = 0.0
        self.threads = [threading.Thread(target=self._run, args=(host, kept)) for host in hosts
                        for kept in (False, True)]

    def __enter__(self) -> Clients:
        for thread in self.threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(120)

    def _run(self, host: str, kept: bool) -> None:
        conn = None
        while not self.stop.is_set():
            if conn is None:
                conn = http.client.HTTPConnection(self.d.host, self.d.port, timeout=120)
            began = time.monotonic()
            try:
                conn.request("GET", "/", headers={"Host": f"{host}.localhost"})
                response = conn.getresponse()
                response.read()
                self.codes[str(response.status)] += 1
            except (OSError, http.client.HTTPException) as exc:
                self.codes[type(exc).__name__] += 1
                conn.close()
                conn = None
            self.slowest = max(self.slowest, time.monotonic() - began)
            if not kept and conn is not None:
                conn.close()
                conn = None
        if conn is not None:
            conn.close()

    def failed(self) -> int:
        return sum(n for code, n in self.codes.items() if code != "200")


def _pids(d, apps) -> dict[str, int]:
    return {w["id"]: w["pid"] for app in apps for w in d.workers("acme", app, "green") if w["state"] == "running"}


def _wait_running(d, apps, count: int, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while len(_pids(d, apps)) < count:
        assert time.monotonic() < deadline, "the workers never ran"
        time.sleep(0.1)


def _counters(d, users) -> list[int]:
    from harness import browse
    return [json.loads(browse(d, "/counter", cookie, host=f"{app}.localhost")[1])["count"] for app, cookie in users]


def _login(d) -> list[tuple[str, str]]:
    from harness import browse
    users = []
    for app in APPS:
        for i in range(2):
            _, _, cookie = browse(d, "/", host=f"{app}.localhost")
            browse(d, f"/login?name=u{i}", cookie, host=f"{app}.localhost")
            users.append((app, cookie))
    return users


def _restart(d) -> float:
    began = time.monotonic()
    d.restart()
    return time.monotonic() - began


def _upgrade(d) -> tuple[float, dict]:
    began = time.monotonic()
    result = d.ctl("upgrade", "--json")
    assert result.returncode == 0, result.stderr
    return time.monotonic() - began, json.loads(result.stdout)["report"]


def bench_load(rounds: int) -> None:
    from harness import Daemon
    with tempfile.TemporaryDirectory() as tmp:
        d = Daemon(Path(tmp), _tenants(tmp, dict.fromkeys(APPS, 2)), stop_timeout="5s",
                   extra_server="  occupancy_interval: 1s\n")
        try:
            d.start()
            _wait_running(d, APPS, 2 * len(APPS))
            print(f"load: {len(APPS)} apps x 2 workers, {2 * len(APPS)} clients flat out (half kept-alive); "
                  f"{rounds} rounds of each")
            for how in ("stop and start (before)", "elasticctl upgrade"):
                for _ in range(rounds):
                    _wait_running(d, APPS, 2 * len(APPS))
                    users = _login(d)
                    counts = _counters(d, users)
                    pids = _pids(d, APPS)
                    with Clients(d, list(APPS)) as clients:
                        time.sleep(1.0)
                        if how.startswith("stop"):
                            wall, report = _restart(d), {}
                        else:
                            wall, report = _upgrade(d)
                        time.sleep(1.0)
                    _wait_running(d, APPS, 2 * len(APPS))
                    after = _pids(d, APPS)
                    reset = sum(1 for was, now in zip(counts, _counters(d, users), strict=True) if now != was + 1)
                    restarted = sum(1 for wid, pid in pids.items() if after.get(wid) != pid)
                    gap = report.get("accept_gap")
                    print(f"  {how:26} requests {sum(clients.codes.values()):5}, failed {clients.failed():4} "
                          f"({dict(c for c in clients.codes.items() if c[0] != '200')}), workers restarted "
                          f"{restarted}/{len(pids)}, users reset {reset}/{len(users)}, accept gap "
                          f"{'-' if gap is None else f'{gap * 1000:.0f} ms'}, slowest answer {clients.slowest:.2f} s, "
                          f"step {wall:.2f} s")
        finally:
            d.stop()
            d.kill_leftovers()


class Hostile:
    """Tenant a's long requests, by ``shape``: "hold", one of 20 s, sent 1 s before the upgrade; "storm", one of 3 s
    every 250 ms (about 12 in flight, under its two workers' concurrency of 8 each: none waits in line), so that
    whenever the old image stops accepting, one started a moment before is in flight; "flood", one of 3 s every
    100 ms (about 30: its workers saturated, the rest waiting in its group's queue). What became of each is counted:
    200 (answered, by whichever image), or the client's error (cut: its connection closed without an answer)."""

    EVERY: Final = {"hold": 0.1, "storm": 0.25, "flood": 0.1}
    AT_ONCE: Final = {"hold": 1, "storm": 14, "flood": 40}

    def __init__(self, d, shape: str) -> None:
        self.d = d
        self.storm = shape != "hold"
        self.shape = shape
        self.outcomes: Counter[str] = Counter()
        self.stop = threading.Event()
        self.threads: list[threading.Thread] = []
        self.starter = threading.Thread(target=self._start)

    def __enter__(self) -> Hostile:
        self.starter.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        self.starter.join(60)
        for thread in self.threads:
            thread.join(60)

    def _start(self) -> None:
        while not self.stop.is_set():
            self.threads = [t for t in self.threads if t.is_alive()]
            if len(self.threads) < self.AT_ONCE[self.shape] and (self.storm or not self.outcomes):
                thread = threading.Thread(target=self._hold)
                thread.start()
                self.threads.append(thread)
                if not self.storm:
                    return
            time.sleep(self.EVERY[self.shape])

    def _hold(self) -> None:
        conn = http.client.HTTPConnection(self.d.host, self.d.port, timeout=120)
        try:
            conn.request("GET", f"/sleep?ms={3000 if self.storm else 20000}", headers={"Host": "a.localhost"})
            response = conn.getresponse()
            response.read()
            self.outcomes[str(response.status)] += 1
        except (OSError, http.client.HTTPException) as exc:
            self.outcomes[type(exc).__name__] += 1
        finally:
            conn.close()


def bench_hostile(rounds: int) -> None:
    from harness import Daemon
    with tempfile.TemporaryDirectory() as tmp:
        d = Daemon(Path(tmp), _tenants(tmp, dict.fromkeys(APPS, 2)), stop_timeout="5s")
        try:
            d.start()
            _wait_running(d, APPS, 2 * len(APPS))
            for shape, what in (("hold", "holds a 20 s request in flight"),
                                ("storm", "starts a 3 s request every 250 ms"),
                                ("flood", "starts a 3 s request every 100 ms (its workers saturated)")):
                print(f"hostile: tenant a {what}; b, c, d: 6 clients flat out; grace 5 s")
                for _ in range(rounds):
                    with Clients(d, ["b", "c", "d"]) as clients, Hostile(d, shape) as hostile:
                        time.sleep(1.0)
                        wall, report = _upgrade(d)
                        time.sleep(1.0)
                    print(f"  neighbours: requests {sum(clients.codes.values())}, failed {clients.failed()}, slowest "
                          f"answer {clients.slowest:.2f} s; accept gap {report['accept_gap'] * 1000:.0f} ms (waited "
                          f"{report['waited']:.2f} s for requests in flight, cut {report['cut']}, carried in flight "
                          f"{report.get('requests', 0)}); a's requests: {dict(hostile.outcomes)}; step "
                          f"{wall:.2f} s")
        finally:
            d.stop()
            d.kill_leftovers()


def bench_idle(rounds: int) -> None:
    from harness import Daemon
    for count in (10, 1000):
        with tempfile.TemporaryDirectory() as tmp:
            apps = {"live": 2, **{f"idle{i}": 0 for i in range(count)}}
            d = Daemon(Path(tmp), _tenants(tmp, apps), stop_timeout="5s")
            try:
                d.start()
                _wait_running(d, ["live"], 2)
                walls, gaps, ends = [], [], []
                for _ in range(rounds):
                    wall, report = _upgrade(d)
                    ends.append(wall)
                    walls.append(report["wall"])
                    gaps.append(report["accept_gap"])
                print(f"idle: {count:5} idle apps + 1 of 2 workers: re-exec wall (the report's) min "
                      f"{min(walls):.2f} s / median {sorted(walls)[len(walls) // 2]:.2f} s, accept gap min "
                      f"{min(gaps) * 1000:.0f} ms / median {sorted(gaps)[len(gaps) // 2] * 1000:.0f} ms; "
                      f"elasticctl upgrade end to end median {sorted(ends)[len(ends) // 2]:.2f} s")
            finally:
                d.stop()
                d.kill_leftovers()


def main() -> None:
    what = sys.argv[1] if len(sys.argv) > 1 else "all"
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 3
    if what in ("load", "all"):
        bench_load(rounds)
    if what in ("hostile", "all"):
        bench_hostile(rounds)
    if what in ("idle", "all"):
        bench_idle(rounds)


if __name__ == "__main__":
    main()
