"""A tenant's ``nodes:`` URL or capacity probe URL may not point at elasticd's own listeners (issue 43): the pure
judgement (listener_guard/own.py) as a table, then the refusal at load with its key and line."""

from __future__ import annotations

import asyncio
import socket

import pytest

from elasticd.config import ConfigError, parse_config
from elasticd.config.model import Address
from elasticd.front import serving
from elasticd.listener_guard.own import OwnListeners, points_at
from elasticd.probes import probe

METRICS = Address("127.0.0.1", 9464)
AGENT_ANY = Address("0.0.0.0", 9465)
HOST_ADDRESSES = {"10.0.0.5", "2001:db8::5"}
HOST_NAMES = {"web-7", "web-7.example.net"}


@pytest.mark.parametrize(("host", "port", "listeners", "expected"), [
    ("127.0.0.1", 9464, [METRICS], METRICS),
    ("localhost", 9464, [METRICS], METRICS),
    ("LocalHost.", 9464, [METRICS], METRICS),
    ("metrics.localhost", 9464, [METRICS], METRICS),  # RFC 6761
    ("0.0.0.0", 9464, [METRICS], METRICS),  # (a connect to 0.0.0.0 goes to loopback)
    ("::ffff:127.0.0.1", 9464, [METRICS], METRICS),
    ("127.0.0.2", 9464, [METRICS], None),  # another loopback address: not where it listens
    ("127.0.0.1", 9465, [METRICS], None),  # another port
    ("10.0.0.5", 9464, [METRICS], None),  # the host's address, the listener on loopback only
    ("10.0.0.5", 9465, [METRICS, AGENT_ANY], AGENT_ANY),  # ... or on every address
    ("127.0.0.1", 9465, [AGENT_ANY], AGENT_ANY),
    ("2001:db8::5", 9465, [AGENT_ANY], AGENT_ANY),
    ("web-7", 9464, [METRICS], METRICS),  # the host's own name: taken as any of its addresses
    ("web-7.example.net", 9465, [AGENT_ANY], AGENT_ANY),
    ("10.0.0.6", 9465, [AGENT_ANY], None),  # another host
    ("gpu-1", 9464, [METRICS], None),
    ("10.0.0.5", 9464, [Address("10.0.0.5", 9464)], Address("10.0.0.5", 9464)),
])
def test_what_reaches_elasticds_own_listener(host, port, listeners, expected):
    assert points_at(host, port, listeners, HOST_ADDRESSES, HOST_NAMES) == expected


def _config(group: str) -> str:
    """The group's first key is on line 11."""
    return ("server:\n  metrics_listen: 127.0.0.1:9464\n  agent_listen: 0.0.0.0:9465\ntenants:\n  acme:\n    apps:\n"
            "      shop:\n        domains: [shop.localhost]\n        root: /srv\n        groups:\n"
            f"          main:\n{group}")


@pytest.mark.parametrize(("group", "expected"), [
    ("            nodes:\n              - url: http://localhost:9464\n",
     "tenants.acme.apps.shop.groups.main.nodes[0].url (line 13): points at elasticd's own metrics_listen "
     "(127.0.0.1:9464): elasticd would ask itself, and answer the tenant with what that listener keeps from every "
     "tenant"),
    ("            nodes:\n              - url: http://10.9.9.9:80\n              - url: http://127.0.0.1:9465\n",
     "tenants.acme.apps.shop.groups.main.nodes[1].url (line 14): points at elasticd's own agent_listen (0.0.0.0:9465)"),
    ("            nodes:\n              - url: http://10.9.9.9:80\n                capacity:\n"
     "                  probe: prometheus\n                  url: http://127.0.0.1:9464/metrics\n",
     "tenants.acme.apps.shop.groups.main.nodes[0].capacity.url (line 16): points at elasticd's own metrics_listen"),
])
def test_a_url_at_elasticds_own_listener_is_refused_with_its_key_and_line(group, expected):
    with pytest.raises(ConfigError) as info:
        parse_config(_config(group))
    assert str(info.value.issues[0]).startswith(expected), info.value.issues


def test_a_node_elsewhere_loads():
    config = parse_config(_config("            nodes:\n              - url: http://10.9.9.9:9464\n"))
    assert config.tenants["acme"].apps["shop"].groups["main"].nodes[0].port == 9464


# ------------------------------------------------------------------------------------------------ at connect time

@pytest.mark.parametrize(("bound", "peer", "own", "reached"), [
    ([("127.0.0.1", 9464)], ("127.0.0.1", 9464), None, True),
    ([("127.0.0.1", 9464)], ("127.0.0.1", 9465), None, False),
    ([("127.0.0.1", 9464)], ("::ffff:127.0.0.1", 9464), None, True),
    ([("0.0.0.0", 9465)], ("127.0.0.1", 9465), None, True),
    ([("0.0.0.0", 9465)], ("10.0.0.5", 9465), ("10.0.0.5", 40000), True),  # this host's address
    ([("0.0.0.0", 9465)], ("10.0.0.6", 9465), ("10.0.0.5", 40000), False),  # another host's
    ([("::", 9465)], ("::1", 9465), None, True),
    ([], ("127.0.0.1", 9464), None, False),
])
def test_which_connections_reach_elasticds_own_listeners(bound, peer, own, reached):
    listeners = OwnListeners()
    listeners.set(bound)
    assert listeners.reached(peer, own) is reached


def test_a_node_connect_that_reaches_elasticds_own_listener_fails_before_a_byte_goes(monkeypatch):
    own = OwnListeners()
    monkeypatch.setattr(serving, "OWN_LISTENERS", own)

    async def run() -> None:
        accepted: list[bytes] = []

        async def keep(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            accepted.append(await reader.read())
            writer.close()

        server = await asyncio.start_server(keep, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        transport, _ = await serving.open_to(asyncio.Protocol, f"127.0.0.1:{port}")  # (not ours yet: connects)
        transport.close()
        own.set([("127.0.0.1", port)])
        with pytest.raises(ConnectionRefusedError, match="is elasticd's own listener"):
            await serving.open_to(asyncio.Protocol, f"127.0.0.1:{port}")
        await asyncio.sleep(0.1)
        server.close()
        await server.wait_closed()
        assert accepted == [b"", b""]  # (the second connection carried nothing)

    asyncio.run(run())


def test_a_probe_name_that_resolves_to_elasticds_own_listener_is_not_connected_to(monkeypatch):
    own = OwnListeners()
    own.set([("127.0.0.1", 9464)])
    monkeypatch.setattr(probe, "OWN_LISTENERS", own)

    async def run() -> None:
        resolver = probe._NotOwnListeners()
        with pytest.raises(OSError, match="resolves to elasticd's own listener"):
            await resolver.resolve("localhost", 9464, socket.AF_INET)
        assert {entry["host"] for entry in await resolver.resolve("localhost", 9465, socket.AF_INET)} == {"127.0.0.1"}
        await resolver.close()

    asyncio.run(run())
