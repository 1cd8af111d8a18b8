"""The front's routing as the daemon gives it (``UpstreamLists``): worked out once per group and reused
until the supervisor or the pool counts a change, so a request costs no O(workers) Python; any change
recomputes it."""

from __future__ import annotations

from dataclasses import dataclass, field

from elasticd.front import Upstream
from elasticd.upstream_lists import UpstreamLists


@dataclass
class W:
    id: str
    socket_path: str


@dataclass
class Pool:
    routable_of: dict[tuple[str, str, str], list[W]]
    changes: int = 0
    asked: int = 0

    def routable_ids(self, key: tuple[str, str, str]) -> list[str]:
        self.asked += 1
        return [w.id for w in self.routable_of.get(key, [])]


@dataclass
class Supervisor:
    workers: dict[str, W] = field(default_factory=dict)
    changes: int = 0

    def find(self, worker_id: str) -> W | None:
        return self.workers.get(worker_id)


def test_the_routing_is_reused_until_a_change_is_counted():
    key = ("acme", "shop", "green")
    w1, w2 = W("acme.shop.green.1", "/run/1.sock"), W("acme.shop.green.2", "/run/2.sock")
    pool, supervisor = Pool({key: [w1, w2]}), Supervisor({w.id: w for w in (w1, w2)})
    route = UpstreamLists(supervisor, lambda key: None)  # type: ignore[arg-type]
    route.wire(pool)  # type: ignore[arg-type]
    first = route(*key)
    assert first == [Upstream(w1.id, w1.socket_path), Upstream(w2.id, w2.socket_path)]
    assert route(*key) is first and pool.asked == 1
    assert route("acme", "shop", "blue") == [] and pool.asked == 2

    pool.routable_of[key] = [w1]  # a drain began: the pool counts it
    pool.changes += 1
    assert route(*key) == [Upstream(w1.id, w1.socket_path)]

    pool.routable_of[key] = [w2]  # a worker's state changed: the supervisor counts it
    supervisor.changes += 1
    again = route(*key)
    assert again == [Upstream(w2.id, w2.socket_path)]
    assert again[0] is first[1]  # each worker's Upstream is made once
