"""The worker library's channel client with real sockets: a fake elasticd in threads, blocking sockets.

The client reports from a thread of its own, so reports keep coming while a handler holds the app's event loop,
and the loop heartbeat's ``loop_lag`` in them shows how long the loop has been held.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

import aiohttp
import pytest
from aiohttp import web

# (not imported as "setup": Debian 12's pytest 7 calls a module's setup() as nose did, with the module)
from elasticd.worker import setup as setup_worker
from elasticd.worker.channel import ChannelClient
from elasticd.worker.heartbeat import Heartbeat, heartbeat_period
from elasticd.worker.sensor import Sensor

OK = b'{"type":"ok"}\n'


class FakeDaemon:
    """elasticd's side of the channel: answers each announce (ok, or refuses it) and collects the reports."""

    __slots__ = ("_accepter", "_serving", "_stop", "after_first_report", "announces", "path", "refuse", "reports",
                 "server")

    def __init__(self, path: str, *, refuse: str | None = None, after_first_report: bytes = b"") -> None:
        self.path = path
        self.refuse = refuse
        self.after_first_report = after_first_report  # sent in two pieces, to test the client's line buffer
        self.announces: list[dict[str, Any]] = []
        self.reports: list[tuple[float, dict[str, Any]]] = []  # (monotonic time received, report)
        self._stop = threading.Event()
        self._serving: list[threading.Thread] = []
        self.server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.server.bind(path)
        self.server.listen(8)
        self.server.settimeout(0.05)
        self._accepter = threading.Thread(target=self._accept, name="fake elasticd", daemon=True)
        self._accepter.start()

    def close(self) -> None:
        """Goes away like a stopped daemon: every connection closed, the socket file removed."""
        self._stop.set()
        self._accepter.join(2)
        self.server.close()
        for thread in self._serving:
            thread.join(2)
        if os.path.exists(self.path):
            os.unlink(self.path)

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self.server.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            thread = threading.Thread(target=self._serve, args=(conn,), daemon=True)
            self._serving.append(thread)
            thread.start()

    def _serve(self, conn: socket.socket) -> None:
        conn.settimeout(0.05)
        buffer = b""
        with conn:
            while not self._stop.is_set():
                try:
                    data = conn.recv(65536)
                except TimeoutError:
                    continue
                except OSError:
                    return
                if not data:
                    return
                *lines, buffer = (buffer + data).split(b"\n")
                for line in lines:
                    if not self._handle(conn, json.loads(line)):
                        return

    def _handle(self, conn: socket.socket, message: dict[str, Any]) -> bool:
        if message["type"] == "announce":
            self.announces.append(message)
            if self.refuse is not None:
                conn.sendall(json.dumps({"type": "error", "reason": self.refuse}).encode() + b"\n")
                return False
            conn.sendall(OK)
        elif message["type"] == "occupancy":
            self.reports.append((time.monotonic(), message["report"]))
            if len(self.reports) == 1 and self.after_first_report:
                half = len(self.after_first_report) // 2
                conn.sendall(self.after_first_report[:half])
                time.sleep(0.02)
                conn.sendall(self.after_first_report[half:])
        return True


def wait_for(predicate: Callable[[], bool], timeout: float = 3.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.01)
    return predicate()


def channel_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "elastic channel"]


@pytest.fixture
def daemon(tmp_path):
    made = FakeDaemon(str(tmp_path / "ch.sock"))
    yield made
    made.close()


def make_client(path: str, interval: float, report: Callable[[float], dict[str, Any]] | None = None) -> ChannelClient:
    return ChannelClient(report or Sensor(total=4).report, path=f"unix:{path}", worker_id="t.a.g.1", token="secret",
                         interval=interval)


# ---------------------------------------------------------------------- the client on its own


def test_announces_then_reports_at_the_interval(daemon):
    client = make_client(daemon.path, 0.05)
    client.start()
    client.start()  # idempotent: one thread
    try:
        assert len(channel_threads()) == 1
        started = time.monotonic()
        assert wait_for(lambda: len(daemon.reports) >= 3, 1.0)
        assert daemon.announces == [{"type": "announce", "worker": "t.a.g.1", "token": "secret", "pid": os.getpid(),
                                     "capabilities": ["occupancy"]}]
        time.sleep(0.5)
    finally:
        client.stop()
    assert not channel_threads()
    received = [t for t, _ in daemon.reports]
    # About one every 50 ms (15), no burst; at least a few on a loaded machine, where the thread waits its turn.
    assert 4 <= len([t for t in received if t <= started + 0.75]) <= 20
    first, second = daemon.reports[0][1], daemon.reports[1][1]
    assert first["cpu"] is None and second["cpu"] is not None
    assert second["executor"] == {"busy": 0, "total": 4}  # no executor helper in use: no queue_depth reading
    assert second["loop_lag"] is None  # no heartbeat was started


def test_not_configured_is_a_no_op(monkeypatch):
    for name in ("ELASTIC_CHANNEL", "ELASTIC_WORKER_ID", "ELASTIC_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    client = ChannelClient(Sensor(total=1).report)
    assert not client.configured
    client.start()
    assert not client.running and not channel_threads()
    client.stop()


def test_error_lines_from_the_daemon_are_logged_and_reports_go_on(tmp_path, caplog):
    caplog.set_level(logging.WARNING, logger="elasticd.worker.channel")
    lines = b'{"type":"error","reason":"report refused: cpu: -1"}\n{"type":"later","what":"ignored"}\n'
    daemon = FakeDaemon(str(tmp_path / "ch.sock"), after_first_report=lines)
    client = make_client(daemon.path, 0.05)
    client.start()
    try:
        assert wait_for(lambda: "report refused: cpu: -1" in caplog.text, 2.0)
        count = len(daemon.reports)
        assert wait_for(lambda: len(daemon.reports) >= count + 3, 1.0)
        assert len(daemon.announces) == 1  # the same connection throughout
    finally:
        client.stop()
        daemon.close()


def test_a_refused_announce_is_retried_with_backoff(tmp_path, caplog):
    caplog.set_level(logging.DEBUG, logger="elasticd.worker.channel")
    daemon = FakeDaemon(str(tmp_path / "ch.sock"), refuse="wrong token")
    client = make_client(daemon.path, 0.4)
    client.start()
    try:
        time.sleep(1.0)
        assert client.running  # it did not crash
        # Tries at about 0, 0.1, 0.3, 0.7 s: backing off, not hammering the daemon.
        assert 3 <= len(daemon.announces) <= 6
        assert daemon.reports == []
        refusals = [r for r in caplog.records if "announce refused: wrong token" in r.getMessage()]
        assert refusals and refusals[0].levelno == logging.WARNING
        assert all(r.levelno == logging.DEBUG for r in refusals[1:])  # said once, not once per retry
    finally:
        started = time.monotonic()
        client.stop()
        assert time.monotonic() - started < 1.0
        daemon.close()
    assert not channel_threads()


def test_the_daemon_going_away_and_coming_back(tmp_path):
    path = str(tmp_path / "ch.sock")
    first = FakeDaemon(path)
    client = make_client(path, 0.1)
    client.start()
    try:
        assert wait_for(lambda: len(first.reports) >= 2)
        first.close()  # elasticd restarting: the connection drops and the socket is gone for a while
        time.sleep(0.5)
        assert client.running
        second = FakeDaemon(path)
        try:
            assert wait_for(lambda: len(second.reports) >= 3, 3.0)
            assert len(second.announces) == 1 and second.announces[0]["worker"] == "t.a.g.1"
            # Nothing queued while the daemon was away: the reports come at the interval, not in a burst.
            times = [t for t, _ in second.reports[:3]]
            assert times[2] - times[0] >= 0.1  # (two intervals of 0.1 s; a burst would be a few ms)
        finally:
            client.stop()
            second.close()
    finally:
        client.stop()
    assert not channel_threads()


def test_stop_is_prompt_while_waiting_out_a_long_interval(daemon):
    client = make_client(daemon.path, 30.0)
    client.start()
    assert wait_for(lambda: len(daemon.reports) == 1)
    started = time.monotonic()
    client.stop()
    assert time.monotonic() - started < 2.0  # (not the 30 s interval)
    assert not channel_threads()


def test_stop_is_prompt_while_backing_off(tmp_path):
    client = make_client(str(tmp_path / "nobody.sock"), 30.0)  # no daemon: connect fails, back off
    client.start()
    time.sleep(0.5)  # past the first retries, into a long backoff wait
    started = time.monotonic()
    client.stop()
    assert time.monotonic() - started < 2.0  # (not the 30 s interval)
    assert not channel_threads()


# ---------------------------------------------------------------------- with the app: setup() on a real aiohttp app


async def test_reports_keep_coming_while_a_handler_holds_the_event_loop(daemon, tmp_path, monkeypatch):
    monkeypatch.setenv("ELASTIC_CHANNEL", f"unix:{daemon.path}")
    monkeypatch.setenv("ELASTIC_WORKER_ID", "t.a.g.1")
    monkeypatch.setenv("ELASTIC_TOKEN", "secret")
    monkeypatch.setenv("ELASTIC_OCCUPANCY_INTERVAL", "0.1")
    marks: dict[str, float] = {}

    async def hold(_request: web.Request) -> web.Response:
        marks["start"] = time.monotonic()
        time.sleep(1.0)  # a synchronous view: the event loop runs nothing else meanwhile
        marks["end"] = time.monotonic()
        return web.Response(text="done")

    app = web.Application()
    app.router.add_get("/hold", hold)
    setup_worker(app, concurrency=4)
    runner = web.AppRunner(app)
    await runner.setup()
    app_sock = str(tmp_path / "app.sock")
    await web.UnixSite(runner, app_sock).start()
    try:
        for _ in range(200):
            if len(daemon.reports) >= 3:
                break
            await asyncio.sleep(0.01)
        assert len(daemon.reports) >= 3
        assert all(r["loop_lag"] is not None and r["loop_lag"] < 0.3 for _, r in daemon.reports)
        async with aiohttp.ClientSession(connector=aiohttp.UnixConnector(path=app_sock)) as session, \
                session.get("http://worker/hold") as response:
            assert await response.text() == "done"
        await asyncio.sleep(0.6)
    finally:
        await runner.cleanup()
    assert not channel_threads()  # stopped with the app

    start, end = marks["start"], marks["end"]
    held = [r for t, r in daemon.reports if start + 0.15 < t <= end]
    assert len(held) >= 5  # about one every 100 ms although the loop ran nothing
    assert max(r["loop_lag"] for r in held) >= 0.5  # and they say how long the loop has been held
    assert all(r["executor"]["busy"] == 1 for r in held)
    after = [r for t, r in daemon.reports if t > end + 0.15]
    assert len(after) >= 2
    assert all(r["loop_lag"] < 0.3 for r in after)


# ---------------------------------------------------------------------- the sensor


@pytest.mark.parametrize(("beats", "now", "lag"), [
    ([], 10.0, None),  # no heartbeat was ever started
    ([10.0], 10.0, 0.0),
    ([10.0], 10.25, 0.25),
    ([10.0, 10.25, 10.5], 10.6, 0.1),  # since the last beat
    ([10.0], 11.23456, 1.235),  # rounded to the millisecond
    ([10.0], 9.5, 0.0),  # a beat stamped after the report's now: never negative
])
def test_sensor_loop_lag_table(beats, now, lag):
    sensor = Sensor(total=2)
    for beat in beats:
        sensor.beat(beat)
    report = sensor.report(now, cpu_seconds=1.0, rss=1000, load=0.1)
    assert report["loop_lag"] == (None if lag is None else pytest.approx(lag))
    assert set(report) == {"users", "connections", "active_users", "executor", "cpu", "rss", "load", "loop_lag"}


def test_sensor_report_is_safe_against_concurrent_touches():
    sensor = Sensor(total=2, window=0.001)
    stop = threading.Event()
    errors: list[BaseException] = []

    def reporter() -> None:
        now = 0.0
        while not stop.is_set():
            now += 0.001
            try:
                sensor.report(now, cpu_seconds=1.0, rss=1, load=0.0)
            except BaseException as exc:
                errors.append(exc)
                return

    thread = threading.Thread(target=reporter)
    thread.start()
    try:
        deadline = time.monotonic() + 0.3
        i = 0
        while time.monotonic() < deadline:
            i += 1
            sensor.touch(f"user{i}", i * 0.001)
            if i % 3 == 0:
                sensor.forget(f"user{i - 1}")
    finally:
        stop.set()
        thread.join()
    assert errors == []


async def test_heartbeat_beats_on_the_loop_and_stops():
    assert heartbeat_period(0.1) == pytest.approx(0.025) and heartbeat_period(5.0) == 0.25
    sensor = Sensor(total=1)
    heartbeat = Heartbeat(sensor, 0.02)
    heartbeat.start()
    try:
        assert heartbeat.running
        await asyncio.sleep(0.1)
        assert sensor.report(time.monotonic(), cpu_seconds=0.0, rss=1, load=0.0)["loop_lag"] < 0.05
        time.sleep(0.2)  # the loop held: no beat
        assert sensor.report(time.monotonic(), cpu_seconds=0.0, rss=1, load=0.0)["loop_lag"] >= 0.2
    finally:
        heartbeat.stop()
    assert not heartbeat.running
    await asyncio.sleep(0.1)
    assert sensor.report(time.monotonic(), cpu_seconds=0.0, rss=1, load=0.0)["loop_lag"] >= 0.1  # no more beats
