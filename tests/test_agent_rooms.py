"""What the agent answers about (agent/rooms.py), read from the pool and the supervisor: an app found by a domain
or tenant/app, its active groups only, held by a cgroup limit, failed, and removed by a reload (drain while its
workers finish)."""

from __future__ import annotations

from types import SimpleNamespace

from elasticd.agent.line import app_line
from elasticd.agent.rooms import AgentRooms
from elasticd.config.load import parse_config

CONFIG = """\
tenants:
  acme:
    quotas: {max_concurrent_requests: 64}
    apps:
      shop:
        domains: [shop.example, "*.shop.example"]
        root: /srv
        default_group: green
        groups:
          green:
            command: ["x"]
            pool: {min_workers: 1, max_workers: 2}
          blue:
            command: ["x"]
"""


def worker(state: str = "running", number: int = 1) -> SimpleNamespace:
    return SimpleNamespace(state=state, routable=state == "running", id=f"acme.shop.green.{number}")


class Fakes:
    def __init__(self) -> None:
        self.workers = {("acme", "shop", "green"): [worker()], ("acme", "shop", "blue"): [worker(), worker()]}
        self.bound: dict = {}
        self.alive = True
        self.pool = SimpleNamespace(occupancies_of=lambda key: [0.2] * sum(w.routable for w in self.workers[key]),
                                    limits_bound=lambda: self.bound, draining=set())
        # (as Supervisor.held: every worker with a process or about to have one, failed ones not)
        self.supervisor = SimpleNamespace(workers_of=lambda key: self.workers.get(key, []),
                                          counted=lambda key: sum(w.state != "failed" for w in self.workers[key]),
                                          holds_app=lambda tenant, app: self.alive)


def test_an_app_by_its_domain_or_name_with_its_active_groups_only():
    fakes = Fakes()
    rooms = AgentRooms(fakes.pool, fakes.supervisor)  # type: ignore[arg-type]
    rooms.apply(parse_config(CONFIG))
    for hint in ("shop.example", "a.b.shop.example", "acme/shop"):
        app = rooms.resolve(hint)
        assert app is not None and app.name == "acme/shop" and len(app.groups) == 1  # blue gets no new user
    # green: 1 worker at 0.2 of max 2: (0.5 - 0.2 + 0.8) / 1.3
    assert app_line(rooms.resolve("shop.example"), "shop.example") == \
        "up ready 84% maxconn:64 #acme/shop: room 1.10 of 1.30\n"
    fakes.pool.draining = {"acme.shop.green.1"}  # its only worker being emptied (moved off, retired)
    assert app_line(rooms.resolve("acme/shop"), "acme/shop") == "drain #acme/shop: its workers are being emptied\n"
    assert rooms.resolve("nope.example") is None and rooms.resolve("acme/nope") is None


def test_held_failed_and_removed():
    fakes = Fakes()
    rooms = AgentRooms(fakes.pool, fakes.supervisor)  # type: ignore[arg-type]
    config = parse_config(CONFIG)
    rooms.apply(config)
    fakes.bound[("acme", "shop", "green")] = frozenset({"cpu"})
    assert app_line(rooms.resolve("acme/shop"), "acme/shop").startswith("up ready 0% maxconn:64")
    fakes.bound.clear()
    fakes.workers[("acme", "shop", "green")] = [worker("failed")]
    assert app_line(rooms.resolve("acme/shop"), "acme/shop") == "maint #acme/shop: its workers failed\n"
    fakes.workers[("acme", "shop", "green")] = [worker("failed"), worker(number=2)]  # one still serves: not failed
    assert app_line(rooms.resolve("acme/shop"), "acme/shop").startswith("up ready")

    rooms.apply(parse_config(CONFIG.replace("shop:", "other:").replace("shop.example", "other.example")))
    # Removed: the front answers its users 404 at once, so HAProxy must send them elsewhere (maint, not drain).
    assert app_line(rooms.resolve("shop.example"), "shop.example") == "maint #acme/shop: removed from this host\n"
    assert app_line(rooms.resolve("acme/shop"), "acme/shop") == "maint #acme/shop: removed from this host\n"
    fakes.alive = False  # its workers finished
    assert rooms.resolve("shop.example") is None
    rooms.apply(config)  # back in the config
    assert rooms.resolve("shop.example") is not None and not rooms.resolve("shop.example").draining


def test_the_agents_server_keys():
    import pytest

    from elasticd.config.model import Address
    from elasticd.config.walk import ConfigError

    config = parse_config("server: {agent_listen: 10.0.0.5:9465, stop_drain: 5s}\n" + CONFIG)
    assert config.server.agent_listen == Address("10.0.0.5", 9465) and config.server.stop_drain == 5.0
    plain = parse_config(CONFIG).server
    assert plain.agent_listen is None and plain.stop_drain == 0.0  # off by default
    assert parse_config("server: {stop_drain: 0}\n" + CONFIG).server.stop_drain == 0.0
    for bad, message in (("agent_listen: 9465", 'server.agent_listen (line 1): "9465" is not HOST:PORT'),
                         ("stop_drain: 5", "server.stop_drain (line 1): ")):
        with pytest.raises(ConfigError) as info:
            parse_config(f"server: {{{bad}}}\n" + CONFIG)
        assert message in str(info.value)


def test_a_stop_drain_nothing_hears_or_the_unit_would_cut_is_said():
    from pathlib import Path

    from elasticd.config.notices import UNIT_STOP_TIMEOUT, balancer_warnings

    unit = (Path(__file__).resolve().parent.parent / "packaging" / "systemd" / "elasticd.service").read_text()
    assert f"TimeoutStopSec={UNIT_STOP_TIMEOUT:g}" in unit  # the notice's number is the shipped unit's
    assert balancer_warnings(parse_config(CONFIG)) == []
    assert balancer_warnings(parse_config("server: {agent_listen: 127.0.0.1:9465, stop_drain: 5s}\n" + CONFIG)) == []
    assert "without server.agent_listen" in balancer_warnings(parse_config("server: {stop_drain: 5s}\n" + CONFIG))[0]
    long = parse_config("server: {agent_listen: 127.0.0.1:9465, stop_drain: 20s, stop_timeout: 20s}\n" + CONFIG)
    assert "TimeoutStopSec (60s)" in balancer_warnings(long)[0]  # 20 + 2 x 20: the front's grace, then the workers'
    fits = parse_config("server: {agent_listen: 127.0.0.1:9465, stop_drain: 20s, stop_timeout: 19s}\n" + CONFIG)
    assert balancer_warnings(fits) == []


def test_a_canary_counts_by_its_share_and_an_app_of_nodes_defers_to_their_agents():
    fakes = Fakes()
    rooms = AgentRooms(fakes.pool, fakes.supervisor)  # type: ignore[arg-type]
    rooms.apply(parse_config(CONFIG.replace("default_group: green", "default_group: green\n        canary: "
                                                                      "{group: blue, share: 10%}")))
    app = rooms.resolve("acme/shop")
    assert app is not None and [(len(g.occupancies), g.share) for g in app.groups] == [(2, 0.1), (1, 0.9)]
    remote = CONFIG.replace("          blue:\n            command: [\"x\"]\n",
                            "          blue:\n            nodes: [{url: \"http://10.0.0.5:8000\"}]\n")
    rooms.apply(parse_config(remote.replace("default_group: green", "default_group: blue")))
    assert app_line(rooms.resolve("acme/shop"), "acme/shop") == \
        "up ready 100% maxconn:64 #acme/shop: served by nodes (their own agents say their room)\n"
