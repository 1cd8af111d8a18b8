"""Quota exactness under load, as a figure: the front in its own process (uvloop, as the daemon runs it) with
a tenant at ``max_concurrent_requests: 50``, a worker in another process that sleeps 20 ms and counts how many
requests it holds at once, and a client making 10,000 requests over 200 concurrent connections.

    .venv/bin/python benchmarks/quota_bench.py [--requests 10000] [--connections 200] [--limit 50]
                                               [--sleep-ms 20] [--rounds 3]

Prints per round: the answers by status (and Retry-After), the worker's peak concurrency (it must never pass
the limit), the requests per second, and the front's RSS before the first round, after each round and at the
end (it must come back: nothing per request is kept). Loopback only, bounded; every process it starts is
stopped by its pid. The same scenario is a functional test (tests/test_quota_front.py); this is the figure.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
HOST = "quota.localhost"


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def serve_worker(path: str, sleep_ms: float) -> None:
    from aiohttp import web

    seen = {"now": 0, "most": 0}

    async def slow(request: web.Request) -> web.Response:
        seen["now"] += 1
        seen["most"] = max(seen["most"], seen["now"])
        try:
            await asyncio.sleep(sleep_ms / 1000)
        finally:
            seen["now"] -= 1
        return web.Response(text="ok")

    async def stats(request: web.Request) -> web.Response:
        most, seen["most"] = seen["most"], 0
        return web.json_response({"most": most})

    app = web.Application()
    app.router.add_get("/stats", stats)
    app.router.add_get("/{tail:.*}", slow)
    web.run_app(app, path=path, print=None, access_log=None)


def serve_front(port: int, path: str, limit: int) -> None:
    sys.path.insert(0, str(REPO))
    import uvloop

    from elasticd.config.model import Address, Quotas
    from elasticd.front import AppRoute, Front, RouteTable, Upstream

    upstreams = [Upstream("slow", path)]

    async def main() -> None:
        front = Front(Address("127.0.0.1", port), RouteTable({HOST: AppRoute("acme", "shop", "green")}),
                      lambda tenant, app, group: upstreams, quotas={"acme": Quotas(max_concurrent_requests=limit)})
        await front.start()
        stop = asyncio.Event()
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
        await stop.wait()
        await front.stop(1.0)

    uvloop.install()
    asyncio.run(main())


async def one_round(port: int, worker_sock: str, requests: int, connections: int) -> tuple[Counter, int, float]:
    import aiohttp

    codes: Counter = Counter()
    left = iter(range(requests))
    start = time.monotonic()
    connector = aiohttp.TCPConnector(limit=connections)
    async with aiohttp.ClientSession(connector=connector, cookie_jar=aiohttp.DummyCookieJar()) as session:
        async def loop() -> None:
            for _ in left:
                async with session.get(f"http://127.0.0.1:{port}/", headers={"Host": HOST},
                                       timeout=aiohttp.ClientTimeout(total=30)) as resp:
                    await resp.read()
                    codes[(resp.status, resp.headers.get("Retry-After"))] += 1
        await asyncio.gather(*(loop() for _ in range(connections)))
    seconds = time.monotonic() - start
    stats = aiohttp.UnixConnector(path=worker_sock)
    async with aiohttp.ClientSession(connector=stats) as session, session.get("http://worker/stats") as resp:
        most = int((await resp.json())["most"])
    return codes, most, seconds


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=10_000)
    parser.add_argument("--connections", type=int, default=200)
    parser.add_argument("--limit", type=int, default=50)
    parser.add_argument("--sleep-ms", type=float, default=20.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--serve-worker", nargs=2, metavar=("SOCKET", "SLEEP_MS"), help=argparse.SUPPRESS)
    parser.add_argument("--serve-front", nargs=3, metavar=("PORT", "SOCKET", "LIMIT"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve_worker:
        serve_worker(args.serve_worker[0], float(args.serve_worker[1]))
        return 0
    if args.serve_front:
        serve_front(int(args.serve_front[0]), args.serve_front[1], int(args.serve_front[2]))
        return 0

    tmp = Path(tempfile.mkdtemp(prefix="elasticd-quota-bench-"))
    sock, port = str(tmp / "slow.sock"), free_port()
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    worker = subprocess.Popen([sys.executable, __file__, "--serve-worker", sock, str(args.sleep_ms)], env=env)
    front = subprocess.Popen([sys.executable, __file__, "--serve-front", str(port), sock, str(args.limit)], env=env)
    failed = False
    try:
        for _ in range(100):
            if os.path.exists(sock):
                try:
                    socket.create_connection(("127.0.0.1", port), 0.2).close()
                    break
                except OSError:
                    pass
            time.sleep(0.1)
        asyncio.run(one_round(port, sock, 500, 50))  # warm up: code paths, pools, the allocator's arenas
        start_rss = rss_kib(front.pid)
        print(f"{args.requests} requests over {args.connections} connections per round; tenant "
              f"max_concurrent_requests {args.limit}; worker sleeps {args.sleep_ms:g} ms")
        print(f"front RSS after warm-up: {start_rss / 1024:.1f} MiB")
        for n in range(1, args.rounds + 1):
            codes, most, seconds = asyncio.run(one_round(port, sock, args.requests, args.connections))
            answers = ", ".join(f"{status}{' Retry-After ' + ra if ra else ''}: {count}"
                                for (status, ra), count in sorted(codes.items(), key=lambda kv: str(kv[0])))
            ok = most <= args.limit and set(codes) <= {(200, None), (503, "1")} and sum(codes.values()) == args.requests
            failed |= not ok
            print(f"round {n}: {answers}; worker peak {most}/{args.limit} at once; "
                  f"{args.requests / seconds:.0f} req/s; front RSS {rss_kib(front.pid) / 1024:.1f} MiB"
                  f"{'' if ok else '  <-- NOT EXACT'}")
        time.sleep(1.0)
        end_rss = rss_kib(front.pid)
        print(f"front RSS at the end: {end_rss / 1024:.1f} MiB ({(end_rss - start_rss) / 1024:+.1f} MiB "
              f"since the warm-up)")
    finally:
        for proc in (front, worker):
            proc.send_signal(signal.SIGTERM)
        for proc in (front, worker):
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
