"""The monitor with many users: how fast ``GET /monitor/state`` (the page's refresh: the pool and the population,
every worker asked over the channel) and ``GET /v1/apps/…/population`` answer with 0 and with ``--users`` users
on the surface, and how fast the pure fusion is.

    .venv/bin/python benchmarks/monitor_bench.py [--users 1000] [--rounds 30]

A real elasticd (``python -m elasticd.daemon``, cgroups off) with two demo workers running the library; the
users are real: each makes two requests through the front (the first gets its cookie, the second brings it back
and puts it on the surface). Figures are medians and 95th percentiles over ``--rounds`` requests on loopback;
compare the ratio of the two populations in one run (shared machines are noisy). Goal (issue 14): the page
answers fast with 1,000 users. Every process it starts is stopped by its pid.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import aiohttp

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from elasticd.front.core.sticky import Surface  # noqa: E402
from elasticd.monitor.population import RegisterRow, WorkerAnswer, fuse  # noqa: E402

CONFIG = """\
server:
  listen: 127.0.0.1:{front}
  metrics_listen: 127.0.0.1:{metrics}
  admin_socket: {where}/admin.sock
  runtime_dir: {where}/run
  cgroups: {{mode: "off"}}
  occupancy_interval: 1s
tenants:
  acme:
    apps:
      shop:
        domains: [shop.localhost]
        root: {where}
        groups:
          green:
            command: ["{{python}}", "-m", "elasticd.demo"]
            pool: {{min_workers: 2, max_workers: 2}}
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def wait_announced(session: aiohttp.ClientSession, metrics: int, count: int) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            async with session.get(f"http://127.0.0.1:{metrics}/monitor/state") as response:
                state = await response.json()
            workers = state["pool"]["groups"]["green"]["workers"]
            if sum(1 for w in workers if w["announced"]) >= count:
                return
        except (aiohttp.ClientError, KeyError):
            pass
        await asyncio.sleep(0.2)
    raise RuntimeError("the workers did not announce")


async def make_users(front: int, count: int) -> None:
    """``count`` users, each two requests (the second with its cookie: on the surface), 32 at a time."""
    semaphore = asyncio.Semaphore(32)
    connector = aiohttp.TCPConnector(limit=32)
    async with aiohttp.ClientSession(connector=connector, cookie_jar=aiohttp.DummyCookieJar()) as session:
        async def one() -> None:
            async with semaphore:
                url = f"http://127.0.0.1:{front}/counter"
                async with session.get(url, headers={"Host": "shop.localhost"}) as response:
                    await response.read()
                    cookie = response.headers["Set-Cookie"].split(";")[0]
                async with session.get(url, headers={"Host": "shop.localhost", "Cookie": cookie}) as response:
                    await response.read()

        await asyncio.gather(*(one() for _ in range(count)))


async def timed(session: aiohttp.ClientSession, url: str, rounds: int) -> tuple[list[float], int, int]:
    """(latencies in seconds, the body's size, the users in it) over ``rounds`` GETs."""
    latencies, size, users = [], 0, 0
    for _ in range(rounds):
        started = time.perf_counter()
        async with session.get(url) as response:
            body = await response.read()
        latencies.append(time.perf_counter() - started)
        data = json.loads(body)
        population = data.get("population", data)
        size, users = len(body), population["population"]
    return latencies, size, users


def figures(latencies: list[float]) -> str:
    ordered = sorted(latencies)
    p95 = ordered[min(len(ordered) - 1, int(0.95 * len(ordered)))]
    return f"median {statistics.median(ordered) * 1000:6.1f} ms   p95 {p95 * 1000:6.1f} ms"


def fusion_figure(users: int) -> float:
    """The pure fusion of ``users`` users on two workers: seconds per call (median of 20)."""
    surface = Surface(ttl=600.0)
    now = 1000.0
    registers: dict[str, list[RegisterRow]] = {"w1": [], "w2": []}
    for i in range(users):
        user = f"{i:032x}"
        worker = "w1" if i % 2 else "w2"
        surface.assign(user, worker, now).add(0.01, now)
        registers[worker].append(RegisterRow(user, 0, None, 1.0))
    answers = [WorkerAnswer(w, "green", register=tuple(rows)) for w, rows in registers.items()]
    samples = []
    for _ in range(20):
        started = time.perf_counter()
        fuse(answers, list(surface.users.items()), now)
        samples.append(time.perf_counter() - started)
    return statistics.median(samples)


async def run(args: argparse.Namespace, where: Path) -> None:
    front, metrics = free_port(), free_port()
    config = where / "elastic.yaml"
    config.write_text(CONFIG.format(front=front, metrics=metrics, where=where))
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    log = open(where / "elasticd.log", "wb")  # noqa: SIM115 - closed below
    daemon = subprocess.Popen([sys.executable, "-m", "elasticd.daemon", "--config", str(config)], env=env,
                              stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        state_url = f"http://127.0.0.1:{metrics}/monitor/state?app=acme/shop"
        async with aiohttp.ClientSession() as session:
            await wait_announced(session, metrics, 2)
            rows = []
            empty, size0, users0 = await timed(session, state_url, args.rounds)
            rows.append((f"/monitor/state, {users0:>5} users", empty, size0))
            started = time.perf_counter()
            await make_users(front, args.users)
            made = time.perf_counter() - started
            full, size1, users1 = await timed(session, state_url, args.rounds)
            rows.append((f"/monitor/state, {users1:>5} users", full, size1))
        admin = aiohttp.UnixConnector(path=str(where / "admin.sock"))
        async with aiohttp.ClientSession(connector=admin) as session:
            population, size2, users2 = await timed(session, "http://elasticd/v1/apps/acme/shop/population",
                                                    args.rounds)
            rows.append((f"population API, {users2:>5} users", population, size2))
        print(f"{args.users} users made through the front in {made:.1f} s (2 requests each)")
        for name, latencies, size in rows:
            print(f"{name:<32} {figures(latencies)}   {size / 1024:7.1f} KiB")
        ratio = statistics.median(full) / statistics.median(empty)
        print(f"ratio {users1} users / {users0}: {ratio:.1f}x the empty page's time")
        print(f"the pure fusion of {args.users} users: {fusion_figure(args.users) * 1000:.2f} ms")
    finally:
        os.killpg(daemon.pid, signal.SIGTERM)  # our daemon's own session: it and the workers it started
        try:
            daemon.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(daemon.pid, signal.SIGKILL)
            daemon.wait()
        log.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--users", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=30)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="monitor-bench-") as where:
        asyncio.run(run(args, Path(where)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
