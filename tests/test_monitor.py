"""The monitor's pure parts as tables (population fusion, basic auth, the terminal views), the census over a real
channel (one worker that never answers is an error row), and the worker library's readings on a real aiohttp
app: streams and WebSockets as connections, the executor's queue, pages and backlog from the app."""

from __future__ import annotations

import asyncio
import base64
import os
import threading
import time

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import make_mocked_request
from test_pool_channel_server import Registry, serve_channel

from elasticd.config.model import MonitorAuth
from elasticd.frames import encode
from elasticd.front.core.sticky import Surface
from elasticd.monitor.auth import Credentials, authorized, read_credentials
from elasticd.monitor.census import ask_all
from elasticd.monitor.page import MonitorPage, local_host
from elasticd.monitor.population import RegisterError, RegisterRow, WorkerAnswer, fuse, parse_register
from elasticd.monitor.terminal import bar, render_population, render_watch, sparkline

# (not imported as "setup": Debian 12's pytest 7 calls a module's setup() as nose did, with the module)
from elasticd.worker import executor, run_sync, sensor
from elasticd.worker import setup as setup_worker
from elasticd.worker.channel import ChannelClient
from elasticd.worker.sensor import Sensor

A, B, C = "a" * 32, "b" * 32, "c" * 32

# ---------------------------------------------------------------------- the population's fusion


def _surface() -> Surface:
    surface = Surface(ttl=600.0)
    for user, worker, requests in ((A, "w1", 3), (B, "w1", 1), (C, "w2", 2)):
        entry = surface.assign(user, worker, 100.0)
        for _ in range(requests):
            entry.add(0.1, 100.0)
    surface.users[A].login = "alice"
    return surface


def test_fusion_puts_consumption_into_each_users_row_and_an_error_row_for_a_silent_worker():
    answers = [WorkerAnswer("w1", "green", register=(RegisterRow(A, 1, 2, 0.5), RegisterRow("d" * 32, 0, None, 9.0),
                                                      RegisterRow(C, 0, None, 3.0))),  # C moved to w2 since
               WorkerAnswer("w2", "green", error="unreachable")]
    rows = fuse(answers, _surface().users.items(), 101.0)
    assert [(r.get("user"), r.get("error")) for r in rows] == [
        ("aaaaaaaa", None), ("bbbbbbbb", None), ("dddddddd", None),  # w1: most recently active first
        (None, "unreachable"), ("cccccccc", None)]  # w2 did not answer: its error row, its users from the surface
    alice, bob, dave, error, carol = rows
    assert alice == {"user": "aaaaaaaa", "login": "alice", "worker": "w1", "group": "green", "pages": 2,
                     "connections": 1, "idle": 0.5, "requests": 3, "seconds": pytest.approx(0.3),
                     "recent_requests": 3, "recent_seconds": pytest.approx(0.3), "on_surface": True,
                     "in_register": True}
    assert bob["in_register"] is False and bob["pages"] is None and bob["idle"] == 1.0  # the front's last sight
    assert dave["on_surface"] is False and dave["requests"] == 0  # the worker holds it; the front forgot it
    assert error == {"worker": "w2", "group": "green", "error": "unreachable"}
    assert carol["connections"] is None and carol["requests"] == 2


def test_a_worker_without_the_library_has_rows_from_the_surface_alone_and_newcomers_count():
    first = (0.2, 100.0, "green")
    answers = [WorkerAnswer("w2", "blue", asked=False), WorkerAnswer("w1", "green", register=(
        RegisterRow("e" * 32, 0, None, 0.1),))]
    rows = fuse(answers, _surface().users.items(), 101.0, newcomers={"e" * 32: first})
    assert [(r["user"], r["group"], r["pages"], r["connections"]) for r in rows] == [
        ("cccccccc", "blue", None, None),  # sensed from outside: nothing about pages or connections
        ("eeeeeeee", "green", None, 0), ("aaaaaaaa", "green", None, None), ("bbbbbbbb", "green", None, None)]
    assert rows[1]["requests"] == 1 and rows[1]["seconds"] == 0.2  # its first request, before its cookie


@pytest.mark.parametrize(("users", "why"), [
    ({}, "users: not a list"),
    ([3], r"users\[0\]: not an object"),
    ([{"user": "", "idle": 0}], r"users\[0\].user: '' is not a user id"),
    ([{"user": "\x1b[2Jaaaa", "idle": 0}], r"users\[0\].user: .* is not a user id \(32 hex digits\)"),
    ([{"user": A.upper(), "idle": 0}], r"is not a user id"),
    ([{"user": A, "idle": -1}], r"users\[0\].idle: -1 is not a number of seconds"),
    ([{"user": A, "idle": 10 ** 400}], r"users\[0\].idle: 1000.* is not a number of seconds"),
    ([{"user": A, "idle": "1"}], r"users\[0\].idle: 1 is not a number of seconds"),
    ([{"user": A, "idle": 0, "connections": True}], r"users\[0\].connections: True is not a count"),
    ([{"user": A, "idle": 0, "connections": 10 ** 30}], r"users\[0\].connections: 1000.* is not a count"),
    ([{"user": A, "idle": 0, "pages": -3}], r"users\[0\].pages: -3 is not a count"),
])
def test_a_register_of_the_wrong_shape_is_refused_naming_what(users, why):
    with pytest.raises(RegisterError, match=why):
        parse_register(users)


# ---------------------------------------------------------------------- the census over a real channel


async def test_the_census_asks_every_library_worker_at_once_and_a_silent_one_is_unreachable(tmp_path):
    registry = Registry()
    server = await serve_channel(tmp_path, registry)
    answering = Sensor(total=2)
    for i in range(2000):  # a busy reception: its register is far over a channel line's bound
        answering.touch(f"{i:032x}", time.monotonic())
    answering.touch(A, time.monotonic())
    registry.workers["t.a.g.1"] = ("token-1", os.getpid())
    # (At the server's interval: one reporting faster is struck out after a few seconds, "too-fast".)
    client = ChannelClient(answering.report, path=server.path("t"), worker_id="t.a.g.1", token="token-1", interval=5.0,
                           register=answering.register)
    client.start()
    reader, writer = await asyncio.open_unix_connection(server.path("t"))  # announces the monitor, never answers
    server._authenticate = lambda *args: None  # type: ignore[assignment]
    writer.write(encode({"type": "announce", "worker": "t.a.g.2", "token": "t", "capabilities": ["monitor"]}))
    await writer.drain()
    await reader.readline()
    try:
        for _ in range(250):
            if "monitor" in server.capabilities("t.a.g.1"):
                break
            await asyncio.sleep(0.02)
        started = time.monotonic()
        answers = await ask_all(server, [("t.a.g.1", "g"), ("t.a.g.2", "g"), ("t.a.g.3", "g")], timeout=3.0)
        took = time.monotonic() - started
        again = await ask_all(server, [("t.a.g.1", "g")], timeout=2.0)  # the big answer left its channel up
    finally:
        client.stop()
        writer.close()
        await server.stop()
    assert answers[0].error is None and len(answers[0].register) == 2001 and answers[0].register[-1].user == A
    assert answers[1] == WorkerAnswer("t.a.g.2", "g", error="unreachable")
    assert answers[2] == WorkerAnswer("t.a.g.3", "g", asked=False)  # never announced the library
    assert took < 5.0  # asked at once: one timeout (3 s, long for a loaded machine), not one per worker (6 s)
    assert again[0].error is None and len(again[0].register) == 2001


# ---------------------------------------------------------------------- basic auth


def _basic(text: str) -> str:
    return "Basic " + base64.b64encode(text.encode()).decode()


OPS = Credentials("ops", "pä:ss")


@pytest.mark.parametrize(("header", "credentials", "ok"), [
    (None, None, True),  # no server.monitor: open
    (None, OPS, False),
    (_basic("ops:pä:ss"), OPS, True),  # a password may hold a colon
    ("basic " + _basic("ops:pä:ss")[6:], OPS, True),  # the scheme is case-insensitive
    (_basic("ops:wrong"), OPS, False),
    (_basic("root:pä:ss"), OPS, False),
    (_basic("ops"), OPS, False),  # no colon
    ("Bearer abc", OPS, False),
    ("Basic %%%", OPS, False),
    ("Basic \xc3\xa9", OPS, False),  # not ASCII: a client's bytes, refused (not an error)
    ("Basic " + base64.b64encode(b"ops:\xff").decode(), OPS, False),  # not UTF-8
])
def test_basic_auth_table(header, credentials, ok):
    assert authorized(header, credentials) is ok


@pytest.mark.parametrize(("host", "local"), [
    ("127.0.0.1:9464", True), ("127.0.0.1", True), ("[::1]:9464", True), ("::1", True), ("localhost:9464", True),
    ("LOCALHOST.", True), ("monitor.localhost", True), ("10.1.2.3:80", True),
    ("evil.example", False), ("evil.example:9464", False), ("localhost.evil.example", False), ("", False),
])
def test_without_auth_the_monitor_answers_hosts_that_are_addresses_or_localhost(host, local):
    assert local_host(host) is local


class _Transport:
    def __init__(self, peer: tuple[str, int], own: tuple[str, int]) -> None:
        self.info = {"peername": peer, "sockname": own}

    def get_extra_info(self, name: str, default: object = None) -> object:
        return self.info.get(name, default)


@pytest.mark.parametrize(("peer", "own", "credentials", "status"), [
    (("127.0.0.1", 5000), ("127.0.0.1", 9464), None, None),  # this host's browser
    (("10.0.0.9", 5000), ("10.0.0.9", 9464), None, None),  # ... at one of the host's addresses
    (("::1", 5000), ("::1", 9464), None, None),
    (("10.0.0.7", 5000), ("10.0.0.9", 9464), None, 403),  # another host, without server.monitor
    (("10.0.0.7", 5000), ("10.0.0.9", 9464), Credentials("ops", "pw"), 401),  # with it: the credentials decide
])
def test_without_auth_the_monitor_answers_this_hosts_browser_alone(peer, own, credentials, status):
    page = MonitorPage(lambda app: asyncio.sleep(0, {}), credentials)
    request = make_mocked_request("GET", "/monitor", headers={"Host": "127.0.0.1:9464"},
                                  transport=_Transport(peer, own))
    refused = page._refused(request)
    assert (refused.status if refused is not None else None) == status
    if status == 403:
        assert "set server.monitor to open it to others" in refused.text


def test_credentials_come_from_the_first_line_of_the_password_file(tmp_path):
    path = tmp_path / "pw"
    path.write_text("s3cret\nignored\n")
    assert read_credentials(MonitorAuth("ops", str(path))) == Credentials("ops", "s3cret")
    assert "s3cret" not in repr(read_credentials(MonitorAuth("ops", str(path))))
    assert read_credentials(None) is None
    path.write_text("\n")
    with pytest.raises(ValueError, match="is empty"):
        read_credentials(MonitorAuth("ops", str(path)))
    with pytest.raises(ValueError, match=r"server.monitor.password_file: cannot read .*nope"):
        read_credentials(MonitorAuth("ops", str(tmp_path / "nope")))


# ---------------------------------------------------------------------- the terminal views


@pytest.mark.parametrize(("value", "width", "drawn"), [
    (0.0, 4, "····"), (0.5, 4, "██··"), (1.0, 4, "████"), (1.7, 4, "████"), (-0.2, 4, "····"), (0.26, 10, "███·······"),
])
def test_bar(value, width, drawn):
    assert bar(value, width) == drawn


def test_sparkline_shows_the_last_values_as_heights():
    assert sparkline([0.0, 0.5, 1.0, 2.0]) == "▁▅██"
    assert sparkline([0.1] * 50, width=30) == "▁" * 30


POOL = {"tenant": "acme", "app": "shop", "groups": {"green": {
    "thresholds": {"min_workers": 1, "max_workers": 4}, "ledger": {"C": 1.3, "O": 0.9, "H": 0.4, "trigger": 1.2},
    "held": None, "moves": [], "decisions": [{"decision": "scale-up", "worker": "acme.shop.green.2",
                                              "reason": "no worker under 0.8"}],
    "workers": [
        {"id": "acme.shop.green.1", "state": "running", "reception": True, "draining": False, "spawning": False,
         "occupancy": 0.75, "components": {"cpu": 0.75, "executor": 0.25}, "history": [0.5, 1.0],
         "rates": {"rps": 12.5}, "sticky_users": [{}, {}]},
        {"id": "acme.shop.green.2", "state": "starting", "reception": False, "draining": False, "spawning": True,
         "occupancy": 0.0, "components": {}, "history": [], "rates": None, "sticky_users": []}]}}}


def test_the_watch_view_draws_a_bar_per_worker():
    screen = render_watch(POOL, "12:00:00", 2.0, bar_width=8)
    lines = screen.splitlines()
    assert lines[0] == "acme/shop   12:00:00   every 2s   Ctrl-C quits"
    assert "C=1.30 O=0.90 H=0.40 (compacts while H > 1.20)" in lines[2]
    row = next(line for line in lines if line.lstrip().startswith("acme.shop.green.1"))
    assert "██████··  75%" in row and "cpu ████·  75%" in row and "▅█" in row and "12.5" in row
    assert "reception" in row
    spawning = next(line for line in lines if line.lstrip().startswith("acme.shop.green.2"))
    assert "········   0%" in spawning and "spawning" in spawning
    assert "scale-up" in screen and "no worker under 0.8" in screen


def test_the_population_table():
    data = {"tenant": "acme", "app": "shop", "population": 1, "sticky_users": 1, "register_only_users": 0, "rows": [
        {"user": "aaaaaaaa", "login": "alice", "worker": "w1", "requests": 3, "seconds": 0.3, "recent_requests": 1,
         "recent_seconds": 0.1, "pages": None, "connections": 1, "idle": 75.0},
        {"worker": "w2", "group": "green", "error": "unreachable"}]}
    text = render_population(data).splitlines()
    assert text[0] == ("acme/shop: population 1 (1 sticky, routed by their cookie; 0 only in a worker's register: "
                       "newcomers not back with their cookie yet), 1 worker not answering")
    assert text[1].split() == ["USER", "LOGIN", "WORKER", "REQUESTS", "SECONDS", "LAST", "30S", "PAGES", "CONNS",
                               "LAST", "SEEN"]
    assert text[2].split() == ["aaaaaaaa", "alice", "w1", "3", "0.300", "1/0.100s", "-", "1", "1m15s", "ago"]
    assert text[3] == "w2 (green): unreachable"


# ---------------------------------------------------------------------- the library's readings, on a real app


def test_the_sensors_register_and_what_the_app_reports():
    sensor_ = Sensor(total=4, window=1.0)
    sensor_.touch(A, 10.0)
    sensor_.stream_opened(B, 10.0)
    assert "pages" not in sensor_.report(10.0, 0.0, 1, 0.0) and "backlog" not in sensor_.report(10.0, 0.0, 1, 0.0)
    sensor_.pages(A, 2)
    sensor_.backlog(7)
    sensor_.touch(C, 10.0)
    report = sensor_.report(30.0, 0.0, 1, 0.0)  # 20 s later: C idle for 20 windows goes; B has a stream open, and
    # A pages the app says are open (a page in a background tab): both stay
    assert (report["pages"], report["backlog"], report["connections"], report["users"]) == (2, 7, 1, 2)
    assert sensor_.register(30.0) == [{"user": A, "connections": 0, "pages": 2, "idle": 20.0},
                                      {"user": B, "connections": 1, "pages": None, "idle": 0.0}]  # streaming: active
    sensor_.stream_closed(B, 31.0)
    assert sensor_.register(31.0)[1] == {"user": B, "connections": 0, "pages": None, "idle": 0.0}
    assert sensor_.report(31.0, 0.0, 1, 0.0)["connections"] == 0
    sensor_.pages(A, 0)
    assert [row["user"] for row in sensor_.register(40.0)] == [B]  # no page left: idle, swept
    for bad in (-1, True, 1.5):
        with pytest.raises(ValueError, match="is not a count"):
            sensor_.pages(A, bad)  # type: ignore[arg-type]


async def test_streams_and_websockets_are_connections_and_the_executor_queue_is_measured(tmp_path):
    app = web.Application()
    made = setup_worker(app, concurrency=1)

    @web.middleware
    async def cloning(request: web.Request, handler):  # an inner middleware that clones (as aiohttp-remotes)
        return await handler(request.clone())

    app.middlewares.append(cloning)
    release = asyncio.Event()
    gate = threading.Event()

    async def plain(request: web.Request) -> web.Response:
        return web.Response(text="ok")

    async def stream(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse()
        await response.prepare(request)
        await response.write(b"first")
        await release.wait()
        await response.write_eof()
        return response

    async def socket(request: web.Request) -> web.WebSocketResponse:
        ws = web.WebSocketResponse()
        await ws.prepare(request)
        async for _ in ws:
            pass
        return ws

    async def blocking(request: web.Request) -> web.Response:
        await run_sync(request, gate.wait, 10)
        return web.Response(text="done")

    app.add_routes([web.get("/plain", plain), web.get("/stream", stream), web.get("/ws", socket),
                    web.get("/blocking", blocking)])
    runner = web.AppRunner(app)
    await runner.setup()
    path = str(tmp_path / "app.sock")
    await web.UnixSite(runner, path).start()
    user = {"X-Elastic-User-Id": A}
    try:
        async with aiohttp.ClientSession(connector=aiohttp.UnixConnector(path=path)) as session:
            async with session.get("http://app/plain", headers=user) as response:
                await response.read()
            assert made.connections == 0  # a plain answer is not a connection
            assert "queue_depth" not in made.report(time.monotonic())["executor"]  # the executor never used
            async with session.get("http://app/stream", headers=user) as response:
                assert await response.content.readexactly(5) == b"first"
                ws = await session.ws_connect("http://app/ws", headers=user)
                assert made.connections == 2
                assert made.register(time.monotonic())[0]["connections"] == 2
                await ws.close()
                release.set()
                await response.read()
            for _ in range(100):
                if made.connections == 0:
                    break
                await asyncio.sleep(0.01)
            assert made.connections == 0 and made.register(time.monotonic())[0]["connections"] == 0
            calls = [asyncio.create_task(session.get("http://app/blocking")) for _ in range(3)]
            for _ in range(100):
                if executor(app).waiting == 2:
                    break
                await asyncio.sleep(0.01)
            assert made.report(time.monotonic())["executor"]["queue_depth"] == 2  # one thread, two waiting
            gate.set()
            for call in calls:
                (await call).release()
            assert executor(app).waiting == 0 and sensor(app) is made
    finally:
        gate.set()
        await runner.cleanup()


def test_a_user_moved_away_leaves_the_old_workers_register():
    from elasticd.worker.moves import MoveHandler
    from elasticd.worker.user_state import UserStates

    sensor_ = Sensor(total=1)
    sensor_.touch(A, 1.0)
    sensor_.touch(B, 1.0)
    assert MoveHandler(UserStates(), on_forget=sensor_.forget).answer({"type": "forget", "user": A}, None) is None
    assert [row["user"] for row in sensor_.register(2.0)] == [B]
