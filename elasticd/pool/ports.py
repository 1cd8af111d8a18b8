"""What the pool's manager sees of the rest of the daemon: the supervisor (its workers, by group), the front's
surface (users and where they live) and its forward counters. Protocols only, so the manager is tested with
small fakes and imports none of those modules.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Protocol

from elasticd.supervisor.lifecycle import WorkerState
from elasticd.supervisor.plan import GroupKey  # (tenant, app, group): one definition, the supervisor's

__all__ = ["GroupKey", "PoolCounters", "PoolForwards", "PoolSupervisor", "PoolSurface", "PoolUser", "PoolWorker"]

class PoolWorker(Protocol):
    """What the pool reads of a supervised worker (``supervisor.worker.Worker``)."""

    @property
    def id(self) -> str: ...
    @property
    def pid(self) -> int | None: ...
    @property
    def state(self) -> WorkerState: ...
    @property
    def routable(self) -> bool: ...


class PoolSupervisor(Protocol):
    def workers_of(self, key: GroupKey) -> Sequence[PoolWorker]: ...
    def counted(self, key: GroupKey) -> int: ...
    def launching(self, key: GroupKey) -> bool: ...
    def add_worker(self, key: GroupKey) -> PoolWorker | None:
        """None while elasticd stops, or when the group is going: no worker will come."""
    async def retire(self, worker_id: str) -> None: ...
    async def replace_worker(self, worker_id: str) -> None: ...


class PoolUser(Protocol):
    seconds: float
    login: str | None


class PoolSurface(Protocol):
    def on(self, worker: str) -> Iterable[tuple[str, PoolUser]]: ...
    def count_by_group(self) -> Mapping[tuple[str, str], int]: ...
    def assign(self, user: str, worker: str, now: float) -> object: ...
    def pin(self, user: str, pinned: bool = True) -> None: ...


class PoolCounters(Protocol):
    requests: int
    errors: int
    seconds: float
    answered: int


class PoolForwards(Protocol):
    def worker(self, worker_id: str) -> PoolCounters: ...
    def open_by_worker(self) -> dict[str, int]: ...
    def oldest_open_by_worker(self) -> dict[str, float]: ...
