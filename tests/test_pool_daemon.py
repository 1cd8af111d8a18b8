"""The elastic pool through the real daemon and real demo workers: load grows a group to max_workers,
logins over the reception's threshold are passed on, the pool compacts back when the load stops with every
user still served, a sensor-less group scales too, and forged channel peers are refused."""

from __future__ import annotations

import json
import socket
import threading
import time
from pathlib import Path

import pytest
from harness import browse

TENANTS = """\
tenants:
  acme:
    apps:
      shop:
        domains: [shop.localhost]
        root: {root}
        groups:
          green:
            command: ["{{python}}", "-m", "elasticd.demo"]
            env: {{DEMO_SENSORLESS: "{sensorless}"}}
            concurrency: 4
            pool: {{min_workers: 1, max_workers: {max_workers}, reception_threshold: 0.5,
                    admission_threshold: 0.8, compaction_margin: 1.5}}
"""
SERVER = "  occupancy_interval: 200ms\n"


def _running(group) -> int:
    return sum(1 for w in group["workers"] if w["state"] == "running")


class Users:
    """Logged-in users keeping one request in flight each (``/sleep``: a slot of the worker's executor, a
    measure a loaded test machine does not bend the way it bends CPU readings) on whatever worker the front
    sends them to. They arrive over time: placement happens once, at a login, so load spreads onto new workers
    through the users who log in after them."""

    def __init__(self, d, n: int, first: int = 1, every: float = 2.0) -> None:
        self.d = d
        self.stop = threading.Event()
        self.cookies: list[str] = []
        self.threads: list[threading.Thread] = []
        self.n, self.every = n, every
        for _ in range(first):
            self._arrive()
        self.arrivals = threading.Thread(target=self._arrive_all, daemon=True)
        self.arrivals.start()

    def _arrive(self) -> None:
        i = len(self.cookies)
        code, _, uid = browse(self.d, "/")
        assert code == 200 and uid
        assert browse(self.d, f"/login?name=u{i}", uid)[0] == 200
        self.cookies.append(uid)
        thread = threading.Thread(target=self._burn, args=(i,), daemon=True)
        self.threads.append(thread)
        thread.start()

    def _arrive_all(self) -> None:
        while len(self.cookies) < self.n and not self.stop.wait(self.every):
            try:
                self._arrive()
            except (OSError, AssertionError):  # a slow answer on a loaded machine: the next one arrives anyway
                continue

    def _burn(self, i: int) -> None:
        deadline = time.monotonic() + 60
        while not self.stop.is_set() and time.monotonic() < deadline:
            try:
                browse(self.d, "/sleep?ms=150", self.cookies[i])
            except OSError:  # a slow answer on a loaded machine is load all the same; assertions are below
                continue

    def halt(self) -> None:
        self.stop.set()
        self.arrivals.join(30)
        for t in self.threads:
            t.join(30)


@pytest.mark.parametrize("sensorless", ["0", "1"], ids=["library", "sensorless"])
def test_load_grows_the_pool_and_it_compacts_back(daemons, tmp_path, sensorless):
    d = daemons(TENANTS.format(root=tmp_path, sensorless=sensorless, max_workers=3), extra_server=SERVER)
    d.start()
    assert _running(d.pool()) == 1
    # One a second, each holding one of a worker's 4 slots: the reception keeps those who come while it is alone
    # (a group of one always keeps), worker 2 is full at 4, then worker 3 gets the rest.
    users = Users(d, 12, every=1.0)
    try:
        grown = d.wait_pool(lambda g: _running(g) == 3, 90, "grow to max_workers")
        assert grown["decision_counts"]["scale-up"] >= 2
        if sensorless == "0":
            assert all(w["announced"] for w in grown["workers"] if w["state"] == "running")
            counts = grown["decision_counts"]  # the last decisions are mostly logins: count over all of them
            # Users spread past the reception: logins over its threshold passed on to other workers (pass, then
            # admit or fallback), or new users who found it at its concurrency born where there was room (the
            # group's queue places a cookieless request on any worker with a free slot).
            passed = counts.get("pass", 0) >= 1 and counts.get("admit", 0) + counts.get("fallback", 0) >= 1
            elsewhere = [w["id"] for w in grown["workers"] if not w["reception"] and w["sticky_users"]]
            assert passed or elsewhere, grown
        else:
            assert not any(w["announced"] for w in grown["workers"])
        time.sleep(1.0)
        assert len(d.pool()["workers"]) <= 3  # max_workers holds
    finally:
        users.halt()
    # Each user counts once in its worker's process before the compaction (which waits for a quiet window).
    before = {cookie: json.loads(browse(d, "/counter", cookie)[1]) for cookie in users.cookies}
    shrunk = d.wait_pool(lambda g: len(g["workers"]) == 1, 90, "compact back to min_workers")
    counts = shrunk["decision_counts"]
    assert counts["compaction"] >= 2 and counts["retire"] >= 2
    compaction = next(x for x in shrunk["decisions"] if x["decision"] == "compaction")
    assert {"C", "O", "H", "trigger"} <= set(compaction["numbers"])
    moved = {c for c, b in before.items() if b["worker"] != shrunk["workers"][0]["id"]}
    for cookie in users.cookies:  # every user still served after its worker was compacted away
        code, body, _ = browse(d, "/counter", cookie)
        assert code == 200 and json.loads(body)["worker"].startswith("acme.shop.green.")
        if sensorless == "0":  # moved with its state by the library: its count goes on
            assert json.loads(body)["count"] == before[cookie]["count"] + 1, (before[cookie], body)
    if sensorless == "0" and moved:
        assert counts.get("move", 0) >= len(moved) and not counts.get("move-aborted")


def test_forged_channel_peers_are_refused(daemons, tmp_path):
    d = daemons(TENANTS.format(root=tmp_path, sensorless="0", max_workers=2), extra_server=SERVER)
    d.start()
    [worker] = [w for w in d.pool()["workers"]]
    environ = Path(f"/proc/{worker['pid']}/environ").read_bytes().split(b"\0")
    env = dict(item.decode().split("=", 1) for item in environ if b"=" in item)
    channel = env["ELASTIC_CHANNEL"].removeprefix("unix:")

    def announce(worker_id: str, token: str) -> dict:
        with socket.socket(socket.AF_UNIX) as s:
            s.settimeout(10)
            s.connect(channel)
            s.sendall(json.dumps({"type": "announce", "worker": worker_id, "token": token}).encode() + b"\n")
            return json.loads(s.makefile().readline())

    # The right token, from a process outside the worker's tree: a report for another worker is refused.
    stolen = announce(worker["id"], env["ELASTIC_TOKEN"])
    assert stolen["type"] == "error" and "not in the process tree" in stolen["reason"]
    wrong = announce(worker["id"], "0" * 32)
    assert wrong["type"] == "error" and "wrong token" in wrong["reason"]
    assert "refused a peer" in d.log_text()
    assert d.pool()["workers"][0]["state"] == "running"  # the daemon and the worker go on
