"""The demo app as a real process: each route, bad parameters, and a clean exit on SIGTERM.

``DemoWorker`` is also how the front's tests get real workers to route to.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp
import psutil
import pytest
from harness import free_port

REPO = Path(__file__).resolve().parent.parent


class DemoWorker:
    """One ``python -m elasticd.demo`` process; stopped by its own pid, never by name."""

    __slots__ = ("listen", "proc", "socket_path", "worker_id")

    def __init__(self, worker_id: str, listen: str, env: dict[str, str] | None = None) -> None:
        self.worker_id = worker_id
        self.listen = listen
        self.socket_path = listen.removeprefix("unix:") if listen.startswith("unix:") else None
        full_env = {**os.environ, "ELASTIC_LISTEN": listen, "ELASTIC_WORKER_ID": worker_id, **(env or {})}
        full_env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
        self.proc = subprocess.Popen([sys.executable, "-m", "elasticd.demo"], env=full_env,
                                     stdin=subprocess.DEVNULL, stderr=subprocess.PIPE)
        self._wait_ready()

    def _wait_ready(self, timeout: float = 10.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"demo {self.worker_id} exited: {self.proc.stderr.read().decode()}")
            try:
                if self.socket_path is not None:
                    with socket.socket(socket.AF_UNIX) as s:
                        s.connect(self.socket_path)
                else:
                    host, _, port = self.listen.removeprefix("tcp:").rpartition(":")
                    socket.create_connection((host, int(port)), timeout=1).close()
                return
            except OSError:
                time.sleep(0.02)
        self.stop()
        raise RuntimeError(f"demo {self.worker_id} did not accept on {self.listen}")

    def stop(self, timeout: float = 5.0) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc.stderr.close()
        return self.proc.returncode




async def get(worker: DemoWorker, path: str, **kwargs: Any) -> tuple[int, str]:
    connector = aiohttp.UnixConnector(path=worker.socket_path) if worker.socket_path else None
    base = "http://demo" if worker.socket_path else f"http://{worker.listen.removeprefix('tcp:')}"
    async with aiohttp.ClientSession(connector=connector) as session, \
            session.request(kwargs.pop("method", "GET"), base + path, **kwargs) as resp:
        return resp.status, await resp.text()


def call(worker: DemoWorker, path: str, **kwargs: Any) -> tuple[int, Any]:
    status, text = asyncio.run(get(worker, path, **kwargs))
    return status, (json.loads(text) if status == 200 and text.startswith("{") else text)


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory):
    path = tmp_path_factory.mktemp("demo") / "w.sock"
    # A stale socket file left by a previous run must not keep the demo from binding.
    with socket.socket(socket.AF_UNIX) as stale:
        stale.bind(str(path))
    worker = DemoWorker("w9", f"unix:{path}")
    yield worker
    worker.stop()


def test_index_names_worker_and_pid(demo: DemoWorker) -> None:
    status, text = call(demo, "/")
    assert (status, text) == (200, f"worker w9 pid {demo.proc.pid}\n")


def test_cpu_burns_in_the_handler(demo: DemoWorker) -> None:
    status, body = call(demo, "/cpu?ms=120")
    assert status == 200
    assert body["ms"] >= 120
    assert body["cpu_ms"] >= 24  # on the CPU, not asleep (a fifth of the time at least: the machine may be loaded)


def test_mem_holds_touched_pages_until_freed(demo: DemoWorker) -> None:
    process = psutil.Process(demo.proc.pid)
    before = process.memory_info().rss
    assert call(demo, "/mem?mb=24") == (200, {"allocated_mb": 24, "held_mb": 24})
    assert call(demo, "/mem?mb=8")[1]["held_mb"] == 32
    assert process.memory_info().rss - before >= 30 << 20  # resident, not just reserved
    assert call(demo, "/mem/free") == (200, {"freed_mb": 32, "held_mb": 0})


def test_sleep(demo: DemoWorker) -> None:
    start = time.monotonic()
    assert call(demo, "/sleep?ms=100") == (200, {"slept_ms": 100})
    assert time.monotonic() - start >= 0.1


def test_metrics_export_the_requests_in_flight_under_vllms_names(demo: DemoWorker) -> None:
    from elasticd.probes.exposition import DEFAULT_RUNNING, DEFAULT_WAITING, used_of

    async def two_sleeping_then_metrics() -> str:
        sleeping = [asyncio.ensure_future(get(demo, "/sleep?ms=1500")) for _ in range(2)]
        await asyncio.sleep(0.5)
        status, text = await get(demo, "/metrics")
        assert status == 200
        await asyncio.gather(*sleeping)
        return text

    text = asyncio.run(two_sleeping_then_metrics())
    assert 'vllm:num_requests_running{worker="w9"} 2' in text, text  # (the /metrics request itself not counted)
    assert used_of(text, DEFAULT_RUNNING, DEFAULT_WAITING) == 2
    assert used_of(call(demo, "/metrics")[1], DEFAULT_RUNNING, DEFAULT_WAITING) == 0


def test_fork_keeps_children(demo: DemoWorker) -> None:
    status, body = call(demo, "/fork?n=3")
    assert status == 200
    assert body == {"requested": 3, "started": 3, "failed": 0, "error": None, "children": 3}
    sleepers = [c for c in psutil.Process(demo.proc.pid).children() if c.name() == "sleep"]
    assert len(sleepers) == 3


def test_io_writes_and_removes_its_file(demo: DemoWorker, tmp_path: Path) -> None:
    status, body = call(demo, f"/io?mb=2&path={tmp_path}")
    assert status == 200
    assert body["mb"] == 2 and body["seconds"] >= 0 and body["path"] == str(tmp_path)
    assert list(tmp_path.iterdir()) == []


def test_echo_get_reports_request(demo: DemoWorker) -> None:
    status, body = call(demo, "/echo?a=1&b=%20", headers={"X-Test": "yes"})
    assert status == 200
    assert body["method"] == "GET" and body["path"] == "/echo" and body["query"] == "a=1&b=%20"
    assert body["headers"]["X-Test"] == "yes"
    assert body["body_len"] == 0


def test_echo_post_counts_or_streams_body(demo: DemoWorker) -> None:
    payload = os.urandom(300_000)
    assert call(demo, "/echo", method="POST", data=payload)[1]["body_len"] == len(payload)

    async def raw() -> bytes:
        async with aiohttp.ClientSession(connector=aiohttp.UnixConnector(path=demo.socket_path)) as s, \
                s.post("http://demo/echo?raw=1", data=payload) as resp:
            assert resp.headers["Content-Length"] == str(len(payload))
            return await resp.read()

    assert asyncio.run(raw()) == payload


@pytest.mark.parametrize(("path", "reason"), [
    ("/cpu", "missing parameter ms"), ("/cpu?ms=abc", "not an integer"), ("/cpu?ms=-1", "out of range"),
    ("/cpu?ms=600001", "out of range"), ("/sleep?ms=1.5", "not an integer"), ("/mem?mb=x", "not an integer"),
    ("/fork?n=-2", "out of range"), ("/fork?n=999999999", "out of range"), ("/io?mb=0", "out of range"),
    ("/io?mb=1&path=/nonexistent/dir", "not a directory"),
])
def test_bad_parameters_are_400_with_a_reason(demo: DemoWorker, path: str, reason: str) -> None:
    status, text = call(demo, path)
    assert status == 400
    assert reason in text


def test_tcp_greeting_and_sigterm_kills_children(tmp_path: Path) -> None:
    port = free_port()
    worker = DemoWorker("t1", f"tcp:127.0.0.1:{port}", env={"DEMO_GREETING": "hello"})
    try:
        assert call(worker, "/") == (200, f"hello\nworker t1 pid {worker.proc.pid}\n")
        assert call(worker, "/fork?n=2")[1]["started"] == 2
        children = psutil.Process(worker.proc.pid).children()
        assert len(children) == 2
    finally:
        code = worker.stop()
    assert code == 0
    assert not [c for c in children if c.is_running() and c.status() != psutil.STATUS_ZOMBIE]


def test_startup_line_on_stderr(tmp_path: Path) -> None:
    worker = DemoWorker("s1", f"unix:{tmp_path}/s.sock")
    worker.proc.send_signal(signal.SIGTERM)
    _, err = worker.proc.communicate(timeout=5)
    assert worker.proc.returncode == 0
    assert f"demo worker s1 listening on unix:{tmp_path}/s.sock" in err.decode()


def test_counter_counts_per_user_in_this_process(demo: DemoWorker) -> None:
    alice, bob = {"X-Elastic-User-Id": "a" * 32}, {"X-Elastic-User-Id": "b" * 32}
    assert call(demo, "/counter", headers=alice) == (200, {"user": "a" * 32, "count": 1, "worker": "w9"})
    assert call(demo, "/counter", headers=alice)[1]["count"] == 2
    assert call(demo, "/counter", headers=bob)[1]["count"] == 1
    assert call(demo, "/counter?pad_kb=100", headers=bob)[1]["count"] == 2
    assert call(demo, "/counter")[1]["user"] is None  # around the front: no user, still answered
    assert call(demo, "/counter?pad_kb=x", headers=bob)[0] == 400


def test_the_demo_says_when_its_pid_is_its_sandboxs():
    """In a tenant's view the demo is pid 2 or so: its "/" line says whose numbering that is."""
    import shutil
    import subprocess
    import sys

    from elasticd import demo

    assert demo.SANDBOXED is False  # here, pid 1 is the host's init (or the suite root's tini)
    bwrap = shutil.which("bwrap")
    assert bwrap is not None, "bubblewrap is installed by ./dev setup"
    inside = subprocess.run([bwrap, "--unshare-pid", "--die-with-parent", "--ro-bind", "/", "/", "--proc", "/proc",
                             "--dev", "/dev", sys.executable, "-c", "import elasticd.demo as d; print(d.SANDBOXED)"],
                            capture_output=True, text=True, timeout=60)
    assert (inside.returncode, inside.stdout.strip()) == (0, "True"), inside.stderr
