"""The pool's shell with stand-ins for the supervisor and the front: what it does when reports arrive, when a
login comes, when the tenant's cgroup binds, when a worker is silent, and when a drained worker holds a tunnel."""

from __future__ import annotations

import asyncio

from elasticd.config.model import App, Config, Group, PoolSettings, Quotas, Resources, Server, Tenant
from elasticd.pool.budget import UNLIMITED, Budget, CgroupReading
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
        self.replaced: list[str] = []
        self.elsewhere = 0  # workers held for the group outside its list (starting, draining, replaced)

    def workers_of(self, key):
        return list(self.workers)

    def counted(self, key):
        return len(self.workers) + self.elsewhere

    def launching(self, key):
        return False

    def add_worker(self, key):
        worker = Worker(len(self.workers) + len(self.retired) + 1)
        worker.routable, worker.state = False, "starting"
        self.workers.append(worker)
        return worker

    async def retire(self, worker_id):
        self.retired.append(worker_id)
        self.workers = [w for w in self.workers if w.id != worker_id]

    async def replace_worker(self, worker_id):
        self.replaced.append(worker_id)


class Counters:
    def __init__(self) -> None:
        self.requests = self.errors = self.answered = 0
        self.seconds = 0.0


class ForwardCounters:
    def __init__(self) -> None:
        self.counters: dict[str, Counters] = {}
        self.open: dict[str, int] = {}
        self.oldest: dict[str, float] = {}

    def worker(self, worker_id):
        return self.counters.setdefault(worker_id, Counters())

    def open_by_worker(self):
        return dict(self.open)

    def oldest_open_by_worker(self):
        return dict(self.oldest)


class User:
    def __init__(self, worker: str, login: str | None) -> None:
        self.worker, self.login, self.seconds = worker, login, 0.0
        self.pinned = False


class Surface:
    def __init__(self) -> None:
        self.users: dict[str, User] = {}

    def on(self, worker):
        return [(u, rec) for u, rec in self.users.items() if rec.worker == worker]

    def count_by_group(self):
        counts: dict[tuple[str, str], int] = {}
        for rec in self.users.values():
            key = ("acme/shop", rec.worker.split(".")[2] if rec.worker else "")
            counts[key] = counts.get(key, 0) + 1
        return counts

    def assign(self, user, worker, now):
        self.users.setdefault(user, User(worker, None)).worker = worker
        self.users[user].pinned = False

    def pin(self, user, pinned=True):
        if user in self.users:
            self.users[user].pinned = pinned


def manager(n: int, *, pool: PoolSettings | None = None, budget=None, tunnels=None, tree_cpu=None, resources=None,
            hung_after: float = 3.0) -> tuple[PoolManager, Supervisor]:
    pool = pool or PoolSettings(min_workers=1, max_workers=4)
    group = Group(name="green", command=("app",), pool=pool)
    app = App(name="shop", domains=("shop.localhost",), root="/", default_group="green", groups={"green": group})
    config = Config(server=Server(occupancy_interval=1.0, hung_after=hung_after),
                    tenants={"acme": Tenant("acme", resources or Resources(), Quotas(), {"shop": app})})
    supervisor = Supervisor(n)
    m = PoolManager(supervisor, Surface(), ForwardCounters(), interval=1.0, budget=budget, tunnels=tunnels,
                    tree_cpu=tree_cpu or (lambda pid: 0.0))
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


def busy() -> Report:
    return Report(cpu=0.5, executor=Executor(busy=2, total=8))


def cpu_bound(quota: float, used: float) -> Budget:
    throttled = 0.9 if used >= 0.9 * quota else 0.0
    return Budget(quota, None, None, CgroupReading(10.0, used, throttled, None, {}, None, {}))


async def test_a_scale_up_the_tenants_cpu_max_would_starve_is_held_once_then_made_when_the_limit_rises():
    budget = {"now": cpu_bound(0.5, 0.5)}
    m, supervisor = manager(1, budget=lambda tenant, app: budget["now"])
    for t in range(8):
        m.on_report("acme.shop.green.1", busy(), float(t))  # 0.5 core against a 0.5-core wall: saturated
    state = m.describe("acme", "shop", lambda w: [])["groups"]["green"]
    assert len(supervisor.workers) == 1
    assert state["decision_counts"] == {"held": 1}  # one journal entry per hold, not one per report
    assert state["held"]["resources"] == ["cpu"] and state["cpu_wall"] == 0.5
    assert m.limits_bound() == {("acme", "shop", "green"): frozenset({"cpu"})}
    held = next(d for d in state["decisions"] if d["decision"] == "held")
    assert held["numbers"]["limits"]["cpu"]["usage_share"] == 1.0
    budget["now"] = cpu_bound(2.0, 0.5)  # elasticctl limit acme --cpu 200%
    busier = Report(cpu=1.0, executor=Executor(busy=4, total=8))
    for t in range(8, 14):
        m.on_report("acme.shop.green.1", busier, float(t))
    assert len(supervisor.workers) == 2
    assert m.limits_bound() == {("acme", "shop", "green"): frozenset()}
    assert m.describe("acme", "shop", lambda w: [])["groups"]["green"]["cpu_wall"] == 1.0


async def test_max_workers_counts_every_worker_the_supervisor_holds():
    m, supervisor = manager(2, pool=PoolSettings(min_workers=1, max_workers=3))
    supervisor.elsewhere = 1  # one more, draining or in backoff: 3 held of max 3
    for t in range(8):
        for w in supervisor.workers:
            m.on_report(w.id, Report(cpu=1.0, executor=Executor(busy=8, total=8)), float(t))
    assert len(supervisor.workers) == 2


async def test_placement_happens_once():
    m, _ = manager(2)
    key = ("acme", "shop", "green")
    idle_reception = Report(cpu=0.1, executor=Executor(busy=0, total=8))
    for t in range(6):
        m.on_report("acme.shop.green.1", idle_reception, float(t))
        m.on_report("acme.shop.green.2", idle_reception, float(t))
    assert m.on_login(key, "u1", "acme.shop.green.1", False) is None  # kept: stays, nobody re-pointed
    assert m.on_login(key, "u2", "acme.shop.green.2", True) is None  # on b, logs in again: not pulled back
    for t in range(6, 12):
        m.on_report("acme.shop.green.1", Report(cpu=0.9, executor=Executor(busy=7, total=8)), float(t))
    assert m.on_login(key, "u1", "acme.shop.green.1", True) is None  # kept earlier: not moved away now
    assert m.on_login(key, "u3", "acme.shop.green.1", False) == "acme.shop.green.2"  # a new login is passed
    counts = m.describe("acme", "shop", lambda w: [])["groups"]["green"]["decision_counts"]
    assert counts == {"keep": 1, "pass": 1, "admit": 1}


async def test_a_silent_worker_burning_cpu_is_not_hung_a_stopped_one_is():
    clock = {"now": 0.0}
    cpu = {1000 + 1: 0.0, 1000 + 2: 3.0}
    m, supervisor = manager(2, tree_cpu=lambda pid: cpu[pid], hung_after=3.0)
    m._clock = lambda: clock["now"]
    m.on_report("acme.shop.green.1", idle(), 0.0)
    m.on_report("acme.shop.green.2", idle(), 0.0)
    for t in range(1, 10):  # no report from either after t=0
        clock["now"] = float(t)
        cpu[1001] += 0.9  # busy in a handler
        m.sense()
        await asyncio.sleep(0)
    assert supervisor.replaced == ["acme.shop.green.2"]
    hung = next(d for d in m.describe("acme", "shop", lambda w: [])["groups"]["green"]["decisions"]
                if d["decision"] == "hung")
    assert hung["worker"] == "acme.shop.green.2" and hung["numbers"]["no_progress_seconds"] >= 3.0


async def test_a_drained_worker_holding_a_tunnel_waits_for_it():
    open_tunnels = {"acme.shop.green.2": 1}
    m, supervisor = manager(2, tunnels=lambda: dict(open_tunnels))
    for t in range(6):
        for w in supervisor.workers:
            m.on_report(w.id, idle(), float(t))
    assert m.draining == {"acme.shop.green.2"}  # the only candidate: its drain waits for the tunnel
    await asyncio.sleep(0.3)
    assert supervisor.retired == []
    open_tunnels.clear()
    for _ in range(50):
        await asyncio.sleep(0.05)
        if supervisor.retired:
            break
    assert supervisor.retired == ["acme.shop.green.2"]
    retire = next(d for d in m.describe("acme", "shop", lambda w: [])["groups"]["green"]["decisions"]
                  if d["decision"] == "retire")
    assert retire["reason"] == "drained: nothing open on it" and retire["numbers"]["waited_seconds"] >= 0.3


async def test_guests_are_not_moved_by_compaction():
    m, supervisor = manager(2)
    m._surface.users = {"guest": User("acme.shop.green.2", None), "alice": User("acme.shop.green.2", "alice")}
    for t in range(6):
        for w in supervisor.workers:
            m.on_report(w.id, idle(), float(t))
    assert m.draining == {"acme.shop.green.2"}
    assert m._surface.users["alice"].worker == "acme.shop.green.1"
    assert m._surface.users["guest"].worker == "acme.shop.green.2"  # re-placed on the reception by the front


def test_unlimited_is_the_default_budget():
    m, _ = manager(1)
    assert m._budget("acme", "shop") is UNLIMITED


async def test_a_start_up_spike_in_the_first_readings_does_not_grow_the_group():
    m, supervisor = manager(1)
    spike = Report(cpu=0.9, executor=Executor(busy=0, total=8))  # imports and warm-up, before any request
    m.on_report("acme.shop.green.1", Report(cpu=None, executor=Executor(busy=0, total=8)), 0.0)  # the first tick
    m.on_report("acme.shop.green.1", spike, 1.0)
    assert len(supervisor.workers) == 1  # not measured yet: two readings are its own start-up
    for t in range(2, 6):
        m.on_report("acme.shop.green.1", idle(), float(t))
    assert len(supervisor.workers) == 1  # the average came down before it could ask


class SlowRetire(Supervisor):
    """A supervisor whose retire takes the worker out of the list at once and stops it only when told: meanwhile
    the worker is stopping, and still counted against max_workers."""

    def __init__(self, n: int) -> None:
        super().__init__(n)
        self.stopped = asyncio.Event()
        self.stopping = False  # elasticd's stop: add_worker answers None

    async def retire(self, worker_id):
        self.workers = [w for w in self.workers if w.id != worker_id]
        self.elsewhere += 1
        await self.stopped.wait()
        self.elsewhere -= 1
        self.retired.append(worker_id)

    def add_worker(self, key):
        return None if self.stopping else super().add_worker(key)


def at_zero(supervisor: Supervisor, maximum: int = 1) -> PoolManager:
    m = PoolManager(supervisor, Surface(), ForwardCounters(), interval=1.0, tree_cpu=lambda pid: 0.0)
    m.apply(_config(PoolSettings(min_workers=0, max_workers=maximum, idle_timeout=1.0)))
    return m


async def test_a_request_for_a_group_at_zero_starts_its_cold_start():
    supervisor = Supervisor(0)
    m = at_zero(supervisor)
    assert m.wake(KEY) is True
    assert [w.id for w in supervisor.workers] == ["acme.shop.green.1"]
    assert m.wake(KEY) is True  # a second request waits for the same start
    assert len(supervisor.workers) == 1
    state = m.describe("acme", "shop", lambda w: [])["groups"]["green"]
    assert state["cold_starts"]["starting"] == ["acme.shop.green.1"]
    assert state["decisions"][-1]["reason"].startswith("cold start")


async def test_a_request_during_an_idle_retire_waits_and_its_cold_start_follows_the_stop():
    supervisor = SlowRetire(1)
    m = at_zero(supervisor, maximum=1)
    failed: list[str] = []
    m.on_wake_failed = lambda key, why: failed.append(why)
    clock = {"now": 0.0}
    m._clock = lambda: clock["now"]
    m.sense()
    clock["now"] = 5.0
    m.sense()  # idle past idle_timeout: the retire begins
    await asyncio.sleep(0.05)
    assert m.draining == {"acme.shop.green.1"} and not supervisor.workers
    assert m.wake(KEY) is True  # at max_workers 1 only through the worker going: the request waits
    assert m.owes_start(KEY) and supervisor.workers == []  # nothing started over the cap
    supervisor.stopped.set()
    for _ in range(40):
        await asyncio.sleep(0.01)
        if supervisor.workers:
            break
    assert supervisor.retired == ["acme.shop.green.1"]
    assert [w.id for w in supervisor.workers] == ["acme.shop.green.2"] and not m.owes_start(KEY)
    assert failed == []


async def test_a_drain_while_elasticd_stops_keeps_the_worker_and_its_users():
    supervisor = SlowRetire(1)
    m = PoolManager(supervisor, Surface(), ForwardCounters(), interval=1.0, tree_cpu=lambda pid: 0.0)
    m.apply(_config(PoolSettings(min_workers=1, max_workers=1)))
    m._surface.users = {"alice": User("acme.shop.green.1", "alice")}
    supervisor.stopping = True
    try:
        await m.drain("acme.shop.green.1")
    except ValueError as refused:
        assert "elasticd is stopping" in str(refused) and "kept, with its users" in str(refused)
    else:
        raise AssertionError("a drain that needs a replacement while elasticd stops must be refused")
    assert m.draining == set() and not m._surface.users["alice"].pinned
    assert m._surface.users["alice"].worker == "acme.shop.green.1"


async def test_a_drain_at_max_workers_one_starts_its_replacement_in_the_drained_ones_place():
    supervisor = Supervisor(1)
    m = PoolManager(supervisor, Surface(), ForwardCounters(), interval=1.0, tree_cpu=lambda pid: 0.0)
    m.apply(_config(PoolSettings(min_workers=1, max_workers=1)))
    drain = asyncio.ensure_future(m.drain("acme.shop.green.1"))
    await asyncio.sleep(0.05)
    assert [w.id for w in supervisor.workers] == ["acme.shop.green.1", "acme.shop.green.2"]
    supervisor.workers[1].routable = True
    result = await asyncio.wait_for(drain, 5)
    assert result.empty and supervisor.retired == ["acme.shop.green.1"]


def _config(pool: PoolSettings) -> Config:
    group = Group(name="green", command=("app",), pool=pool)
    app = App(name="shop", domains=("shop.localhost",), root="/", default_group="green", groups={"green": group})
    return Config(server=Server(occupancy_interval=1.0),
                  tenants={"acme": Tenant("acme", Resources(), Quotas(), {"shop": app})})


def _two_tenants(acme: PoolSettings, initech: PoolSettings) -> Config:
    tenants = {}
    for name, pool in (("acme", acme), ("initech", initech)):
        group = Group(name="green", command=("app",), pool=pool)
        app = App(name="shop", domains=(f"shop.{name}.localhost",), root="/", default_group="green",
                  groups={"green": group})
        tenants[name] = Tenant(name, Resources(), Quotas(), {"shop": app})
    return Config(server=Server(occupancy_interval=1.0), tenants=tenants)


def test_a_reload_remakes_only_the_changed_tenants_group_settings():
    m = PoolManager(Supervisor(1), Surface(), ForwardCounters(), interval=1.0, tree_cpu=lambda pid: 0.0)
    m.apply(_two_tenants(PoolSettings(max_workers=2), PoolSettings(max_workers=2)))  # a start: every tenant
    kept = m._groups[("initech", "shop", "green")]
    kept_settings = kept.settings
    assert m._groups[("acme", "shop", "green")].settings.pool.max_workers == 2
    m.apply(_two_tenants(PoolSettings(max_workers=5), PoolSettings(max_workers=2)), changed={"acme"})
    assert m._groups[("acme", "shop", "green")].settings.pool.max_workers == 5  # remade
    assert m._groups[("initech", "shop", "green")] is kept and kept.settings is kept_settings  # left as it was
    # A new tenant's groups are made whatever ``changed`` says; a removed one's are forgotten.
    m.apply(_config(PoolSettings(max_workers=3)), changed=frozenset())
    assert set(m._groups) == {("acme", "shop", "green")}
    m.apply(_two_tenants(PoolSettings(max_workers=5), PoolSettings(max_workers=4)), changed=frozenset())
    assert m._groups[("initech", "shop", "green")].settings.pool.max_workers == 4
    # A changed tenant's group renamed: the old one forgotten, the new one made; the other tenant's left alone.
    renamed = _two_tenants(PoolSettings(max_workers=5), PoolSettings(max_workers=4))
    shop = renamed.tenants["acme"].apps["shop"]
    blue = Group(name="blue", command=("app",), pool=PoolSettings(max_workers=6))
    renamed.tenants["acme"].apps["shop"] = App(name="shop", domains=shop.domains, root="/", default_group="blue",
                                               groups={"blue": blue})
    initech = m._groups[("initech", "shop", "green")]
    m.apply(renamed, changed={"acme"})
    assert set(m._groups) == {("acme", "shop", "blue"), ("initech", "shop", "green")}
    assert m._groups[("acme", "shop", "blue")].settings.pool.max_workers == 6
    assert m._groups[("initech", "shop", "green")] is initech


def test_a_group_at_zero_keeps_its_idle_book_as_the_whole_idle_check_would():
    # The tick's fast path for a group with no worker (most groups of a host of idle tenants): its book sees no
    # request on any worker, and nothing is sensed or retired.
    supervisor = Supervisor(0)
    m = at_zero(supervisor)
    clock = {"now": 10.0}
    m._clock = lambda: clock["now"]
    record = m._groups[KEY]
    record.book.last_requests, record.book.last_active = 7, 3.0  # its last worker had answered 7 requests
    m.sense()
    assert (record.book.last_requests, record.book.last_active) == (0, 10.0)
    clock["now"] = 20.0
    m.sense()  # nothing moved since: the book stays
    assert (record.book.last_requests, record.book.last_active) == (0, 10.0)
    assert supervisor.workers == [] and not m.draining
