"""The capacity wiring (probes/wiring.py) against a real Front: a reload that moves or removes a node makes the
front forget what it knew of the old one; the registry publishes a host's own workers, never its nodes: groups;
a nodes: group's new users go to the node with the most room, ties in turn."""

from __future__ import annotations

from types import SimpleNamespace

from elasticd.config.load import parse_config
from elasticd.config.model import Address
from elasticd.front import Front, RouteTable
from elasticd.front.core.counters import WorkerCounters
from elasticd.front.core.sticky import Surface
from elasticd.front.upstream import ConnectionPool, Upstream
from elasticd.probes.wiring import CapacityWiring

CONFIG = """\
tenants:
  acme:
    apps:
      shop:
        domains: [shop.localhost]
        root: /srv
        groups:
          green:
            command: ["x"]
          remote:
            concurrency: 2
            nodes:
              - {{url: "http://10.0.0.5:{port}", name: gpu1}}
              - {{url: "http://10.0.0.6:8000", name: gpu2}}
"""
GPU1, GPU2 = "acme.shop.remote@gpu1", "acme.shop.remote@gpu2"


def _wiring() -> tuple[CapacityWiring, Front]:
    front = Front(Address("127.0.0.1", 0), RouteTable(), lambda tenant, app, group: [])
    pool = SimpleNamespace(on_capacity=lambda worker, key, ratio: None)
    worker = SimpleNamespace(id="acme.shop.green.1", routable=True, socket_path="/run/w1.sock")
    supervisor = SimpleNamespace(workers_of=lambda key: (worker,) if key[2] == "green" else ())
    return CapacityWiring(front, pool, supervisor), front  # type: ignore[arg-type]


def test_a_node_moved_or_removed_by_a_reload_is_forgotten_by_the_front():
    wiring, front = _wiring()
    wiring.apply(parse_config(CONFIG.format(port=8000)))
    assert [u.socket_path for u in wiring.nodes[("acme", "shop", "remote")]] == ["10.0.0.5:8000", "10.0.0.6:8000"]
    front.health.unroutable.update({GPU1, GPU2})  # both found dead
    wiring.apply(parse_config(CONFIG.format(port=9000)))  # gpu1 at another address, gpu2 as it was
    assert GPU1 not in front.health.unroutable and GPU2 in front.health.unroutable
    wiring.apply(parse_config(CONFIG.format(port=9000).replace('              - {url: "http://10.0.0.6:8000", '
                                                                'name: gpu2}\n', "")))
    assert GPU2 not in front.health.unroutable
    assert [u.worker_id for u in wiring.nodes[("acme", "shop", "remote")]] == [GPU1]


def test_the_registry_publishes_the_hosts_own_workers_never_its_nodes():
    wiring, _ = _wiring()
    wiring.apply(parse_config(CONFIG.format(port=8000)))
    apps = wiring.registry_apps()
    assert [g["group"] for a in apps for g in a["groups"]] == ["green"]
    assert apps[0]["groups"][0]["workers"] == [{"id": "acme.shop.green.1", "healthy": True, "open": 0, "limit": 8,
                                                "capacity": None}]
    assert "10.0.0.5" not in repr(apps)


def test_new_users_of_a_nodes_group_spread_over_idle_nodes_and_go_to_the_one_with_room():
    wiring, front = _wiring()
    wiring.apply(parse_config(CONFIG.format(port=8000)))
    nodes = [Upstream(GPU1, "10.0.0.5:8000"), Upstream(GPU2, "10.0.0.6:8000")]
    surface = Surface(60.0)
    assert sorted(wiring.place(None, surface, nodes) for _ in range(4)) == [GPU1, GPU1, GPU2, GPU2]  # ties in turn
    busy = ConnectionPool(nodes[0], WorkerCounters())
    busy.conns.update({object(), object()})  # type: ignore[arg-type]  # two connections carrying requests
    front.worker_links.pools[GPU1] = busy
    assert front.worker_links.in_flight(GPU1) == 2 and front.worker_links.in_flight(GPU2) == 0
    assert {wiring.place(None, surface, nodes) for _ in range(4)} == {GPU2}  # gpu1 has 2 of its 2 open
    workers = [Upstream("acme.shop.green.1", "/run/w1.sock"), Upstream("acme.shop.green.2", "/run/w2.sock")]
    assert wiring.place(None, surface, workers) == "acme.shop.green.1"  # a worker group: its reception
