"""The pool meets the kernel, through the real daemon and real demo workers on a fake cgroup tree: a handler
busy for ten intervals is never called hung while a SIGSTOPped worker is; counters written into the tenant's
cpu.stat at its quota hold a scale-up that happens once they show headroom; a WebSocket held open keeps its
worker through a compaction until it closes."""

from __future__ import annotations

import asyncio
import os
import signal
import threading
import time
import urllib.request

import aiohttp
import psutil
from harness import browse

from elasticd.accounting.fake import FakeCgroup, write_fake_cgroup

GROUP = """\
tenants:
  acme:
    resources: {{cpu: {cpu}}}
    apps:
      shop:
        domains: [shop.localhost]
        root: {root}
        groups:
          green:
            command: ["{{python}}", "-m", "elasticd.demo"]
            concurrency: 4
            pool: {pool}
"""
FAST = "  occupancy_interval: 200ms\n  sample_interval: 200ms\n  hung_after: 600ms\n"
KEY = "acme.shop.green"


def _running(group: dict) -> dict[str, int]:
    return {w["id"]: w["pid"] for w in group["workers"] if w["state"] == "running"}


def _metric(d, name: str, **labels: str) -> float | None:
    with urllib.request.urlopen(f"http://127.0.0.1:{d.metrics_port}/metrics", timeout=10) as response:
        page = response.read().decode()
    for line in page.splitlines():
        if (line.startswith(name + "{") or (not labels and line.startswith(name + " "))) \
                and all(f'{k}="{v}"' in line for k, v in labels.items()):
            return float(line.rsplit(" ", 1)[1])
    return None


def test_a_busy_handler_is_never_hung_a_stopped_worker_is(daemons, tmp_path):
    d = daemons(GROUP.format(cpu="max", root=tmp_path, pool="{min_workers: 2, max_workers: 2}"), extra_server=FAST)
    d.start()
    before = _running(d.wait_pool(lambda g: len(_running(g)) == 2, 30, "two workers"))
    assert _metric(d, "elasticd_group_workers", tenant="acme", app="shop", group="green", state="running") == 2
    assert _metric(d, "elasticd_sampler_last_success_timestamp_seconds") > time.time() - 30
    busy_pid, stopped_pid = before[f"{KEY}.1"], before[f"{KEY}.2"]
    answer: dict[str, tuple[int, str, str | None]] = {}
    # 2 s of CPU inside the handler: ten occupancy intervals with the worker's event loop held.
    burner = threading.Thread(target=lambda: answer.update(r=browse(d, "/cpu?ms=2000")))
    burner.start()
    os.kill(stopped_pid, signal.SIGSTOP)
    try:
        replaced = d.wait_pool(lambda g: len(_running(g)) == 2 and stopped_pid not in _running(g).values(), 15,
                         "the stopped worker replaced")
    finally:
        burner.join(30)
    assert answer["r"][0] == 200, answer  # the busy one answered: it was never killed
    hung = [x for x in replaced["decisions"] if x["decision"] == "hung"]
    assert [x["worker"] for x in hung] == [f"{KEY}.2"], hung
    assert hung[0]["numbers"]["pid"] == stopped_pid and hung[0]["numbers"]["no_progress_seconds"] >= 0.6
    assert "no report" in hung[0]["reason"]
    time.sleep(1.0)
    after = _running(d.pool())
    assert after[f"{KEY}.1"] == busy_pid  # the same process: busy is not hung
    assert not psutil.pid_exists(stopped_pid) or psutil.Process(stopped_pid).status() == psutil.STATUS_ZOMBIE
    assert "is hung" in d.log_text()


class CpuCounters:
    """Writes the fake tenant's cpu.stat as the kernel would: usage at ``cores``, throttled in ``share`` of the
    100 ms periods (a thread, every 10 ms, until stopped: the sampler reads a rate over 400 ms here)."""

    def __init__(self, directory, cores: float, share: float) -> None:
        self.directory, self.cores, self.share = directory, cores, share
        self.stop = threading.Event()
        self.usage = self.periods = self.throttled = 0.0
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        last = time.monotonic()
        while not self.stop.wait(0.01):
            now = time.monotonic()
            dt, last = now - last, now
            self.usage += self.cores * dt * 1e6
            self.periods += dt * 10
            self.throttled += self.share * dt * 10
            write_fake_cgroup(self.directory, FakeCgroup(usage_usec=int(self.usage), nr_periods=int(self.periods),
                                                         nr_throttled=int(self.throttled)), only=("cpu.stat",))


def test_a_tenant_at_its_cpu_max_holds_the_scale_up_until_the_counters_show_headroom(daemons, tmp_path):
    # Sampled every 500 ms: the budget's rate spans 1 s, so the writer thread's scheduling on a loaded test
    # machine moves it by a few percent only.
    d = daemons(GROUP.format(cpu="50%", root=tmp_path, pool="{min_workers: 1, max_workers: 3}"),
                extra_server=FAST.replace("sample_interval: 200ms", "sample_interval: 500ms"))
    counters = CpuCounters(d.cgroup / "tenants" / "acme", cores=0.5, share=1.0)  # there from the first sample
    d.start()
    stop = threading.Event()
    _, _, cookie = browse(d, "/")

    def burn() -> None:
        deadline = time.monotonic() + 40
        while not stop.is_set() and time.monotonic() < deadline:
            browse(d, "/cpu?ms=150", cookie)

    load = threading.Thread(target=burn)
    load.start()
    try:
        held = d.wait_pool(lambda g: g["held"] is not None, 20, "the scale-up held by the tenant's cpu.max")
        assert held["held"]["resources"] == ["cpu"] and held["cpu_wall"] == 0.5
        limits = held["held"]["limits"]["cpu"]
        assert limits["quota_cores"] == 0.5 and 0.8 <= limits["usage_share"] <= 1.3, limits
        assert held["decision_counts"].get("held") == 1 and "scale-up" not in held["decision_counts"]
        assert _metric(d, "elasticd_group_limit_bound", group="green", resource="cpu") == 1.0
        assert _metric(d, "elasticd_pool_decisions_total", tenant="acme", app="shop", group="green",
                       decision="held") >= 1.0
        text = d.ctl("pool", "acme/shop")
        assert text.returncode == 0 and "HELD by the tenant's cpu limit" in text.stdout, text.stdout
        time.sleep(1.5)
        still = d.pool()
        assert len(still["workers"]) == 1 and "scale-up" not in still["decision_counts"], still["decision_counts"]
        counters.cores, counters.share = 0.05, 0.0  # the tenant has room again
        grown = d.wait_pool(lambda g: len(g["workers"]) >= 2, 20, "the same load grows the group")
        assert grown["decision_counts"].get("scale-up", 0) >= 1
        assert d.wait_pool(lambda g: g["held"] is None, 5, "no longer held")["held"] is None
        assert _metric(d, "elasticd_group_limit_bound", group="green", resource="cpu") == 0.0
    finally:
        stop.set()
        load.join(60)
        counters.stop.set()


def test_a_websocket_keeps_its_worker_through_a_compaction(daemons, tmp_path):
    passing = "{min_workers: 2, max_workers: 3, reception_threshold: 0.0}"  # every login goes to worker 2
    d = daemons(GROUP.format(cpu="max", root=tmp_path, pool=passing), extra_server=FAST)
    d.start()
    d.wait_pool(lambda g: len(_running(g)) == 2, 30, "two workers")
    _, _, cookie = browse(d, "/")
    code, _, _ = browse(d, "/login?name=alice", cookie)
    assert code == 200
    assert f"worker {KEY}.2 " in browse(d, "/", cookie)[1]  # placed on worker 2 at its login

    async def scenario() -> list[str]:
        seen = []
        async with aiohttp.ClientSession() as session, session.ws_connect(
                f"http://127.0.0.1:{d.port}/ws", headers={"Host": "shop.localhost",
                                                          "Cookie": f"elastic_uid={cookie}"}) as ws:
            await ws.send_str("hello")
            seen.append((await ws.receive(timeout=10)).data)
            # The ledger now compacts: H = 1.3 less the tunnel's executor slot (0.25), over 0.8; worker 2, the
            # only candidate, drains.
            d.write_config(GROUP.format(cpu="max", root=tmp_path,
                                        pool="{min_workers: 1, max_workers: 3, compaction_margin: 1.0}"))
            await asyncio.to_thread(d.reload)
            await asyncio.to_thread(d.wait_pool, lambda g: any(w["draining"] for w in g["workers"]), 15,
                                    "worker 2 draining")
            for i in range(6):  # the tunnel stays up while its worker drains
                await asyncio.sleep(0.5)
                await ws.send_str(f"still {i}")
                seen.append((await ws.receive(timeout=10)).data)
            group = await asyncio.to_thread(d.pool)
            assert f"{KEY}.2" in _running(group) and group["decision_counts"].get("retire") is None, group
            assert group["decision_counts"].get("move") is None, group  # alice is not moved while it is open
        return seen

    seen = asyncio.run(scenario())
    closed = time.time()
    assert seen == [f"{KEY}.2: hello", *(f"{KEY}.2: still {i}" for i in range(6))]
    retired = d.wait_pool(lambda g: len(g["workers"]) == 1, 15, "worker 2 retired once its tunnel closed")
    retire = next(x for x in retired["decisions"] if x["decision"] == "retire")
    assert retire["worker"] == f"{KEY}.2" and retire["reason"] == "drained: nothing open on it"
    move = next(x for x in retired["decisions"] if x["decision"] == "move")  # alice, once its tunnel closed
    assert move["worker"] == f"{KEY}.2" and move["at"] >= closed - 0.5, (move, closed)
    assert f"worker {KEY}.1 " in browse(d, "/", cookie)[1]  # alice was moved to the survivor
