"""The channel with real sockets and real processes: announce, reports, refusals, forged peers."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time

import psutil
import pytest

from elasticd.pool.channel_server import MAX_LINE, ChannelServer
from elasticd.pool.proc_sensor import TreeSensor, in_process_tree
from elasticd.pool.report import Report
from elasticd.worker.channel import ChannelClient
from elasticd.worker.sensor import Sensor


class Registry:
    """Stands for the supervisor: the worker ids, tokens and pids elasticd knows."""

    def __init__(self) -> None:
        self.workers: dict[str, tuple[str, int]] = {}
        self.reports: list[tuple[str, Report]] = []
        self.uids: list[int] = []  # the peers' uids, as the kernel gave them

    def authenticate(self, tenant: str, worker_id: str, token: str, pid: int, uid: int) -> str | None:
        self.uids.append(uid)
        known = self.workers.get(worker_id)
        if known is None:
            return f"unknown worker {worker_id}"
        if token != known[0]:
            return "wrong token"
        if not in_process_tree(pid, known[1]):
            return f"pid {pid} is not in the process tree of worker {worker_id}"
        return None

    def on_report(self, worker_id: str, report: Report, now: float) -> None:
        self.reports.append((worker_id, report))


async def _open(path):
    reader, writer = await asyncio.open_unix_connection(path, limit=4 * MAX_LINE)
    return reader, writer


async def _say(reader, writer, message) -> dict:
    writer.write((message if isinstance(message, bytes) else json.dumps(message).encode()) + b"\n")
    await writer.drain()
    return json.loads(await asyncio.wait_for(reader.readline(), 5))


async def serve_channel(tmp_path, registry: Registry, tenant: str = "t", **options) -> ChannelServer:
    """A channel in ``tmp_path`` (its runtime directory) serving one tenant's socket; its path: ``.path(tenant)``."""
    server = ChannelServer(str(tmp_path), registry.authenticate, registry.on_report, **options)
    assert await server.serve({tenant: str(tmp_path / "workers" / tenant / "channel.sock")}) == []
    return server


@pytest.fixture
async def channel(tmp_path):
    registry = Registry()
    server = await serve_channel(tmp_path, registry)
    yield server, registry
    await server.stop()


async def test_announce_report_and_refusals(channel):
    server, registry = channel
    registry.workers["t.a.g.1"] = ("secret", os.getpid())  # this test process is the "worker"
    reader, writer = await _open(server.path("t"))
    assert await _say(reader, writer, {"type": "announce", "worker": "t.a.g.1", "token": "secret"}) == {"type": "ok"}
    writer.write(json.dumps({"type": "occupancy", "report": {"cpu": 0.5, "executor": {"busy": 1, "total": 4}}})
                 .encode() + b"\n")
    await writer.drain()
    for _ in range(50):
        if registry.reports:
            break
        await asyncio.sleep(0.02)
    assert registry.reports[0][0] == "t.a.g.1" and registry.reports[0][1].cpu == 0.5
    # Malformed messages are refused with a reason; the connection stays.
    assert "not JSON" in (await _say(reader, writer, b"{nope"))["reason"]
    assert "report refused: cpu" in (await _say(reader, writer, {"type": "occupancy", "report": {"cpu": -1}}))["reason"]
    assert "unknown message type" in (await _say(reader, writer, {"type": "gossip"}))["reason"]
    assert "JSON object" in (await _say(reader, writer, b"[1, 2]"))["reason"]
    # A line past the bound closes the connection, and the daemon goes on.
    reply = await _say(reader, writer, b"x" * (MAX_LINE + 10))
    assert "longer than" in reply["reason"]
    assert await asyncio.wait_for(reader.readline(), 5) == b""
    writer.close()


@pytest.mark.parametrize(("announce", "reason"), [
    ({"type": "occupancy", "report": {}}, "the first message must be"),
    ({"type": "announce", "worker": "t.a.g.9", "token": "x"}, "unknown worker"),
    ({"type": "announce", "worker": "t.a.g.1", "token": "guess"}, "wrong token"),
])
async def test_refused_announces(channel, announce, reason):
    server, registry = channel
    registry.workers["t.a.g.1"] = ("secret", os.getpid())
    reader, writer = await _open(server.path("t"))
    reply = await _say(reader, writer, announce)
    assert reply["type"] == "error" and reason in reply["reason"]
    assert await asyncio.wait_for(reader.readline(), 5) == b""  # refused: closed, never registered
    writer.close()


async def test_a_peer_outside_the_workers_tree_is_refused_even_with_the_token(channel, tmp_path):
    server, registry = channel
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])  # the real worker
    try:
        registry.workers["t.a.g.1"] = ("secret", other.pid)
        # This process knows the token but is not in that worker's tree: a forged report.
        reader, writer = await _open(server.path("t"))
        reply = await _say(reader, writer, {"type": "announce", "worker": "t.a.g.1", "token": "secret"})
        assert reply["type"] == "error" and "not in the process tree" in reply["reason"]
        writer.close()
        assert registry.reports == []
    finally:
        other.kill()
        other.wait()


async def test_the_library_client_announces_and_pushes(channel):
    server, registry = channel
    registry.workers["t.a.g.1"] = ("secret", os.getpid())
    sensor = Sensor(total=4)
    sensor.request_started()
    client = ChannelClient(sensor.report, path=f"unix:{server.path('t')}", worker_id="t.a.g.1", token="secret",
                           interval=0.05)
    client.start()
    try:
        for _ in range(100):
            if len(registry.reports) >= 2:
                break
            await asyncio.sleep(0.02)
    finally:
        client.stop()
    first, second = registry.reports[0][1], registry.reports[1][1]
    assert first.cpu is None and second.cpu is not None  # the first tick has no delta
    assert second.executor.busy == 1 and second.executor.total == 4
    assert second.rss and second.rss > 0


def test_sensor_report_table():
    sensor = Sensor(total=8, window=5.0)
    sensor.touch("alice", 100.0)
    sensor.touch("bob", 104.0)
    sensor.touch(None, 104.0)
    first = sensor.report(105.0, cpu_seconds=10.0, rss=1000, load=0.1)
    assert first["cpu"] is None
    assert (first["users"], first["active_users"]) == (2, 2)
    second = sensor.report(108.0, cpu_seconds=11.5, rss=1000, load=0.1)
    assert second["cpu"] == pytest.approx(0.5)
    assert (second["users"], second["active_users"]) == (2, 1)  # alice idle past the window
    third = sensor.report(200.0, cpu_seconds=12.5, rss=1000, load=0.1)
    assert third["users"] == 0  # forgotten after ten windows


def test_tree_sensor_measures_a_busy_process_tree():
    burner = subprocess.Popen([sys.executable, "-c",
                               "import subprocess, sys, time\n"
                               "c = subprocess.Popen([sys.executable, '-c', 'while True: pass'])\n"
                               "time.sleep(60)"])
    try:
        sensor = TreeSensor(burner.pid)
        deadline = time.monotonic() + 15
        while len(psutil.Process(burner.pid).children()) < 1:  # (two interpreters' start-ups, slow on a loaded machine)
            assert time.monotonic() < deadline, "the burner's child never started"
            time.sleep(0.05)
        assert sensor.report(time.monotonic(), busy=1, total=4).cpu is None
        cpus = []
        while not cpus or cpus[-1] is None or cpus[-1] <= 0.3:  # (a loaded machine: a second at a time)
            assert time.monotonic() < deadline, f"the grandchild's spinning was never counted: {cpus}"
            time.sleep(1.0)
            report = sensor.report(time.monotonic(), busy=1, total=4)
            cpus.append(report.cpu)
        assert report.rss > 0 and report.executor.busy == 1
        assert in_process_tree(burner.pid, burner.pid)
        assert not in_process_tree(os.getpid(), burner.pid)
    finally:
        for child in psutil.Process(burner.pid).children(recursive=True):
            child.kill()
        burner.kill()
        burner.wait()
