"""Load through the front, bounded and on loopback: 10,000 requests over 200 keep-alive connections, with
max_concurrent_requests: 50. The worker (its own process) counts what it serves: never more than 50 at
once, every request answered exactly once (200 and seen once by the worker, or 503 and never seen), no 500."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

from test_demo import REPO
from test_front import front, no_errors_logged, run

from elasticd.config.model import Quotas
from elasticd.front import Upstream

__all__ = ["no_errors_logged"]

CONNECTIONS = 200
PER_CONNECTION = 50
LIMIT = 50

# A worker that counts: requests in flight (and the most ever), and how often it saw each request id.
COUNTING_WORKER = """
import asyncio, collections, json, sys
from aiohttp import web
in_flight = most = 0
seen = collections.Counter()
async def work(request):
    global in_flight, most
    in_flight += 1
    most = max(most, in_flight)
    try:
        seen[request.query["id"]] += 1
        await asyncio.sleep(0.002)
        return web.Response(text=request.query["id"])
    finally:
        in_flight -= 1
async def stats(request):
    return web.json_response({"most": most, "seen": dict(seen)})
async def main():
    app = web.Application()
    app.add_routes([web.get("/work", work), web.get("/stats", stats)])
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.UnixSite(runner, sys.argv[1]).start()
    print("ready", flush=True)
    await asyncio.sleep(120)  # bounded: the test stops it long before
asyncio.run(main())
"""


async def one_connection(port: int, first: int, count: int, results: list[tuple[int, int]]) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        for n in range(first, first + count):
            writer.write(b"GET /work?id=%d HTTP/1.1\r\nHost: shop.localhost\r\nCookie: elastic_uid=%032x\r\n\r\n"
                         % (n, first))
            head = await reader.readuntil(b"\r\n\r\n")
            status = int(head[9:12])
            length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n")
                          if line.lower().startswith(b"content-length:"))
            body = await reader.readexactly(length)
            assert status != 200 or body == str(n).encode(), (n, body)
            results.append((n, status))
    finally:
        writer.close()


def test_ten_thousand_requests_never_exceed_the_limit(tmp_path: Path) -> None:
    sock = tmp_path / "count.sock"
    worker = subprocess.Popen([sys.executable, "-c", COUNTING_WORKER, str(sock)], stdout=subprocess.PIPE,
                              env={**os.environ, "PYTHONPATH": str(REPO)})
    try:
        assert worker.stdout is not None and worker.stdout.readline() == b"ready\n"

        async def scenario() -> tuple[list[tuple[int, int]], dict, float, int, int]:
            results: list[tuple[int, int]] = []
            async with front([Upstream("count", str(sock))], quotas={"acme": Quotas(max_concurrent_requests=LIMIT)},
                             timeout=30) as f:
                start = time.monotonic()
                await asyncio.wait_for(asyncio.gather(*(
                    one_connection(f.port, c * PER_CONNECTION, PER_CONNECTION, results)
                    for c in range(CONNECTIONS))), timeout=120)
                took = time.monotonic() - start
                reader, writer = await asyncio.open_unix_connection(str(sock))
                writer.write(b"GET /stats HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
                stats = json.loads((await reader.read()).split(b"\r\n\r\n", 1)[1])
                writer.close()
                return results, stats, took, len(f.forwards.open), f.quotas.get("acme").gate.in_flight

        results, stats, took, still_open, in_flight = run(scenario())
    finally:
        worker.kill()
        worker.wait()
        assert worker.stdout is not None
        worker.stdout.close()

    statuses = Counter(status for _, status in results)
    print(f"\n{len(results)} requests in {took:.1f}s ({len(results) / took:.0f}/s): {dict(statuses)}, "
          f"at most {stats['most']} at the worker at once")
    assert len(results) == CONNECTIONS * PER_CONNECTION
    assert len({n for n, _ in results}) == len(results)  # each answered once
    assert set(statuses) <= {200, 503} and statuses[200] > 0
    assert stats["most"] <= LIMIT
    served = {str(n) for n, status in results if status == 200}
    assert set(stats["seen"]) == served  # nothing refused reached the worker; nothing served went missing
    assert set(stats["seen"].values()) == {1}  # nothing duplicated
    assert (still_open, in_flight) == (0, 0)
