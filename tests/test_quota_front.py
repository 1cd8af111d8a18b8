"""Tenant quotas through the front with a demo worker: concurrency (503) and rate (429) refusals with
Retry-After, another tenant untouched, a reload that re-limits in place, and the refusal metrics."""

from __future__ import annotations

import asyncio
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from test_demo import DemoWorker
from test_front import client, front, no_errors_logged, run

from elasticd.config.model import Quotas
from elasticd.front import Upstream

__all__ = ["no_errors_logged"]


@pytest.fixture(scope="module")
def worker(tmp_path_factory: pytest.TempPathFactory):
    demo = DemoWorker("q1", f"unix:{tmp_path_factory.mktemp('quota')}/q1.sock")
    try:
        yield [Upstream(demo.worker_id, demo.socket_path)]
    finally:
        demo.stop()


async def fetch(request: Any, path: str, host: str = "shop.localhost") -> tuple[int, str | None]:
    async with request(path, host=host) as resp:
        await resp.read()
        return resp.status, resp.headers.get("Retry-After")


def metrics(f: Any) -> str:
    registry = CollectorRegistry()
    registry.register(f.collector())
    return generate_latest(registry).decode()


def test_concurrency_quota(worker: list[Upstream]) -> None:
    """max_concurrent_requests: 2 with 6 parallel /sleep?ms=1500: exactly 2 succeed, 4 get 503 + Retry-After;
    the other tenant, meanwhile, is served."""
    quotas = {"acme": Quotas(max_concurrent_requests=2), "globex": Quotas()}

    async def scenario() -> tuple[Counter, list[tuple[int, str | None]], str, int]:
        async with front(worker, quotas=quotas) as f, client(f) as request:
            slow = [asyncio.ensure_future(fetch(request, "/sleep?ms=1500")) for _ in range(6)]
            await asyncio.sleep(0.2)  # all six arrived; two are at the worker
            other = await asyncio.gather(*(fetch(request, "/sleep?ms=10", host="blog.localhost") for _ in range(3)))
            results = Counter(await asyncio.gather(*slow))
            in_flight = f.quotas.get("acme").gate.in_flight
            return results, other, metrics(f), in_flight

    results, other, text, in_flight = run(scenario())
    assert results == {(200, None): 2, (503, "1"): 4}
    assert other == [(200, None)] * 3
    assert in_flight == 0  # every admitted request gave its slot back
    assert 'elasticd_quota_rejections_total{reason="concurrency",tenant="acme"} 4.0' in text
    assert 'elasticd_quota_rejections_total{reason="rate",tenant="acme"} 0.0' in text
    assert 'elasticd_quota_rejections_total{reason="concurrency",tenant="globex"} 0.0' in text
    assert 'elasticd_requests_total{app="shop",code="503",tenant="acme"} 4.0' in text
    assert 'elasticd_requests_total{app="blog",code="200",tenant="globex"} 3.0' in text


def test_rate_quota(worker: list[Upstream]) -> None:
    """requests_per_second: 5, burst: 5, 20 quick requests: 5 pass, 15 get 429 with Retry-After: 1; the
    other tenant is unaffected. The clock is held still, so "quick" is exact."""
    quotas = {"acme": Quotas(requests_per_second=5, burst=5), "globex": Quotas(requests_per_second=1000)}
    now = [100.0]

    async def scenario() -> tuple[Counter, Counter, list[tuple[int, str | None]], str]:
        async with front(worker, quotas=quotas, clock=lambda: now[0]) as f, client(f) as request:
            first = Counter([await fetch(request, "/") for _ in range(20)])
            other = [await fetch(request, "/", host="blog.localhost") for _ in range(20)]
            now[0] += 0.2  # one token is due
            later = Counter([await fetch(request, "/") for _ in range(2)])
            return first, later, other, metrics(f)

    first, later, other, text = run(scenario())
    assert first == {(200, None): 5, (429, "1"): 15}
    assert later == {(200, None): 1, (429, "1"): 1}
    assert other == [(200, None)] * 20
    assert 'elasticd_quota_rejections_total{reason="rate",tenant="acme"} 16.0' in text
    assert 'elasticd_requests_total{app="shop",code="429",tenant="acme"} 16.0' in text


def test_slow_rate_says_how_long(worker: list[Upstream]) -> None:
    now = [0.0]

    async def scenario() -> list[tuple[int, str | None]]:
        async with front(worker, quotas={"acme": Quotas(requests_per_second=0.25, burst=1)},
                         clock=lambda: now[0]) as f, client(f) as request:
            return [await fetch(request, "/") for _ in range(2)]

    assert run(scenario()) == [(200, None), (429, "4")]


def test_reload_relimits_and_keeps_requests_in_flight(worker: list[Upstream]) -> None:
    async def scenario() -> list[Any]:
        steps: list[Any] = []
        async with front(worker, quotas={"acme": Quotas(max_concurrent_requests=2)}) as f, \
                client(f) as request:
            # (held for seconds: the steps below run while they are in flight, on a loaded machine too)
            held = [asyncio.ensure_future(fetch(request, "/sleep?ms=3000")) for _ in range(2)]
            await asyncio.sleep(0.15)
            steps.append(await fetch(request, "/"))  # full: 503
            f.set_quotas({"acme": Quotas(max_concurrent_requests=3)})  # a reload raises the limit
            held.append(asyncio.ensure_future(fetch(request, "/sleep?ms=2500")))
            await asyncio.sleep(0.15)
            steps.append(await fetch(request, "/"))  # 3 in flight under the new limit of 3: 503
            f.set_quotas({"acme": Quotas(max_concurrent_requests=1)})  # lowered below what is in flight
            steps.append(f.quotas.get("acme").gate.in_flight)  # nothing lost
            steps.append(await fetch(request, "/"))
            steps.append(Counter(await asyncio.gather(*held)))
            steps.append(await fetch(request, "/"))  # all done: the limit of 1 admits one again
            f.set_quotas({"acme": Quotas(requests_per_second=1, burst=1)})  # now a rate, no concurrency cap
            steps.append([await fetch(request, "/") for _ in range(2)])
            f.set_quotas({})  # the tenant is gone from the configuration: no quota at all
            steps.append([(await fetch(request, "/"))[0] for _ in range(3)])
        return steps

    assert run(scenario()) == [
        (503, "1"), (503, "1"), 3, (503, "1"), Counter({(200, None): 3}), (200, None),
        [(200, None), (429, "1")], [200, 200, 200]]


def test_quota_state_is_one_per_configured_tenant(worker: list[Upstream], tmp_path: Path) -> None:
    async def scenario() -> tuple[set[str], int]:
        async with front(worker, quotas={"acme": Quotas(max_concurrent_requests=5), "globex": Quotas()}) as f, \
                client(f) as request:
            for i in range(30):  # many hosts and users: no per-request state stays behind
                await fetch(request, f"/?n={i}", host="shop.localhost" if i % 2 else "blog.localhost")
            return set(f.quotas.tenants), len(f.forwards.open)

    assert run(scenario()) == ({"acme", "globex"}, 0)


def test_quota_exactness_under_load(tmp_path: Path) -> None:
    """10,000 requests over 200 concurrent connections against a tenant with max_concurrent_requests: 50 and a
    worker that sleeps 20 ms: the worker never has more than 50 at once (counted at the worker), every refusal
    is a 503 with Retry-After, nothing hangs, and the front's books are back where they were."""
    import aiohttp
    from aiohttp import web
    from test_front import upstream_app

    total, connections, limit = 10_000, 200, 50
    seen = {"now": 0, "most": 0}

    async def handler(request: web.Request) -> web.Response:
        seen["now"] += 1
        seen["most"] = max(seen["most"], seen["now"])
        try:
            await asyncio.sleep(0.02)
        finally:
            seen["now"] -= 1
        return web.Response(text="ok")

    async def scenario() -> tuple[Counter, dict[str, int]]:
        codes: Counter = Counter()
        left = iter(range(total))
        async with upstream_app(tmp_path / "w.sock", handler) as ups, \
                front(ups, quotas={"acme": Quotas(max_concurrent_requests=limit)}) as f:
            connector = aiohttp.TCPConnector(limit=connections)
            async with aiohttp.ClientSession(connector=connector, cookie_jar=aiohttp.DummyCookieJar()) as session:
                async def one_connection() -> None:
                    for _ in left:
                        async with session.get(f"http://127.0.0.1:{f.port}/", headers={"Host": "shop.localhost"},
                                               timeout=aiohttp.ClientTimeout(total=30)) as resp:
                            await resp.read()
                            codes[(resp.status, resp.headers.get("Retry-After"))] += 1
                await asyncio.wait_for(asyncio.gather(*(one_connection() for _ in range(connections))), 120)
            for _ in range(100):  # the client's connections close: the front's side follows within a tick
                if not f.listening.conns:
                    break
                await asyncio.sleep(0.05)
            books = {"open": len(f.forwards.open), "in_flight": f.quotas.get("acme").gate.in_flight,
                     "client connections": len(f.listening.conns), "users on the surface": len(f.surface.users)}
        return codes, books

    codes, books = run(scenario())
    assert sum(codes.values()) == total
    assert set(codes) <= {(200, None), (503, "1")}, codes
    assert codes[(200, None)] >= limit and codes[(503, "1")] > 0
    assert 0 < seen["most"] <= limit, seen
    assert books == {"open": 0, "in_flight": 0, "client connections": 0, "users on the surface": 0}
