"""Capacity in the daemon: which workers and nodes are probed, the ``nodes:`` groups' upstreams, what the registry
publishes and what ``GET …/pool`` shows of it. A shell between the config, the supervisor, the front and the
pool on one side and the probes' ``CapacityState`` on the other, so the daemon only calls it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from elasticd.config.model import Config, node_id
from elasticd.front.core.sticky import RoutableWorker, Surface, place
from elasticd.front.server import Front
from elasticd.front.upstream import Upstream
from elasticd.pool.manager import PoolManager
from elasticd.pool.ports import GroupKey
from elasticd.probes.probe import ProbeTarget
from elasticd.probes.state import CapacityState
from elasticd.supervisor.supervisor import Supervisor

__all__ = ["CapacityWiring"]



class CapacityWiring:
    __slots__ = ("_config", "_fixed", "_front", "_limits", "_probed", "_supervisor", "_turn", "nodes", "state")

    def __init__(self, front: Front, pool: PoolManager, supervisor: Supervisor) -> None:
        self._front = front
        self._supervisor = supervisor
        self._config: Config | None = None
        # What ``sync`` probes, from the last ``apply``: the nodes with a probe, and the worker groups with one (each
        # group's key, its probe's limit and its capacity block).
        self._fixed: list[tuple[ProbeTarget, Any]] = []
        self._probed: list[tuple[GroupKey, int, Any]] = []
        self._turn = 0  # where the next new user of a nodes: group starts looking (ties go round)
        self._limits: dict[str, int] = {}  # each node's limit (its block's, else its group's concurrency)
        self.state = CapacityState(front.health.full, front.waiting.room, pool.on_capacity)
        front.forwarding.on_backoff = lambda worker, value, now: self.state.backoff(worker, value)
        # A nodes: group's upstreams, in the config's order (the first is where new users go while it has room).
        self.nodes: dict[GroupKey, list[Upstream]] = {}

    def apply(self, config: Config) -> None:
        """A start or a reload: the nodes as configured, every probe as the config and the workers now ask. One
        walk over the config's groups, keeping only those with anything to probe for ``sync`` (few: at 10,000 apps,
        three walks over all of them here and one more at each worker's change were ~25 ms of a reload, and ~3 ms
        of every worker's start, on the front's loop)."""
        self._config = config
        before = {u.worker_id: u.socket_path for nodes in self.nodes.values() for u in nodes}
        nodes: dict[GroupKey, list[Upstream]] = {}
        limits: dict[str, int] = {}
        fixed: list[tuple[ProbeTarget, Any]] = []
        probed: list[tuple[GroupKey, int, Any]] = []
        for tenant, app, group in config.groups():
            if group.spawned:
                if group.capacity is not None and group.capacity.probe != "inflight":
                    probed.append(((tenant.name, app.name, group.name), group.capacity.limit or group.concurrency,
                                   group.capacity))
                continue
            key = (tenant.name, app.name, group.name)
            nodes[key] = [Upstream(node_id(*key, n.name), n.address) for n in group.nodes]
            for node in group.nodes:
                worker_id = node_id(*key, node.name)
                limit = node.capacity.limit if node.capacity is not None and node.capacity.limit else group.concurrency
                limits[worker_id] = limit
                if node.capacity is not None and node.capacity.probe != "inflight":
                    fixed.append((ProbeTarget(worker_id, *key, limit, url=node.url), node.capacity))
        self.nodes, self._limits, self._fixed, self._probed = nodes, limits, fixed, probed
        after = {u.worker_id: u.socket_path for nodes in self.nodes.values() for u in nodes}
        for known, address in before.items():
            if after.get(known) != address:
                # Gone, or at another address: what the front knew of it (found dead, its pooled connections, its
                # users' placement, the socket it probes to find it alive again) was about the old one.
                self._front.forget_worker(known)
        self.sync()

    def sync(self) -> None:
        """The probes for what runs now: called at each activation and at each worker's change of state (a
        worker's probe starts when its socket accepts, and stops, its reading dropped, when it goes)."""
        targets = list(self._fixed)
        workers_of = self._supervisor.workers_of
        for key, limit, capacity in self._probed:
            for worker in workers_of(key):
                if worker.routable:
                    targets.append((ProbeTarget(worker.id, *key, limit, socket=worker.socket_path), capacity))
        self.state.sync(targets)

    async def aclose(self) -> None:
        await self.state.aclose()

    def place(self, user: str | None, surface: Surface, routable: Sequence[RoutableWorker]) -> str:
        """The front's placement of a new (or re-placed) user: a worker group's reception (the pool places at
        login from there); for a nodes: group, which has no pool, the node with the most room — the least of
        its open requests over its limit, or its own reading when that says more (ties in turn)."""
        if not routable or "@" not in routable[0].worker_id:
            return place(user, surface, routable)
        front, limits = self._front, self._limits

        def load(worker: RoutableWorker) -> float:
            wid = worker.worker_id
            reading = self.state.tightest(wid)
            measured = front.worker_links.in_flight(wid) / limits.get(wid, 8)
            return max(measured, reading.ratio) if reading is not None else measured

        # Ties (idle nodes, a sequential client) are broken in turn, so new users spread over the nodes rather
        # than all landing on the first until it is busy.
        self._turn = turn = (self._turn + 1) % len(routable)
        return min((*routable[turn:], *routable[:turn]), key=load).worker_id


    # ------------------------------------------------------------------ views

    def registry_apps(self) -> list[dict[str, Any]]:
        """What ``GET /v1/registry`` says of each app: its groups' workers, healthy or not, their open requests,
        limit and own reading. No URL, no socket path; and no nodes: group (another host's capacity is that
        host's to publish, and a node's id may name its address)."""
        config = self._config
        if config is None:
            return []
        open_by = self._front.forwards.open_by_worker()
        unroutable = self._front.health.unroutable
        apps = []
        for tenant, app in config.apps():
            groups = []
            for group in app.groups.values():
                if not group.spawned:
                    continue
                key = (tenant.name, app.name, group.name)
                workers = []
                for wid, healthy in self._members(key):
                    reading = self.state.tightest(wid)
                    limit = (group.capacity.limit if group.capacity is not None and group.capacity.limit
                             else group.concurrency)
                    workers.append({"id": wid, "healthy": healthy and wid not in unroutable,
                                    "open": open_by.get(wid, 0), "limit": limit,
                                    "capacity": None if reading is None else
                                    {"source": reading.source, "used": reading.used, "limit": reading.limit,
                                     "at": reading.at}})
                groups.append({"group": group.name, "workers": workers})
            apps.append({"tenant": tenant.name, "app": app.name, "groups": groups})
        return apps

    def _members(self, key: GroupKey) -> list[tuple[str, bool]]:
        return [(w.id, w.routable) for w in self._supervisor.workers_of(key)]

    def describe_pool(self, state: dict[str, Any]) -> dict[str, Any]:
        """``GET …/pool`` with each worker's capacity (its block's kind, its probe's state, its fresh readings),
        and the app's nodes: groups (routed, never spawned) beside its pools."""
        config = self._config
        tenant, app = state["tenant"], state["app"]
        for group in state["groups"].values():
            for worker in group["workers"]:
                worker["capacity"] = self.state.describe(worker["id"])
        if config is None or tenant not in config.tenants or app not in config.tenants[tenant].apps:
            return state
        open_by = self._front.forwards.open_by_worker()
        users = _users_by_worker(self._front)
        for group in config.tenants[tenant].apps[app].groups.values():
            if group.spawned:
                continue
            key = (tenant, app, group.name)
            state["groups"][group.name] = {
                "nodes": True, "active": group.name in config.tenants[tenant].apps[app].active_groups,
                "workers": [{"id": upstream.worker_id, "address": upstream.socket_path, "state": "node",
                             "routable": upstream.worker_id not in self._front.health.unroutable,
                             "open": open_by.get(upstream.worker_id, 0),
                             "sticky_users": users.get(upstream.worker_id, 0),
                             "capacity": self.state.describe(upstream.worker_id)}
                            for upstream in self.nodes.get(key, [])],
            }
        return state


def _users_by_worker(front: Front) -> Mapping[str, int]:
    counts: dict[str, int] = {}
    for entry in list(front.surface.users.values()):
        counts[entry.worker] = counts.get(entry.worker, 0) + 1
    return counts
