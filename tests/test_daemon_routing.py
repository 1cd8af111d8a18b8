"""The front's routing as the daemon gives it (``Daemon._upstreams``): worked out once per group and reused
until the supervisor or the pool counts a change, so a request costs no O(workers) Python; any change
recomputes it."""

from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

from elasticd.daemon import Daemon
from elasticd.front import Upstream


@dataclass
class W:
    id: str
    socket_path: str


@dataclass
class Pool:
    routable_of: dict[tuple[str, str, str], list[W]]
    changes: int = 0
    asked: int = 0

    def routable(self, key: tuple[str, str, str]) -> list[W]:
        self.asked += 1
        return list(self.routable_of.get(key, []))


@dataclass
class Supervisor:
    changes: int = 0


@dataclass
class FakeDaemon:
    pool: Pool
    supervisor: Supervisor = field(default_factory=Supervisor)
    _routing: dict = field(default_factory=dict)
    _routing_version: int = -1
    _upstream_of: dict = field(default_factory=dict)
    capacity: Any = field(default_factory=lambda: SimpleNamespace(nodes={}))


def test_the_routing_is_reused_until_a_change_is_counted():
    key = ("acme", "shop", "green")
    w1, w2 = W("acme.shop.green.1", "/run/1.sock"), W("acme.shop.green.2", "/run/2.sock")
    daemon = FakeDaemon(Pool({key: [w1, w2]}))
    route = Daemon._upstreams
    first = route(daemon, *key)  # type: ignore[arg-type]
    assert first == [Upstream(w1.id, w1.socket_path), Upstream(w2.id, w2.socket_path)]
    assert route(daemon, *key) is first and daemon.pool.asked == 1  # type: ignore[arg-type]
    assert route(daemon, "acme", "shop", "blue") == [] and daemon.pool.asked == 2  # type: ignore[arg-type]

    daemon.pool.routable_of[key] = [w1]  # a drain began: the pool counts it
    daemon.pool.changes += 1
    assert route(daemon, *key) == [Upstream(w1.id, w1.socket_path)]  # type: ignore[arg-type]

    daemon.pool.routable_of[key] = [w2]  # a worker's state changed: the supervisor counts it
    daemon.supervisor.changes += 1
    again = route(daemon, *key)  # type: ignore[arg-type]
    assert again == [Upstream(w2.id, w2.socket_path)]
    assert again[0] is first[1]  # each worker's Upstream is made once
