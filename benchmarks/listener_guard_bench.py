"""What the listener guard (issue 43) costs a connection to ``metrics_listen``.

    .venv/bin/python benchmarks/listener_guard_bench.py [--lookups 20000] [--connections 2000]

Prints:
1. the kernel's lookup alone (``SockDiag.peer`` on a live loopback connection), in µs;
2. a served connection: an aiohttp app on one port (a 20-byte page, one connection per request, the client in
   another process) on the loop's own accept loop and on the guard's (``GuardedAccept``, as the daemon serves),
   in connections per second and the difference per connection;
3. a refused one: the same client against the guarded listener with root taken for a tenant (every connection
   reset at once), in refusals per second, the refusals' budget (500 a second in the daemon) lifted.
The two servers run in one process one after the other, so the ratios compare like with like on a noisy machine.
The loop is the daemon's (uvloop when it is installed; ELASTICD_LOOP=asyncio for the standard one).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import subprocess
import sys
import time
from collections.abc import Coroutine
from typing import Any

from aiohttp import web

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from elasticd.daemon import _loop_factory
from elasticd.listener_guard.accepting import GuardedAccept
from elasticd.listener_guard.guard import ListenerGuard
from elasticd.listener_guard.sock_diag import SockDiag

_CLIENT = r"""
import socket, sys, time
port, count = int(sys.argv[1]), int(sys.argv[2])
request = b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
answered = refused = 0
began = time.perf_counter()
for _ in range(count):
    try:
        with socket.create_connection(("127.0.0.1", port)) as s:
            s.sendall(request)
            data = s.recv(4096)
            answered += data.startswith(b"HTTP/1.1 200")
            refused += not data
    except (ConnectionResetError, BrokenPipeError):
        refused += 1
print(time.perf_counter() - began, answered, refused)
"""


def lookups(count: int) -> float:
    diag = SockDiag()
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        client = socket.create_connection(server.getsockname())
        accepted, peer = server.accept()
        own = accepted.getsockname()
        began = time.perf_counter()
        for _ in range(count):
            diag.peer(peer, own)
        spent = time.perf_counter() - began
        client.close()
        accepted.close()
    diag.close()
    return spent / count * 1e6


async def serve(guard: ListenerGuard | None, count: int) -> tuple[float, int, int]:
    async def page(request: web.Request) -> web.Response:
        return web.Response(text="x" * 20)

    app = web.Application()
    app.router.add_get("/", page)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    loop = asyncio.get_running_loop()
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(128)
    port = sock.getsockname()[1]
    factory = runner.server
    assert factory is not None
    closing: asyncio.Server | GuardedAccept
    if guard is None:
        closing = await loop.create_server(factory, sock=sock)
    else:  # (the daemon's accept loop; the refusals' budget set out of reach: this measures what one costs)
        closing = GuardedAccept(sock, guard, "metrics", factory, refusals_per_second=1e9, burst=10**9)
        closing.start()
    process = await asyncio.create_subprocess_exec(sys.executable, "-c", _CLIENT, str(port), str(count),
                                                   stdout=subprocess.PIPE)
    out, _ = await process.communicate()
    closing.close()
    await runner.cleanup()
    seconds, answered, refused = out.split()
    return float(seconds), int(answered), int(refused)


def _run(main: Coroutine[Any, Any, tuple[float, int, int]]) -> tuple[float, int, int]:
    with asyncio.Runner(loop_factory=_loop_factory()) as runner:
        return runner.run(main)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lookups", type=int, default=20000)
    parser.add_argument("--connections", type=int, default=2000)
    args = parser.parse_args()
    print(f"kernel lookup (sock_diag, one socket):      {lookups(args.lookups):7.1f} µs")
    bare_s, bare_ok, _ = _run(serve(None, args.connections))
    guard = ListenerGuard(dict, dict)
    guarded_s, guarded_ok, _ = _run(serve(guard, args.connections))
    tenant_root = ListenerGuard(dict, lambda: {os.geteuid(): "bench"} if os.geteuid() else {})
    if os.geteuid() == 0:  # (root is nobody's tenant by uid: take the cgroup of this process for a tenant's)
        with socket.socket() as probe_server:
            probe_server.bind(("127.0.0.1", 0))
            probe_server.listen()
            client = socket.create_connection(probe_server.getsockname())
            accepted, peer = probe_server.accept()
            found = SockDiag().peer(peer, accepted.getsockname())
            client.close()
            accepted.close()
        cgroup = found.cgroup_id if found is not None else None
        tenant_root = ListenerGuard(lambda: {cgroup: "bench"} if cgroup is not None else {}, dict)
    refused_s, _, refused = _run(serve(tenant_root, args.connections))
    n = args.connections
    print(f"served, no guard:   {n / bare_s:8.0f} connections/s ({bare_ok} answered 200)")
    print(f"served, guarded:    {n / guarded_s:8.0f} connections/s ({guarded_ok} answered 200): "
          f"{guarded_s / bare_s:.3f}x the time, {(guarded_s - bare_s) / n * 1e6:+.1f} µs a connection")
    print(f"refused (guarded):  {n / refused_s:8.0f} connections/s ({refused} reset)")


if __name__ == "__main__":
    main()
