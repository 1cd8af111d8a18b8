"""The demo app: a worker that can be told to use CPU, memory, processes and disk, to prove the limits.

Run as ``python -m elasticd.demo``, serving on ``ELASTIC_LISTEN`` (``unix:/path.sock`` or ``tcp:HOST:PORT``).
Routes: ``/``, ``/cpu?ms=``, ``/mem?mb=``, ``/mem/free``, ``/sleep?ms=``, ``/fork?n=``, ``/io?mb=&path=``,
``/echo`` (``?raw=1`` streams the body back), ``/ws`` (a WebSocket echo), ``/login?name=``, ``/logout``,
``/counter`` (this user's in-process counter as JSON: the state a live move carries), ``/blocking?ms=``
(a blocking call in the library's executor: its queue is the report's ``queue_depth``), ``/pages?n=``
(this user now has n pages open, as an app reports them to the sensor), ``/metrics`` (its own requests in
flight, under vLLM's metric names: what a ``capacity: {probe: prometheus}`` block reads, whoever sent them). It holds
what it takes (memory, children) until told or until it exits: a limit is only proven by something that stays.
"""

from __future__ import annotations

import asyncio
import os
import signal
import stat
import subprocess
import sys
import tempfile
import time
from typing import Any

from aiohttp import web

from elasticd.aiohttp_grace import grace
from elasticd.worker import SENSOR_KEY, STATES_KEY, USER_HEADER, run_sync, sensor, setup, user_state

MAX_MS, MAX_FORK, PAGE = 600_000, 100_000, 4096
MAX_MB = 1 << 20  # 1 TiB: the kernel, not this app, should be what says no
WORKER = os.environ.get("ELASTIC_WORKER_ID", "demo")

_json = web.json_response
_held: list[bytearray] = []
_children: list[subprocess.Popen[bytes]] = []
_counters: dict[str, dict[str, Any]] = {}


def _int(request: web.Request, name: str, low: int, high: int) -> int:
    raw = request.query.get(name)
    if raw is None:
        raise web.HTTPBadRequest(text=f"missing parameter {name}\n")
    try:
        value = int(raw)
    except ValueError:
        raise web.HTTPBadRequest(text=f"{name}={raw!r} is not an integer\n") from None
    if not low <= value <= high:
        raise web.HTTPBadRequest(text=f"{name}={value} is out of range ({low}..{high})\n")
    return value


def _sandboxed() -> bool:
    """In a tenant's view (bubblewrap's own pid namespace) this process is pid 2 or so, under bwrap as pid 1: a
    number the host never shows, which the "/" line says rather than leave a newcomer puzzled."""
    try:
        with open("/proc/1/comm") as comm:
            return comm.read().strip() == "bwrap"
    except OSError:
        return False


SANDBOXED = _sandboxed()


async def index(request: web.Request) -> web.Response:
    greeting = os.environ.get("DEMO_GREETING")
    where = " in its sandbox's pid namespace" if SANDBOXED else ""
    line = f"worker {WORKER} pid {os.getpid()}{where}\n"
    return web.Response(text=f"{greeting}\n{line}" if greeting else line)


async def cpu(request: web.Request) -> web.Response:
    ms = _int(request, "ms", 0, MAX_MS)
    # Busy in the handler on purpose: this is the worker's CPU, so the tenant's cpu.max throttles it.
    start, cpu_start = time.monotonic(), time.process_time()
    while time.monotonic() < start + ms / 1000:
        pass
    return _json({"ms": round((time.monotonic() - start) * 1000),
                  "cpu_ms": round((time.process_time() - cpu_start) * 1000)})


async def mem(request: web.Request) -> web.Response:
    mb = _int(request, "mb", 0, MAX_MB)
    try:
        block = bytearray(mb << 20)
        # calloc'd zero pages cost nothing until written: touch one byte per page so memory.current sees it.
        block[::PAGE] = b"\x01" * len(range(0, len(block), PAGE))
    except MemoryError:
        return _json({"error": f"cannot allocate {mb} MB", "held_mb": _held_mb()}, status=507)
    _held.append(block)
    return _json({"allocated_mb": mb, "held_mb": _held_mb()})


async def mem_free(request: web.Request) -> web.Response:
    freed, _held[:] = _held_mb(), []
    return _json({"freed_mb": freed, "held_mb": 0})


def _held_mb() -> int:
    return sum(map(len, _held)) >> 20


async def sleep(request: web.Request) -> web.Response:
    ms = _int(request, "ms", 0, MAX_MS)
    await asyncio.sleep(ms / 1000)
    return _json({"slept_ms": ms})


async def fork(request: web.Request) -> web.Response:
    n = _int(request, "n", 0, MAX_FORK)
    _children[:] = [c for c in _children if c.poll() is None]  # reap the ones that ended (zombies count)
    started, failed, error = 0, 0, None
    for _ in range(n):  # one by one, so the count says where pids.max stopped it
        try:
            _children.append(subprocess.Popen(["sleep", "300"], stdin=subprocess.DEVNULL,
                                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
            started += 1
        except OSError as exc:  # BlockingIOError (EAGAIN) once pids.max is reached
            failed += 1
            error = error or f"{type(exc).__name__}: {exc}"
    return _json({"requested": n, "started": started, "failed": failed, "error": error,
                  "children": len(_children)})


def _write(directory: str, mb: int) -> float:
    fd, name = tempfile.mkstemp(prefix="demo-io-", dir=directory)
    try:
        chunk = os.urandom(1 << 20)  # incompressible, so a compressing filesystem cannot skip the work
        start = time.monotonic()
        with open(fd, "wb", buffering=0) as f:
            for _ in range(mb):
                f.write(chunk)
                os.fsync(f.fileno())  # through to the disk, where io.max applies
        return time.monotonic() - start
    finally:
        os.unlink(name)


async def io(request: web.Request) -> web.Response:
    mb = _int(request, "mb", 1, MAX_MB)
    directory = request.query.get("path") or os.getcwd()
    if not os.path.isdir(directory):
        raise web.HTTPBadRequest(text=f"path={directory!r} is not a directory\n")
    try:
        seconds = await asyncio.to_thread(_write, directory, mb)
    except OSError as exc:
        return _json({"error": str(exc)}, status=500)
    rate = round(mb / max(seconds, 1e-9), 1)
    return _json({"mb": mb, "seconds": round(seconds, 3), "mb_per_s": rate, "path": directory})


async def echo(request: web.Request) -> web.StreamResponse:
    if request.query.get("raw") == "1":
        out = web.StreamResponse(headers={"Content-Type": "application/octet-stream"})
        out.content_length = request.content_length  # None (a chunked upload) streams back chunked
        await out.prepare(request)
        async for chunk in request.content.iter_any():
            await out.write(chunk)
        await out.write_eof()
        return out
    body_len = 0
    async for chunk in request.content.iter_any():
        body_len += len(chunk)
    headers: dict[str, str] = {}
    for name, value in request.headers.items():  # repeated headers joined, as HTTP allows
        headers[name] = f"{headers[name]}, {value}" if name in headers else value
    url = request.rel_url  # raw path and query: what the client (or the front) sent, undecoded
    return _json({"method": request.method, "path": url.raw_path, "query": url.raw_query_string,
                  "headers": headers, "body_len": body_len})


async def ws(request: web.Request) -> web.WebSocketResponse:
    """A WebSocket that echoes each text message with this worker's id: a long-lived connection to a worker."""
    socket = web.WebSocketResponse()
    await socket.prepare(request)
    async for message in socket:
        if message.type == web.WSMsgType.TEXT:
            await socket.send_str(f"{WORKER}: {message.data}")
    return socket


async def login(request: web.Request) -> web.Response:
    name = request.query.get("name", "")
    if not name or len(name) > 200 or not name.isprintable():
        raise web.HTTPBadRequest(text="login needs ?name=N (printable, at most 200 characters)\n")
    # The front reads this header (and strips it): the user is logged in, and the pool places it.
    return web.Response(text=f"{name} logged in on {WORKER}\n", headers={"X-Elastic-Login": name})


async def logout(request: web.Request) -> web.Response:
    return web.Response(text=f"logged out of {WORKER}\n", headers={"X-Elastic-Login": "-"})


async def counter(request: web.Request) -> web.Response:
    """This user's in-process counter, once more: state that lives only in this worker, which a live move
    carries (``?pad_kb=N`` also keeps N KiB of padding in it, to move a package of that size)."""
    user = request.headers.get(USER_HEADER, "")
    # Without the library (sensed from outside, or no channel): a plain dict of this process, never moved.
    state = user_state(request) if STATES_KEY in request.app and user else _counters.setdefault(user, {})
    if "pad_kb" in request.query:
        state["pad"] = b"\0" * (_int(request, "pad_kb", 0, 64 << 10) << 10)
    state["count"] = state.get("count", 0) + 1
    return _json({"user": user or None, "count": state["count"], "worker": WORKER})


async def blocking(request: web.Request) -> web.Response:
    """A blocking call (time.sleep, as a synchronous driver would) run in the library's executor: while all its
    threads are taken, the next calls wait, and the report's executor.queue_depth counts them."""
    ms = _int(request, "ms", 0, MAX_MS)
    if SENSOR_KEY not in request.app:
        raise web.HTTPConflict(text="/blocking needs the library (elasticd.worker.setup): this worker runs without\n")
    started = time.monotonic()
    await run_sync(request, time.sleep, ms / 1000)
    return _json({"slept_ms": ms, "waited_ms": round((time.monotonic() - started) * 1000) - ms})


async def pages(request: web.Request) -> web.Response:
    """This user now has ``n`` pages open: what an app that knows its pages reports to the sensor."""
    n = _int(request, "n", 0, 10_000)
    user = request.headers.get(USER_HEADER, "")
    if SENSOR_KEY not in request.config_dict or not user:
        raise web.HTTPConflict(text="/pages needs the library and a user (through elasticd's front)\n")
    sensor(request.app).pages(user, n)
    return _json({"user": user, "pages": n})


_in_flight = 0  # requests being handled now (the middleware's count), /metrics included


@web.middleware
async def _count_in_flight(request: web.Request, handler: Any) -> web.StreamResponse:
    global _in_flight
    _in_flight += 1
    try:
        response: web.StreamResponse = await handler(request)
        return response
    finally:
        _in_flight -= 1


async def metrics(request: web.Request) -> web.Response:
    """The requests this process has in flight (this one not counted), as an inference server exports its queue:
    a capacity probe reads it whether the requests came through the front or straight to the socket."""
    running = _in_flight - 1
    return web.Response(text=f"# HELP vllm:num_requests_running Requests being handled now.\n"
                             f"# TYPE vllm:num_requests_running gauge\n"
                             f'vllm:num_requests_running{{worker="{WORKER}"}} {running}\n'
                             f"# TYPE vllm:num_requests_waiting gauge\n"
                             f'vllm:num_requests_waiting{{worker="{WORKER}"}} 0\n', content_type="text/plain")


def make_app() -> web.Application:
    app = web.Application(middlewares=[_count_in_flight])
    app.add_routes([web.get("/", index), web.get("/cpu", cpu), web.get("/mem", mem),
                    web.get("/mem/free", mem_free), web.get("/sleep", sleep), web.get("/fork", fork),
                    web.get("/io", io), web.route("*", "/echo", echo), web.get("/ws", ws), web.get("/login", login),
                    web.get("/logout", logout), web.get("/counter", counter), web.get("/blocking", blocking),
                    web.get("/pages", pages), web.get("/metrics", metrics)])
    # The occupancy sensor and its channel (elasticd.worker), unless asked to be sensed from outside like a
    # worker in any language would be (DEMO_SENSORLESS=1).
    if os.environ.get("ELASTIC_CHANNEL") and os.environ.get("DEMO_SENSORLESS") != "1":
        setup(app)
    return app


def _kill_children() -> None:
    for child in _children:
        child.kill()
    for child in _children:
        child.wait()  # reaped, so nothing lingers as a zombie
    _children.clear()


async def serve(listen: str) -> None:
    kind, _, where = listen.partition(":")
    host, _, port = where.rpartition(":")
    if not ((kind == "unix" and where) or (kind == "tcp" and port.isdigit())):
        raise SystemExit(f"ELASTIC_LISTEN={listen!r}: expected unix:/path or tcp:HOST:PORT")
    # The stop signals first: a supervisor may send SIGTERM as soon as the socket accepts, and before a handler
    # is installed SIGTERM's default action would kill the worker without its cleanup.
    stop = asyncio.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        asyncio.get_running_loop().add_signal_handler(signum, stop.set)
    on_runner, on_site = grace(5.0)
    runner = web.AppRunner(make_app(), access_log=None, **on_runner)
    await runner.setup()
    if kind == "unix" and os.path.exists(where) and stat.S_ISSOCK(os.lstat(where).st_mode):
        os.unlink(where)  # stale socket of a previous run: binding would fail on it
    await (web.UnixSite(runner, where, **on_site) if kind == "unix"
           else web.TCPSite(runner, host.strip("[]"), int(port), **on_site)).start()
    print(f"demo worker {WORKER} listening on {listen}", file=sys.stderr, flush=True)
    try:
        await stop.wait()
    finally:
        _kill_children()  # first: the runner's grace may outlast the supervisor's patience
        await runner.cleanup()


def main() -> None:
    asyncio.run(serve(os.environ.get("ELASTIC_LISTEN", "tcp:127.0.0.1:8000")))


if __name__ == "__main__":
    main()
