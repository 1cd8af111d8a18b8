"""The pool's shell with stand-ins for the supervisor and the front: what it does when reports arrive."""

from __future__ import annotations

from elasticd.config import App, Config, Group, Pool, Quotas, Resources, Server, Tenant
from elasticd.pool.manager import PoolManager
from elasticd.pool.report import Executor, Report

KEY = ("acme", "shop", "green")


class Worker:
    def __init__(self, n: int) -> None:
        self.id = f"acme.shop.green.{n}"
        self.pid = 1000 + n
        self.routable = True
        self.state = "running"


class Supervisor:
    def __init__(self, n: int) -> None:
        self.workers = [Worker(i) for i in range(1, n + 1)]
        self.retired: list[str] = []

    def workers_of(self, key):
        return list(self.workers)

    def add_worker(self, key):
        worker = Worker(len(self.workers) + 1)
        worker.routable = False
        self.workers.append(worker)
        return worker

    async def retire(self, worker_id):
        self.retired.append(worker_id)
        self.workers = [w for w in self.workers if w.id != worker_id]


class Counters:
    requests = errors = 0
    seconds = 0.0


class Accounting:
    def worker(self, worker_id):
        return Counters()

    def open_by_worker(self):
        return {}


class Surface:
    def __init__(self) -> None:
        self.users: dict[str, str] = {}

    def on(self, worker):
        return []

    def assign(self, user, worker, now):
        self.users[user] = worker


def manager(n: int) -> tuple[PoolManager, Supervisor]:
    pool = Pool(min_workers=1, max_workers=4)
    group = Group(name="green", command=("app",), pool=pool)
    app = App(name="shop", domains=("shop.localhost",), root="/", default_group="green", groups={"green": group})
    config = Config(server=Server(), tenants={"acme": Tenant("acme", Resources(), Quotas(), {"shop": app})})
    supervisor = Supervisor(n)
    m = PoolManager(supervisor, Surface(), Accounting(), interval=1.0)
    m.apply(config)
    return m, supervisor


def idle() -> Report:
    return Report(cpu=0.0, executor=Executor(busy=0, total=8))


async def test_no_compaction_until_every_worker_has_a_full_window():
    m, _ = manager(3)
    # Workers 1 and 2 have full windows; worker 3 was just born (two rows).
    for t in range(6):
        m.on_report("acme.shop.green.1", idle(), float(t))
        m.on_report("acme.shop.green.2", idle(), float(t))
    m.on_report("acme.shop.green.3", idle(), 6.0)
    m.on_report("acme.shop.green.3", idle(), 7.0)
    assert not m.draining
    for t in range(8, 12):
        m.on_report("acme.shop.green.3", idle(), float(t))
    assert len(m.draining) == 1  # the least occupied non-reception worker, now that all were measured
    decisions = m.describe("acme", "shop", lambda w: [])["groups"]["green"]["decision_counts"]
    assert decisions["compaction"] == 1


async def test_a_lone_busy_reception_scales_up_once():
    m, supervisor = manager(1)
    busy = Report(cpu=0.9, executor=Executor(busy=8, total=8))
    for t in range(3):
        m.on_report("acme.shop.green.1", busy, float(t))
    assert len(supervisor.workers) == 2  # one spawn, then the guard holds while it is in flight
    state = m.describe("acme", "shop", lambda w: [])["groups"]["green"]
    assert state["decision_counts"]["scale-up"] == 1
    assert [w["spawning"] for w in state["workers"]] == [False, True]
