"""The capacity configuration (config/capacity.py, read through parse_config: every kind, the alias, every
refusal naming its key and line; nodes: groups; server.registry) and the one factory (probes/factory.py: the
class a block asks for, and the probe built from it, with no event loop)."""

from __future__ import annotations

import asyncio
import textwrap
from pathlib import Path
from typing import Any

import pytest

from elasticd.config.load import parse_config
from elasticd.config.model import Capacity, Config, Group, Node, Registry
from elasticd.config.walk import ConfigError
from elasticd.probes import factory
from elasticd.probes.factory import ProbeError, build_probe, probe_class
from elasticd.probes.kinds import PrometheusProbe, RegistryProbe
from elasticd.probes.probe import ProbeTarget
from elasticd.probes.reading import Reading

G = "tenants.acme.apps.shop.groups.green"

# The group's own lines start at line 9 (10 with a one-line server section before it).
TEXT = """\
{server}tenants:
  acme:
    apps:
      shop:
        domains: [shop.localhost]
        root: /srv/acme/shop
        groups:
          green:
{group}
"""


def parse(group: str, server: str = "") -> Config:
    return parse_config(TEXT.format(group=textwrap.indent(textwrap.dedent(group).strip("\n"), " " * 12),
                                    server=server))


def group_of(group: str, server: str = "") -> Group:
    return parse(group, server).tenants["acme"].apps["shop"].groups["green"]


def refused(group: str, server: str = "") -> str:
    with pytest.raises(ConfigError) as info:
        parse(group, server)
    return str(info.value)


def worker_block(capacity: str) -> str:
    return f"command: [x]\ncapacity: {capacity}"


def node_block(capacity: str) -> str:
    return f"nodes:\n  - url: http://10.0.0.2:8080\n    capacity: {capacity}"


# -- every kind ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("group", "capacity"), [
    ("command: [x]", None),  # no block: the open-request count
    (worker_block("{probe: inflight}"), Capacity(block={"probe": "inflight"})),
    (worker_block("{probe: none}"), Capacity(probe="inflight", block={"probe": "none"})),  # none is inflight
    (worker_block("{type: none}"), Capacity(probe="inflight", block={"type": "none"})),
    (worker_block("{probe: null, limit: 3}"),  # null: the default, as for any key
     Capacity(probe="inflight", limit=3, block={"probe": None, "limit": 3})),
    (worker_block("{probe: inflight, limit: 4, wait: 250ms}"),
     Capacity(limit=4, wait=0.25, block={"probe": "inflight", "limit": 4, "wait": "250ms"})),
    (worker_block("{probe: ratelimit}"), Capacity(probe="ratelimit", block={"probe": "ratelimit"})),
    (worker_block("{probe: ratelimit, max_age: 0}"),
     Capacity(probe="ratelimit", max_age=0.0, block={"probe": "ratelimit", "max_age": 0})),
    (worker_block("{probe: prometheus}"), Capacity(probe="prometheus", block={"probe": "prometheus"})),
    (worker_block("{type: prometheus}"), Capacity(probe="prometheus", block={"type": "prometheus"})),  # the alias
    (worker_block("{probe: prometheus, path: /stats, interval: 500ms, max_age: 3s, limit: 16, wait: 2s, "
                  "running: [a_running, b_running], waiting: queue_depth}"),
     Capacity(probe="prometheus", interval=0.5, max_age=3.0, limit=16, wait=2.0, path="/stats",
              running=("a_running", "b_running"), waiting=("queue_depth",),
              block={"probe": "prometheus", "path": "/stats", "interval": "500ms", "max_age": "3s", "limit": 16,
                     "wait": "2s", "running": ["a_running", "b_running"], "waiting": "queue_depth"})),
    (worker_block("{probe: custom, class: 'mypkg.probes:Queue', queue: jobs, every: {x: 1}}"),
     Capacity(probe="custom", cls="mypkg.probes:Queue",
              block={"probe": "custom", "class": "mypkg.probes:Queue", "queue": "jobs", "every": {"x": 1}})),
    (worker_block("{type: custom, class: 'probe_mod:P'}"),
     Capacity(probe="custom", cls="probe_mod:P", block={"type": "custom", "class": "probe_mod:P"})),
])
def test_a_workers_capacity_block(group, capacity):
    assert group_of(group).capacity == capacity


@pytest.mark.parametrize(("capacity", "expected"), [
    ("{probe: registry, url: 'http://10.0.0.2:9464/v1/registry', secret_file: /etc/elastic/registry.secret}",
     Capacity(probe="registry", url="http://10.0.0.2:9464/v1/registry", secret_file="/etc/elastic/registry.secret",
              block={"probe": "registry", "url": "http://10.0.0.2:9464/v1/registry",
                     "secret_file": "/etc/elastic/registry.secret"})),
    ("{type: registry, url: 'https://gw/v1/registry', secret_file: /s, key_file: /k, app: globex/blog, "
     "max_skew: 2s, interval: 1s}",
     Capacity(probe="registry", interval=1.0, url="https://gw/v1/registry", secret_file="/s", key_file="/k",
              app="globex/blog", max_skew=2.0,
              block={"type": "registry", "url": "https://gw/v1/registry", "secret_file": "/s", "key_file": "/k",
                     "app": "globex/blog", "max_skew": "2s", "interval": "1s"})),
    ("{probe: prometheus, url: 'http://10.0.0.2:9100/metrics'}",  # a node's metrics on another port: a URL
     Capacity(probe="prometheus", url="http://10.0.0.2:9100/metrics",
              block={"probe": "prometheus", "url": "http://10.0.0.2:9100/metrics"})),
    ("{probe: prometheus, path: /m}", Capacity(probe="prometheus", path="/m", block={"probe": "prometheus",
                                                                                    "path": "/m"})),
])
def test_a_nodes_capacity_block(capacity, expected):
    group = group_of(node_block(capacity))
    assert group.nodes == (Node("10.0.0.2:8080", "10.0.0.2", 8080, "http://10.0.0.2:8080", expected),)
    assert group.capacity is None and group.command == () and not group.spawned


# -- refused, naming the key and the line -----------------------------------------------------------------------


@pytest.mark.parametrize(("group", "error"), [
    (worker_block("{probe: prometheus, type: prometheus}"),
     "capacity.type (line 10): is an alias of probe: give one of them"),
    (worker_block("{probe: bogus}"), 'capacity.probe (line 10): "bogus" is not a kind of probe (expected one of: '
                                     "inflight, none, prometheus, registry, custom, ratelimit)"),
    (worker_block("{type: Prometheus}"), 'capacity.type (line 10): "Prometheus" is not a kind of probe'),
    (worker_block("{probe: 3}"), "capacity.probe (line 10): the number 3 is not a kind of probe"),
    ("command: [x]\ncapacity:\n  interval: 1s\n  probe: bogus",
     'capacity.probe (line 12): "bogus" is not a kind of probe'),  # the line of the key itself
    ("command: [x]\ncapacity: prometheus", "capacity (line 10): must be a mapping"),
    # custom: a class, and a valid name
    (worker_block("{probe: custom}"), 'capacity.class (line 10): missing: a custom probe names its class '
                                      '("module:Class")'),
    (worker_block("{probe: custom, class: null}"), "capacity.class (line 10): missing: a custom probe names"),
    (worker_block("{probe: custom, class: 'os.path/x'}"),
     'capacity.class (line 10): "os.path/x" is not a class name ("package.module:Class")'),
    (worker_block("{probe: custom, class: 'a:b:c'}"), 'capacity.class (line 10): "a:b:c" is not a class name'),
    (worker_block("{probe: custom, class: '.mod:C'}"), 'capacity.class (line 10): ".mod:C" is not a class name'),
    (worker_block("{probe: custom, class: 'mod:'}"), 'capacity.class (line 10): "mod:" is not a class name'),
    (worker_block("{probe: custom, class: 'mod.C'}"), 'capacity.class (line 10): "mod.C" is not a class name'),
    (worker_block("{probe: custom, class: 'mod..x:C'}"), 'capacity.class (line 10): "mod..x:C" is not a class'),
    (worker_block("{probe: custom, class: 'mod:C.attr'}"), 'capacity.class (line 10): "mod:C.attr" is not a'),
    (worker_block("{probe: custom, class: '1mod:C'}"), 'capacity.class (line 10): "1mod:C" is not a class name'),
    (worker_block("{probe: custom, class: ' mod:C'}"), 'capacity.class (line 10): " mod:C" is not a class name'),
    # each kind's keys
    (worker_block("{probe: inflight, path: /m}"), "capacity.path (line 10): unknown key for inflight probes "
                                                  "(expected one of: probe, type, interval, max_age, limit, wait)"),
    (worker_block("{probe: none, url: 'http://x:1'}"), "capacity.url (line 10): unknown key for inflight probes"),
    (worker_block("{probe: ratelimit, secret_file: /s}"),
     "capacity.secret_file (line 10): unknown key for ratelimit probes"),
    (worker_block("{probe: prometheus, secret_file: /s}"),
     "capacity.secret_file (line 10): unknown key for prometheus probes (expected one of: probe, type, interval, "
     "max_age, limit, wait, path, url, running, waiting)"),
    (worker_block("{probe: prometheus, class: 'a:B'}"), "capacity.class (line 10): unknown key for prometheus probes"),
    (worker_block("{probe: prometheus, path: metrics}"),
     'capacity.path (line 10): "metrics" is not a URL path (starting with /, no spaces)'),
    (worker_block("{probe: prometheus, running: []}"),
     "capacity.running (line 10): a list is not a metric name or a list of them"),
    (worker_block("{probe: inflight, interval: 0s}"), "capacity.interval (line 10):"),
    (worker_block("{probe: inflight, limit: 0}"), "capacity.limit (line 10): 0 is out of range"),
    # where a kind is for
    (worker_block("{probe: registry, url: 'http://x:1/v1/registry', secret_file: /s}"),
     "capacity.probe (line 10): a registry probe reads another elasticd: it describes a node (nodes:), not a "
     "worker"),
    (worker_block("{type: registry, url: 'http://x:1/v1/registry', secret_file: /s}"),
     "capacity.type (line 10): a registry probe reads another elasticd"),
    (worker_block("{probe: prometheus, url: 'http://x:1/metrics'}"),
     "capacity.url (line 10): a worker is probed on its own socket: give its path (e.g. /metrics), not a URL"),
    # registry: a url and a secret_file
    (node_block("{probe: registry, url: 'http://x:1/v1/registry'}"),
     "nodes[0].capacity.secret_file (line 11): missing: a registry probe needs a url and a secret_file"),
    (node_block("{probe: registry, url: 'http://x:1/v1/registry', secret_file: null}"),
     "nodes[0].capacity.secret_file (line 11): missing: a registry probe needs a url and a secret_file"),
    (node_block("{probe: registry, secret_file: /s}"),
     "nodes[0].capacity.url (line 11): missing: a registry probe needs a url and a secret_file"),
    (node_block("{probe: registry, url: null, secret_file: /s}"), "nodes[0].capacity.url (line 11): missing"),
    (node_block("{probe: registry, url: 'http://x:1/r', secret_file: relative/s}"),
     'nodes[0].capacity.secret_file (line 11): "relative/s" is not an absolute path'),
    (node_block("{probe: registry, url: 'ftp://x/r', secret_file: /s}"),
     'nodes[0].capacity.url (line 11): "ftp://x/r" is not an http:// or https:// URL'),
    (node_block("{probe: registry, url: 'http://x:1/r', secret_file: /s, app: shop}"),
     'nodes[0].capacity.app (line 11): "shop" is not TENANT/APP'),
    (node_block("{probe: registry, url: 'http://x:1/r', secret_file: /s, path: /m}"),
     "nodes[0].capacity.path (line 11): unknown key for registry probes"),
])
def test_a_bad_capacity_block_is_refused_naming_the_key_and_line(group, error):
    assert f"{G}.{error}" in refused(group)


# -- nodes: groups ---------------------------------------------------------------------------------------------


def test_a_nodes_group() -> None:
    group = group_of("""
        concurrency: 4
        capacity: {probe: prometheus, path: /stats}
        nodes:
          - url: http://10.0.0.2:8080
          - {url: "http://gpu-1", name: gpu-1, capacity: {probe: inflight}}
          - url: "http://[::1]:9000/"
    """)
    default = Capacity(probe="prometheus", path="/stats", block={"probe": "prometheus", "path": "/stats"})
    assert group.nodes == (
        Node("10.0.0.2:8080", "10.0.0.2", 8080, "http://10.0.0.2:8080", default),  # the group's block: its default
        Node("gpu-1", "gpu-1", 80, "http://gpu-1:80", Capacity(block={"probe": "inflight"})),  # its own block
        Node("[::1]:9000", "::1", 9000, "http://[::1]:9000", default),  # the name: host:port
    )
    assert (group.name, group.command, group.concurrency, group.capacity, group.spawned) == (
        "green", (), 4, default, False)
    assert group.nodes[2].address == "[::1]:9000"


def test_a_nodes_group_without_any_capacity_block_has_none() -> None:
    group = group_of("nodes: [{url: 'http://a:1'}, {url: 'http://b:2'}]")
    assert [(n.name, n.capacity) for n in group.nodes] == [("a:1", None), ("b:2", None)]


@pytest.mark.parametrize(("group", "error"), [
    ("nodes:\n  - name: a", "nodes[0].url (line 10): missing: a node is an HTTP upstream (url: http://HOST:PORT)"),
    ("nodes:\n  - url: null", "nodes[0].url (line 10): missing: a node is an HTTP upstream"),
    ("nodes:\n  - url: 'https://h:443'",
     'nodes[0].url (line 10): "https://h:443": the front speaks plain HTTP to its upstreams'),
    ("nodes:\n  - url: 'http://h:1/api'",
     'nodes[0].url (line 10): "http://h:1/api": a node is a host and a port (requests keep their own path)'),
    ("nodes:\n  - url: 'http://h:1/?x=1'", 'nodes[0].url (line 10): "http://h:1/?x=1": a node is a host and a port'),
    ("nodes:\n  - url: 'http://u@h:1'", 'nodes[0].url (line 10): "http://u@h:1": a node is a host and a port'),
    ("nodes:\n  - url: 'h:1'", 'nodes[0].url (line 10): "h:1" is not http://HOST:PORT'),
    ("nodes:\n  - url: 'http://h:99999'", 'nodes[0].url (line 10): "http://h:99999" has no valid port'),
    ("nodes:\n  - url: 'http://h:1'\n    port: 2", "nodes[0].port (line 11): unknown key"),
    ("nodes:\n  - url: 'http://h:1'\n    name: 'a b'", 'nodes[0].name (line 11): "a b" is not a node name'),
    ("nodes:\n  - url: 'http://h:1'\n  - url: 'http://h:1'",
     'nodes[1].url (line 11): "h:1" names two nodes of the group (give each a name:)'),
    ("nodes:\n  - url: 'http://h:1'\n    name: a\n  - url: 'http://h:2'\n    name: a",
     'nodes[1].name (line 13): "a" names two nodes of the group'),
    ("nodes:\n  - url: 'http://h:1'\n  - url: 'http://h:2'\n    name: 'h:1'",
     'nodes[1].name (line 12): "h:1" names two nodes of the group'),  # a name equal to another's default
    ("nodes: []", "nodes (line 9): must be a non-empty list of nodes ({url: http://HOST:PORT}), not an empty list"),
    ("nodes:", "nodes (line 9): must be a non-empty list of nodes ({url: http://HOST:PORT}), not missing"),
    ("nodes: 'http://h:1'", "nodes (line 9): must be a non-empty list of nodes"),
    ("nodes:\n  - 'http://h:1'", "nodes[0] (line 10): must be a mapping"),
    # a group is either command: or nodes:
    ("command: [x]\nnodes: [{url: 'http://h:1'}]",
     "command (line 9): a group is either command: (workers elasticd starts) or nodes: (HTTP upstreams it does not "
     "start), and command is for a command: group"),
    ("python: /usr/bin/python3\nnodes: [{url: 'http://h:1'}]", "python (line 9): a group is either command:"),
    ("env: {A: b}\nnodes: [{url: 'http://h:1'}]", "env (line 9): a group is either command:"),
    ("pool: {max_workers: 2}\nnodes: [{url: 'http://h:1'}]", "pool (line 9): a group is either command:"),
    ("nodes: [{url: 'http://h:1', capacity: {probe: bogus}}]", 'nodes[0].capacity.probe (line 9): "bogus" is not a'),
])
def test_a_bad_nodes_group_is_refused_naming_the_key_and_line(group, error):
    assert f"{G}.{error}" in refused(group)


# -- server.registry -------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("server", "registry"), [
    ("", None),
    ("server: {registry: null}\n", None),
    ("server: {registry: {secret_file: /etc/elastic/registry.secret}}\n",
     Registry("/etc/elastic/registry.secret", ttl=10.0)),  # ttl: 10s by default
    ("server: {registry: {secret_file: /s, ttl: 30s, key_file: /k, instance: host-a.example}}\n",
     Registry("/s", ttl=30.0, key_file="/k", instance="host-a.example")),
    ("server: {registry: {secret_file: /s, ttl: 500ms}}\n", Registry("/s", ttl=0.5)),
])
def test_the_registry_section(server, registry):
    assert parse("command: [x]", server).server.registry == registry


@pytest.mark.parametrize(("server", "error"), [
    ("server: {registry: {ttl: 5s}}\n", "server.registry.secret_file (line 1): missing: the registry is signed "
                                        "with a secret"),
    ("server: {registry: {secret_file: null}}\n", "server.registry.secret_file (line 1): missing: the registry"),
    ("server: {registry: {secret_file: s}}\n", 'server.registry.secret_file (line 1): "s" is not an absolute path'),
    ("server: {registry: {secret_file: /s, ttl: 0s}}\n", "server.registry.ttl (line 1):"),
    ("server: {registry: {secret_file: /s, key_file: k}}\n", 'server.registry.key_file (line 1): "k" is not an'),
    ("server: {registry: {secret_file: /s, url: 'http://x:1'}}\n", "server.registry.url (line 1): unknown key "
                                                                   "(expected one of: secret_file, ttl, key_file, "
                                                                   "instance)"),
    ("server: {registry: /s}\n", "server.registry (line 1): must be a mapping"),
])
def test_a_bad_registry_section_is_refused(server, error):
    assert error in refused("command: [x]", server)


# -- the factory: which class ----------------------------------------------------------------------------------


class Sink:
    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []

    def set(self, node: str, reading: Reading) -> None:
        self.calls.append(("set", node, reading))

    def forget(self, node: str, source: str | None) -> None:
        self.calls.append(("forget", node, source))

    def failed(self, node: str, reason: str) -> None:
        pass


WORKER = ProbeTarget("acme.shop.green.1", "acme", "shop", "green", 8, socket="/run/elasticd/w1.sock")
NODE = ProbeTarget("acme.shop.green@gpu-1", "acme", "shop", "green", 4, url="http://gpu-1:8000")


@pytest.mark.parametrize(("config", "cls"), [
    (Capacity(), None),  # inflight: no probe object
    (Capacity(probe="none"), None),
    (Capacity(probe="ratelimit"), None),  # passive: nothing runs
    (Capacity(probe="prometheus"), PrometheusProbe),
    (Capacity(probe="registry", url="http://x:1/v1/registry", secret_file="/s"), RegistryProbe),
])
def test_the_class_a_block_asks_for(config, cls):
    assert probe_class(config) is cls


@pytest.mark.parametrize(("config", "error"), [
    (Capacity(probe="bogus"), "'bogus' is not a kind of probe"),
    (Capacity(probe="custom", cls="elasticd_no_such_module_q7:Probe"),
     "custom probe elasticd_no_such_module_q7:Probe: cannot import elasticd_no_such_module_q7: ModuleNotFoundError"),
    (Capacity(probe="custom", cls="json:JSONDecoder"),
     "custom probe json:JSONDecoder: JSONDecoder in json is not a subclass of elasticd.probes.probe.Probe"),
    (Capacity(probe="custom", cls="json:no_such_name"), "no_such_name in json is not a subclass"),
    (Capacity(probe="custom", cls="os:path"), "path in os is not a subclass"),  # a module, not a class
    (Capacity(probe="custom", cls="json:dumps"), "dumps in json is not a subclass"),  # a function
    (Capacity(probe="custom", cls="elasticd.probes.probe:Probe"), "that is the base class, which polls nothing"),
])
def test_a_class_that_cannot_be_had_is_a_probe_error(config, error):
    with pytest.raises(ProbeError) as info:
        probe_class(config)
    assert error in str(info.value)


@pytest.mark.parametrize("name", ["os.path/x", "a:b:c", ".mod:C", "mod:", "mod.C", "", None, "os:system()",
                                  "../evil:C", "mod: C", ":C"])
def test_a_bad_class_name_in_a_model_is_refused_before_any_import(monkeypatch, name):
    imported: list[str] = []
    monkeypatch.setattr(factory.importlib, "import_module", lambda module, *a: imported.append(module))
    with pytest.raises(ProbeError) as info:
        probe_class(Capacity(probe="custom", cls=name))
    assert str(info.value) == f"{name or ''!r} is not a class name (\"package.module:Class\")"
    assert imported == []


# -- the factory: the probe built ------------------------------------------------------------------------------

CUSTOM = '''
from elasticd.probes.probe import Probe


class Queue(Probe):
    source = "queue"

    def __init__(self, target, config, sink, **options):
        if config.block.get("queue") == "explode":
            raise ValueError("queue: explode is no queue")
        if config.block.get("queue") == "bug":
            raise KeyError("oops")
        super().__init__(target, config, sink, **options)
        self.queue = config.block["queue"]

    async def poll(self):
        self.report(1, 2)


NotAProbe = dict
'''


@pytest.fixture
def custom_module(tmp_path, monkeypatch):
    """A module of custom probes, importable as ``elasticd_test_custom_probes``."""
    name = "elasticd_test_custom_probes"
    (tmp_path / f"{name}.py").write_text(CUSTOM)
    (tmp_path / "elasticd_test_broken_probes.py").write_text("raise RuntimeError('boom at import')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    import sys
    for module in (name, "elasticd_test_broken_probes"):
        monkeypatch.delitem(sys.modules, module, raising=False)
    return name


def _no_running_loop() -> bool:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return True
    return False


def test_a_custom_class_is_built_with_the_target_and_its_block(custom_module):
    capacity = group_of(worker_block(f"{{probe: custom, class: '{custom_module}:Queue', queue: jobs, interval: 3s}}")
                        ).capacity
    assert capacity is not None
    sink = Sink()
    assert _no_running_loop()  # built with no event loop: constructing needs none
    probe = build_probe(WORKER, capacity, sink, sharing=2)
    assert probe is not None and type(probe).__name__ == "Queue" and type(probe).__module__ == custom_module
    assert probe.target is WORKER and probe.sink is sink and probe.node == "acme.shop.green.1"
    assert probe.config is capacity
    assert dict(probe.config.block) == {"probe": "custom", "class": f"{custom_module}:Queue", "queue": "jobs",
                                        "interval": "3s"}
    assert probe.queue == "jobs"  # type: ignore[attr-defined]
    assert (probe.poll_interval, probe.state, probe.polls, probe.is_stopped) == (6.0, "new", 0, False)
    assert sink.calls == []  # built, not started: nothing reported, nothing forgotten


@pytest.mark.parametrize(("cls", "queue", "error"), [
    ("elasticd_test_broken_probes:Queue", "jobs",
     "custom probe elasticd_test_broken_probes:Queue: cannot import elasticd_test_broken_probes: RuntimeError: "
     "boom at import"),
    ("elasticd_test_custom_probes:NotAProbe", "jobs", "NotAProbe in elasticd_test_custom_probes is not a subclass"),
    ("elasticd_test_custom_probes:Missing", "jobs", "Missing in elasticd_test_custom_probes is not a subclass"),
    ("elasticd_test_custom_probes:Queue", "explode", "queue: explode is no queue"),  # its constructor's ValueError
    ("elasticd_test_custom_probes:Queue", "bug", "KeyError: 'oops'"),  # anything else: its type named
])
def test_a_custom_probe_that_does_not_build_is_a_probe_error(custom_module, cls, queue, error):
    config = Capacity(probe="custom", cls=cls, block={"probe": "custom", "class": cls, "queue": queue})
    with pytest.raises(ProbeError) as info:
        build_probe(WORKER, config, Sink())
    assert error in str(info.value)


@pytest.mark.parametrize("config", [Capacity(), Capacity(probe="none"), Capacity(probe="ratelimit")])
def test_no_probe_object_for_inflight_none_and_ratelimit(config):
    assert build_probe(WORKER, config, Sink()) is None


@pytest.mark.parametrize(("target", "config", "url"), [
    (WORKER, Capacity(probe="prometheus"), "http://localhost/metrics"),  # on the worker's own socket
    (WORKER, Capacity(probe="prometheus", path="/stats"), "http://localhost/stats"),
    (NODE, Capacity(probe="prometheus"), "http://gpu-1:8000/metrics"),  # the node's URL and the path
    (ProbeTarget("n", "acme", "shop", "green", 4, url="http://gpu-1:8000/"), Capacity(probe="prometheus"),
     "http://gpu-1:8000/metrics"),
    (NODE, Capacity(probe="prometheus", url="http://gpu-1:9100/m"), "http://gpu-1:9100/m"),  # its own URL
])
def test_a_prometheus_probe_is_built_without_a_loop(target, config, url):
    assert _no_running_loop()
    probe = build_probe(target, config, Sink(), sharing=3)
    assert isinstance(probe, PrometheusProbe)
    assert (probe.url, probe.target, probe.poll_interval, probe.source) == (url, target, 6.0, "prometheus")
    assert probe.running and probe.waiting  # the seed's defaults


def _registry(tmp_path: Path, secret: bytes | None, key: bytes | None = None, app: str | None = None) -> Capacity:
    secret_file = tmp_path / "registry.secret"
    if secret is not None:
        secret_file.write_bytes(secret)
    key_file = None
    if key is not None:
        (tmp_path / "registry.key").write_bytes(key)
        key_file = str(tmp_path / "registry.key")
    return Capacity(probe="registry", url="http://10.0.0.2:9464/v1/registry", secret_file=str(secret_file),
                    key_file=key_file, app=app)


@pytest.mark.parametrize(("secret", "key", "app", "built"), [
    (b"s" * 32, None, None, (b"s" * 32, None, ("acme", "shop"))),
    (b"  " + b"s" * 32 + b"\n", None, None, (b"s" * 32, None, ("acme", "shop"))),  # the ends stripped
    (b"s" * 40, b"reader-key-1\nrest\n", "globex/blog", (b"s" * 40, "reader-key-1", ("globex", "blog"))),
])
def test_a_registry_probe_reads_its_secret_at_build(tmp_path, secret, key, app, built):
    assert _no_running_loop()
    probe = build_probe(NODE, _registry(tmp_path, secret, key, app), Sink())
    assert isinstance(probe, RegistryProbe)
    assert (probe.secret, probe.key, probe.app) == built
    assert (probe.url, probe.source, probe.last_accepted) == ("http://10.0.0.2:9464/v1/registry", "registry", None)


@pytest.mark.parametrize(("secret", "key", "error"), [
    (None, None, "registry.secret: cannot read the registry secret: No such file or directory"),
    (b"s" * 31, None, "registry.secret: the registry secret is 31 bytes; at least 32 are needed"),
    (b"s" * 31 + b"\n", None, "registry.secret: the registry secret is 31 bytes"),  # a newline is not a byte of it
    (b"", None, "registry.secret: the registry secret is 0 bytes"),
    (b"s" * 32, b"", "registry.key: the registry key must be one line of printable ASCII, without spaces"),
    (b"s" * 32, b"two words\n", "registry.key: the registry key must be one line of printable ASCII"),
])
def test_a_registry_probe_whose_secret_cannot_be_had_is_a_probe_error(tmp_path, secret, key, error):
    with pytest.raises(ProbeError) as info:
        build_probe(NODE, _registry(tmp_path, secret, key), Sink())
    assert str(info.value).startswith(str(tmp_path))  # the file named, in full
    assert error in str(info.value)


def test_a_nodes_group_has_no_socket_path_to_be_too_long():
    long_dir = "/run/" + "r" * 60  # the tenant's channel socket fits under it; a worker's of this group would not
    text = f"""\
server: {{runtime_dir: {long_dir}}}
tenants:
  acme:
    apps:
      shop:
        domains: [shop.example]
        root: /srv
        groups:
          remote-with-a-long-name:
            nodes: [{{url: "http://10.0.0.5:8000"}}]
"""
    assert parse_config(text).tenants["acme"].apps["shop"].groups["remote-with-a-long-name"].nodes
    with pytest.raises(ConfigError, match=r"socket paths under server\.runtime_dir"):
        parse_config(text.replace('nodes: [{url: "http://10.0.0.5:8000"}]', 'command: ["x"]'))
