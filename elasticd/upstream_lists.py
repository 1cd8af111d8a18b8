"""Which workers the front may send a group's requests to, as ``Upstream`` lists: the routing cache.

The front asks for every request. The answer is the pool's routable workers (its one draining filter), worked out
once per group until what is routable may have changed — a worker's state or a group's membership (the
supervisor's ``changes``), a drain or a reload (the pool's) — not per request: with N workers that is O(N) Python a
request. A list handed out is shared: the front only reads it. A ``nodes:`` group's upstreams are the config's
(another host's elasticd), kept by the capacity wiring.
"""

from __future__ import annotations

from collections.abc import Callable

from elasticd.front import Upstream
from elasticd.pool.manager import PoolManager
from elasticd.supervisor.plan import GroupKey
from elasticd.supervisor.supervisor import Supervisor

__all__ = ["UpstreamLists"]


class UpstreamLists:
    __slots__ = ("_lists", "_nodes", "_pool", "_supervisor", "_upstream_of", "_version")

    _pool: PoolManager  # wired once the pool exists (it is made after the front, whose surface it reads)

    def __init__(self, supervisor: Supervisor, nodes: Callable[[GroupKey], list[Upstream] | None]) -> None:
        self._supervisor = supervisor
        self._nodes = nodes  # a nodes: group's upstreams (the capacity wiring's: a reload moves the version)
        self._upstream_of: dict[str, Upstream] = {}  # one Upstream per worker: its pooled connections live in it
        self._lists: dict[GroupKey, list[Upstream]] = {}
        self._version = -1

    def wire(self, pool: PoolManager) -> None:
        self._pool = pool

    def __call__(self, tenant: str, app: str, group: str) -> list[Upstream]:
        version = self._supervisor.changes + self._pool.changes  # both only grow: their sum moves with either
        if version != self._version:
            self._lists.clear()
            self._version = version
        key = (tenant, app, group)
        upstreams = self._lists.get(key)
        if upstreams is None:
            upstreams = self._lists[key] = self._work_out(key)
        return upstreams

    def _work_out(self, key: GroupKey) -> list[Upstream]:
        nodes = self._nodes(key)
        if nodes is not None:
            return nodes
        upstreams = []
        for worker_id in self._pool.routable_ids(key):
            upstream = self._upstream(worker_id)
            if upstream is not None:
                upstreams.append(upstream)
        return upstreams

    def kept(self, worker_id: str) -> Upstream | None:
        """A worker being emptied by live moves, while it still runs: the front sends it the users pinned to it
        (those waiting their turn to be moved off), though the routable lists leave it out."""
        worker = self._supervisor.find(worker_id)
        if worker is None or not worker.routable or worker_id not in self._pool.draining:
            return None
        return self._upstream(worker_id)

    def of(self, worker_id: str) -> Upstream | None:
        """A running worker's Upstream, routable or not: a request carried over a re-exec goes back to the worker
        that has it, even one adopted only to be drained."""
        return self._upstream(worker_id)

    def _upstream(self, worker_id: str) -> Upstream | None:
        upstream = self._upstream_of.get(worker_id)
        if upstream is None:
            worker = self._supervisor.find(worker_id)
            if worker is None:
                return None  # (stopped meanwhile: the next change of version drops it from the lists)
            upstream = self._upstream_of[worker_id] = Upstream(worker_id, worker.socket_path)
        return upstream

    def forget(self, worker_id: str) -> None:
        """A worker stopped for good (a restart keeps its id, its socket path and its Upstream)."""
        self._upstream_of.pop(worker_id, None)
