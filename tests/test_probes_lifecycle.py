"""The capacity probes' lifecycle against real HTTP servers (probes/probe.py, probes/kinds.py; seed 001): polled
once at once, one timer, the shared rate, one poll in flight, stop drops and a late answer is unheard, failures
forget and are said once per change; the prometheus kind on a worker's Unix socket and on a node's URL; the
registry kind against a real ``RegistryPage`` and a tampering one. Real timers with small intervals."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from elasticd.config.model import Capacity
from elasticd.probes.kinds import PrometheusProbe, RegistryProbe
from elasticd.probes.probe import Probe, ProbeTarget
from elasticd.probes.publish import Publisher, RegistryPage
from elasticd.probes.reading import Reading
from elasticd.probes.registry_snapshot import SIGNATURE_HEADER, canonical, node_load, sign, snapshot

SECRET = b"k" * 32
NODE = "t.a.g@n1"
VLLM = (b'# HELP vllm:num_requests_running Number of requests running.\n'
        b'# TYPE vllm:num_requests_running gauge\n'
        b'vllm:num_requests_running{model_name="a"} 2\n'
        b'vllm:num_requests_running{model_name="b"} 1 1700000000000\n'
        b'vllm:num_requests_waiting{model_name="a"} 3\n'
        b'vllm:num_requests_waiting{model_name="b"} NaN\n')


class Sink:
    """Records what a probe writes: every call, and the reading in force per node."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str, Any]] = []
        self.readings: dict[str, Reading] = {}

    def set(self, node: str, reading: Reading) -> None:
        self.calls.append(("set", node, reading))
        self.readings[node] = reading

    def forget(self, node: str, source: str | None) -> None:
        self.calls.append(("forget", node, source))
        held = self.readings.get(node)
        if held is not None and (source is None or held.source == source):
            del self.readings[node]

    def failed(self, node: str, reason: str) -> None:
        pass

    def sets(self) -> list[Reading]:
        return [reading for kind, _, reading in self.calls if kind == "set"]

    def forgets(self) -> list[tuple[str, str | None]]:
        return [(node, source) for kind, node, source in self.calls if kind == "forget"]


async def until(condition: Callable[[], bool], timeout: float = 2.0, what: str = "the condition") -> None:
    """Wait for ``condition`` (checked every 10 ms), failing after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.01)


def target(*, limit: int = 4, socket: str | None = None, url: str | None = None) -> ProbeTarget:
    return ProbeTarget(NODE, "t", "a", "g", limit, socket=socket, url=url)


class Rig:
    """Servers started here are cleaned up, probes started here closed, at the end of the test."""

    def __init__(self) -> None:
        self.runners: list[web.AppRunner] = []
        self.probes: list[Probe] = []

    async def serve(self, routes: dict[str, Callable[[web.Request], Awaitable[web.StreamResponse]]] | web.Application,
                    *, socket: str | None = None, port: int = 0) -> str:
        """A real aiohttp server (TCP on 127.0.0.1, or a Unix socket): its base URL (or the socket's path)."""
        if isinstance(routes, web.Application):
            app = routes
        else:
            app = web.Application()
            for path, handler in routes.items():
                app.router.add_get(path, handler)
        runner = web.AppRunner(app, handle_signals=False)
        await runner.setup()
        site: web.BaseSite = (web.UnixSite(runner, socket) if socket is not None
                              else web.TCPSite(runner, "127.0.0.1", port))
        await site.start()
        self.runners.append(runner)
        if socket is not None:
            return socket
        return f"http://127.0.0.1:{runner.addresses[0][1]}"

    async def stop_servers(self) -> None:
        runners, self.runners = self.runners, []
        for runner in runners:
            await runner.cleanup()

    def start(self, probe: Probe) -> Probe:
        self.probes.append(probe)
        probe.start()
        return probe

    async def close(self) -> None:
        for probe in self.probes:
            await probe.aclose()
        await self.stop_servers()


@pytest.fixture
async def rig():
    made = Rig()
    yield made
    await made.close()


def counting(body: bytes = VLLM, status: int = 200) -> tuple[dict[str, int], Callable[..., Awaitable[web.Response]]]:
    hits = {"n": 0}

    async def handler(request: web.Request) -> web.Response:
        hits["n"] += 1
        return web.Response(body=body, status=status, content_type="text/plain")

    return hits, handler


def prometheus(interval: float, **fields: Any) -> Capacity:
    return Capacity(probe="prometheus", interval=interval, **fields)


# -- the timer ---------------------------------------------------------------------------------------------------


async def test_start_polls_at_once_and_twice_is_one_timer(rig: Rig) -> None:
    hits, handler = counting()
    base = await rig.serve({"/metrics": handler})
    sink = Sink()
    slow = rig.start(PrometheusProbe(target(url=base), prometheus(1.0, max_age=5.0), sink))
    started = time.monotonic()
    await until(lambda: bool(sink.sets()), 0.5, "the first reading")
    assert time.monotonic() - started < 1.0  # before one interval passed
    assert sink.sets()[0].used == 6 and hits["n"] == 1 and slow.polls == 1

    hits2, handler2 = counting()
    base2 = await rig.serve({"/metrics": handler2})
    probe = PrometheusProbe(target(url=base2), prometheus(0.05, max_age=5.0), Sink())
    rig.probes.append(probe)
    begun = time.monotonic()
    probe.start()
    probe.start()  # a second start: the same timer
    await asyncio.sleep(0.6)
    elapsed = time.monotonic() - begun
    expected = elapsed / 0.05 + 1  # one at once, then one per interval at most
    # (At most: a second start is no second timer. How many of those ticks found the last poll still under way, and
    # were skipped, is the machine's speed: on a loaded one a poll outlasts 50 ms.)
    assert hits2["n"] >= 3 and probe.polls + probe.skipped <= expected + 1, (hits2["n"], probe.skipped, expected)
    assert probe.polls == hits2["n"]
    probe.stop()
    probe.start()  # a no-op once stopped
    stopped_at = hits2["n"]
    await asyncio.sleep(0.15)
    assert hits2["n"] == stopped_at


async def test_sharing_multiplies_the_interval_so_the_source_sees_the_configured_rate(rig: Rig) -> None:
    hits, handler = counting()
    base = await rig.serve({"/metrics": handler})
    config = prometheus(0.05, max_age=5.0)
    one = PrometheusProbe(target(url=base), config, Sink(), sharing=2)
    two = PrometheusProbe(ProbeTarget("t.a.g@n2", "t", "a", "g", 4, url=base), config, Sink(), sharing=2)
    assert one.poll_interval == pytest.approx(0.1) and two.poll_interval == pytest.approx(0.1)
    assert PrometheusProbe(target(url=base), config, Sink(), sharing=0).poll_interval == pytest.approx(0.05)
    begun = time.monotonic()
    rig.start(one)
    rig.start(two)
    await asyncio.sleep(0.6)
    elapsed = time.monotonic() - begun
    configured = elapsed / 0.05  # what the operator configured: the source sees one poll per interval
    assert 0.5 * configured <= hits["n"] <= configured + 2, (hits["n"], configured)  # not twice that


async def test_a_warning_once_when_the_interval_is_not_within_max_age(rig: Rig, caplog) -> None:
    caplog.set_level(logging.INFO, logger="elasticd.probes")
    _, handler = counting()
    base = await rig.serve({"/metrics": handler})

    def warned() -> list[str]:
        return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING and "max_age" in r.getMessage()]

    fine = rig.start(PrometheusProbe(target(url=base), prometheus(0.1, max_age=0.2), Sink()))
    never = rig.start(PrometheusProbe(target(url=base), prometheus(0.1, max_age=0.0), Sink()))  # 0: never expires
    assert warned() == []
    equal = PrometheusProbe(target(url=base), prometheus(0.2, max_age=0.2), Sink())
    rig.start(equal)
    equal.start()
    assert len(warned()) == 1 and "every 0.2s" in warned()[0]
    shared = PrometheusProbe(target(url=base), prometheus(0.1, max_age=0.15), Sink(), sharing=2)  # 0.2 >= 0.15
    rig.start(shared)
    await until(lambda: fine.polls >= 2 and never.polls >= 2 and equal.polls >= 1, what="a few polls")
    assert len(warned()) == 2  # once per probe, not per tick


async def test_one_poll_in_flight_a_slow_source_skips_ticks(rig: Rig) -> None:
    active = {"now": 0, "most": 0, "hits": 0}

    async def slow(request: web.Request) -> web.Response:
        active["hits"] += 1
        active["now"] += 1
        active["most"] = max(active["most"], active["now"])
        try:
            await asyncio.sleep(0.12)
        finally:
            active["now"] -= 1
        return web.Response(body=VLLM, content_type="text/plain")

    base = await rig.serve({"/metrics": slow})
    sink = Sink()
    probe = rig.start(PrometheusProbe(target(url=base), prometheus(0.03, max_age=5.0), sink))
    await until(lambda: probe.skipped >= 4 and len(sink.sets()) >= 2, what="skipped ticks and two answers")
    assert active["most"] == 1  # the source never saw two polls at once
    assert probe.polls - 1 <= active["hits"] <= probe.polls  # (the last poll may not have reached it yet)
    assert probe.describe()["skipped"] == probe.skipped


# -- stop, and failures ------------------------------------------------------------------------------------------


async def test_stop_drops_the_reading_and_a_late_answer_writes_nothing(rig: Rig) -> None:
    entered = asyncio.Event()
    release = asyncio.Event()
    answered = {"n": 0, "hits": 0}

    async def handler(request: web.Request) -> web.Response:
        answered["hits"] += 1
        if answered["hits"] > 1:  # the first answers at once; the next hangs until released
            entered.set()
            await release.wait()
        answered["n"] += 1
        return web.Response(body=VLLM, content_type="text/plain")

    base = await rig.serve({"/metrics": handler})
    sink = Sink()
    probe = rig.start(PrometheusProbe(target(url=base), prometheus(0.05, max_age=5.0), sink))
    await until(lambda: NODE in sink.readings, what="the first reading")
    await asyncio.wait_for(entered.wait(), 2)  # the second poll is in flight
    session = probe._session
    probe.stop()
    assert probe.is_stopped
    assert sink.calls[-1] == ("forget", NODE, "prometheus") and NODE not in sink.readings
    heard = len(sink.calls)
    release.set()
    await until(lambda: answered["n"] == 2, what="the late answer to be sent")
    polling = probe._polling
    assert polling is not None
    await asyncio.wait_for(asyncio.shield(polling), 2)  # the poll in flight heard its answer
    assert sink.calls[heard:] == []  # and wrote nothing
    assert NODE not in sink.readings and answered["hits"] == 2  # nor polled again
    assert probe.report(1, 4) is False and probe.forget("x") is False
    assert sink.calls[heard:] == []
    await probe.aclose()
    assert session is not None and session.closed  # aclose waited for the HTTP session's close


async def test_a_probe_stopped_before_its_first_poll_ran_polls_nothing(rig: Rig) -> None:
    hits, handler = counting()
    base = await rig.serve({"/metrics": handler})
    sink = Sink()
    probe = rig.start(PrometheusProbe(target(url=base), prometheus(0.05), sink))
    probe.stop()  # in the same loop iteration: its first poll is a task not yet run
    polling = probe._polling
    assert polling is not None
    await asyncio.wait_for(polling, 2)
    await probe.aclose()
    assert hits["n"] == 0 and probe._session is None and sink.sets() == []


async def test_a_failing_poll_forgets_and_warns_once_per_change_of_state(rig: Rig, caplog) -> None:
    caplog.set_level(logging.INFO, logger="elasticd.probes")
    mode = {"status": 200}
    hits = {"n": 0}

    async def handler(request: web.Request) -> web.Response:
        hits["n"] += 1
        return web.Response(body=VLLM, status=mode["status"], content_type="text/plain")

    app = web.Application()
    app.router.add_get("/metrics", handler)
    base = await rig.serve(app)
    port = int(base.rsplit(":", 1)[1])
    sink = Sink()
    probe = rig.start(PrometheusProbe(target(url=base), prometheus(0.04, max_age=5.0), sink))

    def said(level: int) -> list[str]:
        return [r.getMessage() for r in caplog.records if r.levelno == level and "capacity probe" in r.getMessage()]

    async def ticks(n: int) -> None:
        polls = probe.polls
        await until(lambda: probe.polls >= polls + n, what=f"{n} more polls")
        await until(lambda: probe._polling is not None and probe._polling.done(), what="the poll to end")

    await until(lambda: NODE in sink.readings, what="a reading")
    assert probe.state == "ok" and len(said(logging.INFO)) == 1 and said(logging.WARNING) == []

    mode["status"] = 500  # the source answers 500: forgotten, said once
    await until(lambda: probe.state == "unreachable", what="the 500")
    assert NODE not in sink.readings and sink.calls[-1] == ("forget", NODE, "prometheus")
    await ticks(3)
    assert len(said(logging.WARNING)) == 1 and "HTTP 500" in said(logging.WARNING)[0]

    await rig.stop_servers()  # then the connection is refused: the same state, not said again
    forgets = len(sink.forgets())
    await ticks(3)
    assert probe.state == "unreachable" and len(sink.forgets()) >= forgets + 3  # forgotten on every failure
    assert len(said(logging.WARNING)) == 1 and NODE not in sink.readings

    mode["status"] = 200  # the source is back: one line
    await rig.serve(app, port=port)
    await until(lambda: NODE in sink.readings, what="the recovery")
    await ticks(3)
    recovered = [m for m in said(logging.INFO) if "after unreachable" in m]
    assert len(recovered) == 1 and len(said(logging.WARNING)) == 1

    await rig.stop_servers()  # refused while it was ok: a change, said once more
    await until(lambda: probe.state == "unreachable", what="the refusal")
    await ticks(3)
    assert len(said(logging.WARNING)) == 2 and NODE not in sink.readings


# -- prometheus --------------------------------------------------------------------------------------------------


async def test_prometheus_on_a_workers_unix_socket(rig: Rig, tmp_path) -> None:
    served = {"body": VLLM}
    seen: list[tuple[str, str | None]] = []

    async def metrics(request: web.Request) -> web.Response:
        seen.append((request.path, request.headers.get("Host")))
        return web.Response(body=served["body"], content_type="text/plain")

    path = await rig.serve({"/metrics": metrics}, socket=str(tmp_path / "w.sock"))
    sink = Sink()
    probe = rig.start(PrometheusProbe(target(limit=5, socket=path), prometheus(0.05, path="/metrics"), sink))
    await until(lambda: NODE in sink.readings, what="a reading")
    reading = sink.readings[NODE]
    # 2 + 1 running (label series summed, a timestamp ignored) + 3 waiting (NaN skipped); the target's limit
    assert (reading.source, reading.used, reading.limit, reading.expires_at) == ("prometheus", 6.0, 5.0, None)
    assert abs(reading.at - time.time()) < 2
    assert seen[0] == ("/metrics", "localhost")

    served["body"] = b"# nothing here\nprocess_cpu_seconds_total 12\n"  # no metric: forgotten
    await until(lambda: probe.state == "no metric", what="the missing metric")
    assert NODE not in sink.readings and sink.calls[-1] == ("forget", NODE, "prometheus")

    served["body"] = b"queue_running{q=\"a\"} 1\nqueue_running{q=\"b\"} 2\nqueue_waiting 4\n" + VLLM
    custom_sink = Sink()
    custom = rig.start(PrometheusProbe(target(limit=8, socket=path),
                                       prometheus(0.05, running=("queue_running",), waiting=("queue_waiting",)),
                                       custom_sink))
    await until(lambda: NODE in custom_sink.readings, what="the custom names' reading")
    assert (custom_sink.readings[NODE].used, custom_sink.readings[NODE].limit) == (7.0, 8.0)  # not vLLM's 6
    assert custom.state == "ok"
    await until(lambda: probe.state == "ok", what="the default names again")  # the same body still has vLLM's
    assert sink.readings[NODE].used == 6.0


async def test_prometheus_on_a_tcp_node(rig: Rig) -> None:
    async def stats(request: web.Request) -> web.Response:
        return web.Response(body=b"sglang:num_running_reqs 3\nsglang:num_queue_reqs{p=\"x\"} 1\n",
                            content_type="text/plain")

    async def other(request: web.Request) -> web.Response:
        return web.Response(body=b"tgi_batch_current_size 9\n", content_type="text/plain")

    base = await rig.serve({"/stats": stats, "/other": other})
    sink = Sink()
    probe = rig.start(PrometheusProbe(target(limit=16, url=base + "/"), prometheus(0.05, path="/stats"), sink))
    assert probe.url == f"{base}/stats"
    await until(lambda: NODE in sink.readings, what="a reading")
    assert (sink.readings[NODE].used, sink.readings[NODE].limit) == (4.0, 16.0)
    own = Sink()  # a block's own url wins over the node's
    rig.start(PrometheusProbe(target(limit=10, url=base), prometheus(0.05, url=f"{base}/other"), own))
    await until(lambda: NODE in own.readings, what="the own url's reading")
    assert (own.readings[NODE].used, own.readings[NODE].limit) == (9.0, 10.0)


# -- registry ----------------------------------------------------------------------------------------------------

APPS = [{"tenant": "t", "app": "a", "groups": [
    {"group": "g", "workers": [
        {"id": "t.a.g.2", "healthy": True, "open": 1, "limit": 4, "capacity": None},
        {"id": "t.a.g.1", "healthy": True, "open": 2, "limit": 4,
         "capacity": {"source": "prometheus", "used": 3, "limit": 6, "at": 1.0}},
        {"id": "t.a.g.3", "healthy": False, "open": 0, "limit": 4, "capacity": None},
    ]}]},
    {"tenant": "t", "app": "other", "groups": [{"group": "g", "workers": [
        {"id": "t.other.g.1", "healthy": True, "open": 7, "limit": 8, "capacity": None}]}]}]
TTL = 30.0


def registry(tmp_path, url: str, *, key: str | None = None, interval: float = 0.05) -> Capacity:
    secret = tmp_path / "registry.secret"
    secret.write_bytes(SECRET + b"\n")
    key_file = None
    if key is not None:
        (tmp_path / "registry.key").write_text(key + "\n")
        key_file = str(tmp_path / "registry.key")
    return Capacity(probe="registry", interval=interval, url=url, secret_file=str(secret), key_file=key_file)


async def test_registry_accepts_a_real_registry_page(rig: Rig, tmp_path) -> None:
    page = RegistryPage(lambda: APPS)
    page.publisher = Publisher(SECRET, None, TTL, "host-a")
    app = web.Application()
    page.add_routes(app)
    base = await rig.serve(app)
    sink = Sink()
    probe = rig.start(RegistryProbe(target(), registry(tmp_path, f"{base}/v1/registry"), sink))
    await until(lambda: NODE in sink.readings, what="an accepted snapshot")
    reading = sink.readings[NODE]
    used, limit = node_load({"apps": APPS}, "t", "a") or (None, None)
    assert (used, limit) == (4.0, 10.0)  # max(2, 3) + 1 of 6 + 4; the unhealthy one not counted
    assert (reading.source, reading.used, reading.limit) == ("registry", used, limit)
    assert abs(reading.at - time.time()) < 2 and reading.expires_at == pytest.approx(reading.at + TTL)
    assert probe.state == "ok" and probe.last_accepted == reading.at


async def test_registry_with_a_bearer_key(rig: Rig, tmp_path) -> None:
    page = RegistryPage(lambda: APPS)
    page.publisher = Publisher(SECRET, "reader-key-1", TTL, "host-a")
    app = web.Application()
    page.add_routes(app)
    base = await rig.serve(app)
    (tmp_path / "k").mkdir()
    blind = Sink()
    without = rig.start(RegistryProbe(target(), registry(tmp_path, f"{base}/v1/registry"), blind))
    keyed = Sink()
    rig.start(RegistryProbe(target(), registry(tmp_path / "k", f"{base}/v1/registry", key="reader-key-1"), keyed))
    await until(lambda: without.state == "unreachable" and NODE in keyed.readings, what="401 and an accepted one")
    assert NODE not in blind.readings and ("forget", NODE, "registry") in blind.calls and blind.sets() == []
    assert keyed.readings[NODE].used == 4.0


class Tamper:
    """Stands between the registry probe and a real ``RegistryPage``: passes its answers, or serves a forged, a
    replayed, a stale or a future one."""

    def __init__(self, real: str) -> None:
        self.real = real
        self.mode = "pass"
        self.kept: list[tuple[bytes, str]] = []  # the real page's signed answers, oldest first
        self.replay: tuple[bytes, str] | None = None

    async def fetch(self) -> tuple[bytes, str]:
        import aiohttp

        async with aiohttp.ClientSession() as session, session.get(self.real) as response:
            answer = await response.read(), response.headers[SIGNATURE_HEADER]
        self.kept.append(answer)
        return answer

    async def handler(self, request: web.Request) -> web.Response:
        if self.mode == "replay" and self.replay is not None:
            body, signature = self.replay
        elif self.mode in ("stale", "future"):
            when = time.time() - TTL - 1 if self.mode == "stale" else time.time() + 60
            body = canonical(snapshot("host-a", when, TTL, APPS))
            signature = sign(SECRET, body)
        else:
            body, signature = await self.fetch()
            if self.mode == "forge":
                parsed = json.loads(body)
                parsed["apps"][0]["groups"][0]["workers"][0]["open"] = 0  # say there is room
                body = canonical(parsed)  # under the original's signature
        return web.Response(body=body, content_type="application/json", headers={SIGNATURE_HEADER: signature})


async def test_registry_refusals_forget_the_reading(rig: Rig, tmp_path, caplog) -> None:
    caplog.set_level(logging.INFO, logger="elasticd.probes")
    page = RegistryPage(lambda: APPS)
    page.publisher = Publisher(SECRET, None, TTL, "host-a")
    real = web.Application()
    page.add_routes(real)
    tamper = Tamper(f"{await rig.serve(real)}/v1/registry")
    base = await rig.serve({"/v1/registry": tamper.handler})
    sink = Sink()
    probe = rig.start(RegistryProbe(target(), registry(tmp_path, f"{base}/v1/registry"), sink))

    async def accepted() -> Reading:
        tamper.mode = "pass"
        await until(lambda: probe.state == "ok" and NODE in sink.readings, what="an accepted snapshot")
        return sink.readings[NODE]

    async def refused(mode: str, state: str) -> None:
        tamper.mode = mode
        await until(lambda: probe.state == state, what=state)
        assert NODE not in sink.readings and sink.calls[-1] == ("forget", NODE, "registry")

    first = await accepted()
    await refused("forge", "bad signature")
    await accepted()
    await refused("stale", "stale")
    await accepted()
    await refused("future", "from the future")
    # replayed: an older signed snapshot (still within its ttl) served after a newer one was accepted
    older = tamper.kept[0]
    assert json.loads(older[0])["generated_at"] <= first.at
    await until(lambda: probe.last_accepted is not None and probe.last_accepted > first.at + 0.001,
                what="a newer snapshot", timeout=3)
    await accepted()
    tamper.replay = older
    await refused("replay", "replayed")
    await accepted()

    states = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    for state in ("bad signature", "stale", "from the future", "replayed"):  # each said once, on its change
        assert sum(f": {state}" in m for m in states) == 1, (state, states)


# -- a source that is a tenant's process: bounded, and numbers that are no reading refused ------------------------


async def test_an_answer_too_big_or_too_slow_is_refused_not_waited_for(rig: Rig, monkeypatch) -> None:
    import elasticd.probes.probe as probe_module

    async def flood(request: web.Request) -> web.Response:
        return web.Response(body=b"vllm:num_requests_running 1\n" + b"#" * 5000 + b"\n", content_type="text/plain")

    async def trickle(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse()
        await response.prepare(request)
        for _ in range(40):  # a byte every 0.1 s: each read is in time, the whole answer is not
            await response.write(b"#")
            await asyncio.sleep(0.1)
        return response

    monkeypatch.setattr(probe_module, "MAX_BODY", 4096)
    monkeypatch.setattr(probe_module, "READ_TIMEOUT", 0.5)
    monkeypatch.setattr(probe_module, "CONNECT_TIMEOUT", 0.2)
    base = await rig.serve({"/flood": flood, "/trickle": trickle})
    big, slow = Sink(), Sink()
    flooded = rig.start(PrometheusProbe(target(url=base), prometheus(5.0, path="/flood"), big))
    trickled = rig.start(PrometheusProbe(target(url=base), prometheus(5.0, path="/trickle"), slow))
    await until(lambda: flooded.state == "too big", what="the flood refused")
    started = time.monotonic()
    await until(lambda: trickled.state == "unreachable", timeout=3.0, what="the trickle timed out")
    assert time.monotonic() - started < 1.5  # the whole answer's 0.7 s, not the trickle's 4 s
    assert big.sets() == [] and slow.sets() == []


@pytest.mark.parametrize(("used", "limit"), [
    (float("inf"), 4.0), (1.0, float("nan")), (-1.0, 4.0), (1.0, -4.0), (True, 4.0), ("3", 4.0),
])
async def test_numbers_that_are_no_reading_are_refused(used: Any, limit: Any) -> None:
    sink = Sink()
    probe = Probe(target(), Capacity(probe="custom", cls="x:Y"), sink)
    assert probe.report(used, limit) is False
    assert probe.state == "malformed" and sink.sets() == [] and sink.forgets() == [(NODE, "custom")]
    assert probe.report(1, 4) is True and sink.readings[NODE].used == 1.0


async def test_a_custom_probe_without_a_source_forgets_only_its_own_reading() -> None:
    sink = Sink()
    probe = Probe(target(), Capacity(probe="custom", cls="x:Y"), sink)
    probe.report(1, 4)
    probe.forget("unreachable")
    assert sink.forgets() == [(NODE, "custom")]  # never None: a back-off of another source stays


async def test_the_registry_secret_is_read_again_at_each_poll(rig: Rig, tmp_path) -> None:
    page = RegistryPage(lambda: APPS)
    page.publisher = Publisher(SECRET, None, TTL, "host2")
    app = web.Application()
    page.add_routes(app)
    base = await rig.serve(app)
    config = registry(tmp_path, f"{base}/v1/registry")
    sink = Sink()
    probe = rig.start(RegistryProbe(target(), config, sink))
    await until(lambda: probe.state == "ok", what="accepted")
    page.publisher = Publisher(b"n" * 32, None, TTL, "host2")  # rotated on the publisher: not yet here
    await until(lambda: probe.state == "bad signature", what="refused with the old secret")
    assert config.secret_file is not None
    Path(config.secret_file).write_bytes(b"n" * 32 + b"\n")  # rotated here too: no restart
    await until(lambda: probe.state == "ok", what="accepted with the new secret")
    Path(config.secret_file).write_bytes(b"short\n")
    await until(lambda: probe.state == "no secret", what="a secret too short now")
    assert NODE not in sink.readings
