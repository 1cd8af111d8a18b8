"""A capacity probe's read, and a registry snapshot, past their bounds. The read (``probe.Probe.fetch``): 4 MiB,
the whole answer in connect + read time, never decompressed — each exceeded against a real server, for both
kinds. The snapshot (``registry_check``): its bytes and its JSON values counted before it is parsed, its apps,
groups and workers once parsed — each as a table past and at its bound, and once through a real probe."""

from __future__ import annotations

import asyncio
import gzip
import json
import time
from typing import Any

import pytest
from aiohttp import web
from test_probes_lifecycle import (
    APPS,
    NODE,
    SECRET,
    TTL,
    VLLM,
    Rig,
    Sink,
    prometheus,
    registry,
    rig,
    target,
    until,
)

import elasticd.probes.probe as probe_module
import elasticd.probes.registry_check as registry_check
from elasticd.probes.kinds import PrometheusProbe, RegistryProbe
from elasticd.probes.registry_check import (
    MALFORMED,
    MAX_APPS,
    MAX_GROUPS,
    MAX_SNAPSHOT_BYTES,
    MAX_SNAPSHOT_VALUES,
    MAX_WORKERS,
    TOO_BIG,
    Accepted,
    Refused,
    check_snapshot,
    values_at_most,
)
from elasticd.probes.registry_snapshot import SIGNATURE_HEADER, canonical, sign

__all__ = ["rig"]  # a fixture, used by name

NOW = 1_000_000.0


def test_the_reads_bounds() -> None:
    assert (probe_module.CONNECT_TIMEOUT, probe_module.READ_TIMEOUT, probe_module.MAX_BODY) == (2.0, 3.0, 4 << 20)
    assert (MAX_SNAPSHOT_BYTES, MAX_SNAPSHOT_VALUES) == (probe_module.MAX_BODY, 1 << 18)
    assert (MAX_APPS, MAX_GROUPS, MAX_WORKERS) == (16384, 256, 4096)


# -- the read, against real servers ------------------------------------------------------------------------------


def _signed(body: bytes, **headers: str) -> web.Response:
    return web.Response(body=body, content_type="application/json",
                        headers={SIGNATURE_HEADER: sign(SECRET, body), **headers})


def _snapshot(apps: Any, generated_at: float | None = None) -> bytes:
    return canonical({"version": 1, "instance": "host-b", "generated_at": generated_at or round(time.time(), 3),
                      "ttl": TTL, "apps": apps})


async def test_an_answer_over_4_mib_is_refused_as_too_big_for_either_kind(rig: Rig, tmp_path) -> None:
    flood = b"#" * probe_module.MAX_BODY + b"\nvllm:num_requests_running 1\n"  # one byte a line over the bound

    async def metrics(request: web.Request) -> web.Response:
        return web.Response(body=flood, content_type="text/plain")

    async def snapshot(request: web.Request) -> web.Response:
        return _signed(_snapshot(APPS)[:-1] + b" " * probe_module.MAX_BODY + b"}")  # signed: only its size is wrong

    base = await rig.serve({"/metrics": metrics, "/v1/registry": snapshot})
    pages, snapshots = Sink(), Sink()
    scraped = rig.start(PrometheusProbe(target(url=base), prometheus(5.0), pages))
    read = rig.start(RegistryProbe(target(), registry(tmp_path, f"{base}/v1/registry"), snapshots))
    await until(lambda: scraped.state == "too big" and read.state == "too big", timeout=4.0, what="both refused")
    assert pages.sets() == [] and snapshots.sets() == []


async def test_an_answer_is_never_decompressed(rig: Rig, tmp_path) -> None:
    asked: list[str | None] = []
    bomb = gzip.compress(b"\0" * (8 << 20))  # 8 MiB once inflated: "too big" had it been

    async def page(request: web.Request) -> web.Response:
        asked.append(request.headers.get("Accept-Encoding"))
        return web.Response(body=gzip.compress(VLLM), headers={"Content-Encoding": "gzip",
                                                                "Content-Type": "text/plain"})

    async def inflating(request: web.Request) -> web.Response:
        return web.Response(body=bomb, headers={"Content-Encoding": "gzip", "Content-Type": "text/plain"})

    async def snapshot(request: web.Request) -> web.Response:
        packed = gzip.compress(_snapshot(APPS))
        return _signed(packed, **{"Content-Encoding": "gzip"})  # signed as sent: the signature holds, the JSON not

    base = await rig.serve({"/metrics": page, "/bomb": inflating, "/v1/registry": snapshot})
    sinks = [Sink(), Sink(), Sink()]
    probes = [rig.start(PrometheusProbe(target(url=base), prometheus(5.0), sinks[0])),
              rig.start(PrometheusProbe(target(url=base), prometheus(5.0, path="/bomb"), sinks[1])),
              rig.start(RegistryProbe(target(), registry(tmp_path, f"{base}/v1/registry"), sinks[2]))]
    await until(lambda: [p.state for p in probes] == ["no metric", "no metric", MALFORMED], what="all three read")
    assert asked == ["identity"] and all(sink.sets() == [] for sink in sinks)


async def test_a_registry_that_trickles_is_refused_at_the_reads_time(rig: Rig, tmp_path, monkeypatch) -> None:
    async def trickle(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={SIGNATURE_HEADER: "sha256=" + "0" * 64})
        await response.prepare(request)
        for _ in range(40):  # a byte every 0.1 s: each read in time, the whole answer not
            await response.write(b" ")
            await asyncio.sleep(0.1)
        return response

    monkeypatch.setattr(probe_module, "READ_TIMEOUT", 0.5)
    monkeypatch.setattr(probe_module, "CONNECT_TIMEOUT", 0.2)
    base = await rig.serve({"/v1/registry": trickle})
    sink = Sink()
    started = time.monotonic()
    read = rig.start(RegistryProbe(target(), registry(tmp_path, f"{base}/v1/registry", interval=5.0), sink))
    await until(lambda: read.state == "unreachable", timeout=3.0, what="the trickle timed out")
    assert time.monotonic() - started < 1.5 and sink.sets() == []  # the whole answer's 0.7 s, not its 4 s


async def test_a_signed_snapshot_over_an_entry_bound_is_refused_whole(rig: Rig, tmp_path) -> None:
    serving = {"apps": [{"tenant": "t", "app": f"a{i}", "groups": []} for i in range(MAX_APPS)] + APPS}

    async def snapshot(request: web.Request) -> web.Response:
        return _signed(_snapshot(serving["apps"]))

    base = await rig.serve({"/v1/registry": snapshot})
    sink = Sink()
    read = rig.start(RegistryProbe(target(), registry(tmp_path, f"{base}/v1/registry"), sink))
    await until(lambda: read.state == TOO_BIG, what="refused for its apps")
    assert NODE not in sink.readings and sink.sets() == []  # not read in part: "t/a" was in it
    serving["apps"] = APPS
    await until(lambda: read.state == "ok", what="a snapshot within the bounds accepted")
    assert sink.readings[NODE].used == 4.0


# -- the snapshot's bounds, as tables ------------------------------------------------------------------------------


def _workers(count: int) -> list[dict[str, Any]]:
    return [{"id": f"w{i}", "healthy": True, "open": 0, "limit": 1, "capacity": None} for i in range(count)]


def _apps(apps: int = 1, groups: int = 1, workers: int = 1) -> list[dict[str, Any]]:
    return [{"tenant": "t", "app": f"a{a}", "groups": [{"group": f"g{g}", "workers": _workers(workers)}
                                                      for g in range(groups)]} for a in range(apps)]


def _check(body: bytes) -> Accepted | Refused:
    return check_snapshot(200, body, sign(SECRET, body), SECRET, NOW, None)


@pytest.mark.parametrize(("name", "body", "said"), [
    ("one byte over the bytes", _snapshot([], NOW)[:-1] + b" " * (MAX_SNAPSHOT_BYTES - len(_snapshot([], NOW)) + 1)
     + b"}", f"at most {MAX_SNAPSHOT_BYTES} are read"),
    ("tiny values past the count", _snapshot([0] * MAX_SNAPSHOT_VALUES, NOW), f"at most {MAX_SNAPSHOT_VALUES}"),
    ("commas in a string count too (never too few)", _snapshot([], NOW)[:-1] + b',"x":"' + b"," * MAX_SNAPSHOT_VALUES
     + b'"}', "JSON values"),
])
def test_a_snapshot_past_its_bytes_or_values_is_refused_before_it_is_parsed(name: str, body: bytes, said: str,
                                                                          monkeypatch) -> None:
    def parse(body: bytes) -> None:
        raise AssertionError("parsed")

    monkeypatch.setattr(registry_check, "_parse", parse)
    refused = _check(body)
    assert isinstance(refused, Refused) and refused.state == TOO_BIG and said in refused.detail, (name, refused)


@pytest.mark.parametrize(("name", "apps", "said"), [
    ("apps", _apps(apps=MAX_APPS + 1, workers=0), f"{MAX_APPS + 1} apps"),
    ("groups in an app", _apps(groups=MAX_GROUPS + 1, workers=0), f"{MAX_GROUPS + 1} groups"),
    ("workers in a group", _apps(workers=MAX_WORKERS + 1), f"{MAX_WORKERS + 1} workers"),
])
def test_a_snapshot_past_an_entry_bound_is_refused_whole(name: str, apps: list[dict[str, Any]], said: str) -> None:
    refused = _check(_snapshot(apps, NOW - 1))
    assert isinstance(refused, Refused) and refused.state == TOO_BIG and said in refused.detail, (name, refused)


@pytest.mark.parametrize(("name", "apps"), [
    ("apps", _apps(apps=MAX_APPS, workers=0)),
    ("groups in an app", _apps(groups=MAX_GROUPS, workers=0)),
    ("workers in a group", _apps(workers=MAX_WORKERS)),
])
def test_a_snapshot_at_its_entry_bounds_is_accepted(name: str, apps: list[dict[str, Any]]) -> None:
    body = _snapshot(apps, NOW - 1)
    assert len(body) <= MAX_SNAPSHOT_BYTES and values_at_most(body) <= MAX_SNAPSHOT_VALUES, name
    assert isinstance(_check(body), Accepted), name


@pytest.mark.parametrize(("body", "values"), [
    (b"{}", 1), (b"[]", 1), (b"0", 1), (b"[1,2,3]", 4), (b'{"a":[1,{"b":2}]}', 5), (b'["a,b"]', 2),
])
def test_values_at_most_never_counts_too_few(body: bytes, values: int) -> None:
    def count(value: Any) -> int:
        inner = value.values() if isinstance(value, dict) else value if isinstance(value, list) else ()
        return 1 + sum(count(v) for v in inner)

    assert count(json.loads(body)) == values <= values_at_most(body)
