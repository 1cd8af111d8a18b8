"""Live moves on loopback: the time from FLAG to SWITCH for an idle user with a package of a given size, and the
latency a request gains when it is parked by a move.

    .venv/bin/python benchmarks/move_bench.py [--moves 40] [--pad-kb 100]

Two demo workers (``python -m elasticd.demo``, with the worker library on a real channel), a real front and the
Mover, all in this process but the workers. The user's ``/counter`` state is padded to ``--pad-kb`` KiB, then
moved back and forth ``--moves`` times while idle; each move's FLAG → SWITCH time is what the journal records.
Then, ``--moves`` times again, one request is sent just after the flag (so it is parked) and its latency compared
with the same request unheld. Goal (issue 13): a 100 KB package moves in under 50 ms. Every process it starts is
stopped by its pid.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from elasticd.config.model import Address  # noqa: E402
from elasticd.front import AppRoute, Front, RouteTable, Upstream  # noqa: E402
from elasticd.pool.channel_server import ChannelServer  # noqa: E402
from elasticd.pool.move_machine import Move, Outcome  # noqa: E402
from elasticd.pool.mover import Mover  # noqa: E402

USER = "0123456789abcdef0123456789abcdef"
HOST = "bench.localhost"


def start_worker(name: str, where: Path, channel: str) -> subprocess.Popen[bytes]:
    env = {**os.environ, "ELASTIC_LISTEN": f"unix:{where}/{name}.sock", "ELASTIC_WORKER_ID": name,
           "ELASTIC_TOKEN": f"token-{name}", "ELASTIC_CHANNEL": f"unix:{channel}", "ELASTIC_OCCUPANCY_INTERVAL": "5",
           "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen([sys.executable, "-m", "elasticd.demo"], env=env, stdin=subprocess.DEVNULL)
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        try:
            with socket.socket(socket.AF_UNIX) as s:
                s.connect(f"{where}/{name}.sock")
            return proc
        except OSError:
            time.sleep(0.02)
    proc.kill()
    raise RuntimeError(f"worker {name} did not start")


async def get(port: int, path: str) -> float:
    """One request on a fresh connection; its latency in seconds."""
    started = time.perf_counter()
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(f"GET {path} HTTP/1.1\r\nHost: {HOST}\r\nCookie: elastic_uid={USER}\r\nConnection: close\r\n\r\n"
                 .encode())
    data = await reader.read()
    writer.close()
    if not data.startswith(b"HTTP/1.1 200"):
        raise RuntimeError(f"{path}: {data[:200]!r}")
    return time.perf_counter() - started


async def main_async(args: argparse.Namespace, where: Path) -> None:
    pids: dict[str, int] = {}

    def authenticate(tenant: str, worker_id: str, token: str, pid: int, uid: int) -> str | None:
        return None if token == f"token-{worker_id}" and worker_id in pids else "unknown"

    channel = ChannelServer(str(where), authenticate, lambda *a: None)
    path = str(where / "workers" / "acme" / "channel.sock")  # (the channel's socket per tenant)
    await channel.serve({"acme": path})
    procs = {name: start_worker(name, where, path) for name in ("w1", "w2")}
    pids.update({name: p.pid for name, p in procs.items()})
    try:
        for _ in range(500):
            if all(channel.capabilities(n) for n in procs):
                break
            await asyncio.sleep(0.02)
        upstreams = [Upstream(n, f"{where}/{n}.sock") for n in procs]
        front = Front(Address("127.0.0.1", 0), RouteTable({HOST: AppRoute("acme", "shop", "green")}),
                      lambda t, a, g: upstreams)
        await front.start()
        assert front.port
        mover = Mover(front, channel)
        front.surface.assign(USER, "w1", front.clock())
        await get(front.port, f"/counter?pad_kb={args.pad_kb}")
        where_now, other = "w1", "w2"
        idle: list[float] = []
        sizes: set[int] = set()
        for _ in range(args.moves):
            move = await mover.move(USER, where_now, other, 10.0)
            assert isinstance(move, Move) and move.outcome is Outcome.MOVED, move
            summary = move.summary()
            idle.append(summary.seconds)
            sizes.add(summary.package_bytes or 0)
            where_now, other = other, where_now
        plain, held = [], []
        for _ in range(args.moves):
            plain.append(await get(front.port, "/counter"))
            moving = asyncio.create_task(mover.move(USER, where_now, other, 10.0))
            await asyncio.sleep(0)  # the flag is set: the next request is held
            held.append(await get(front.port, "/counter"))
            await moving
            where_now, other = other, where_now
        await front.stop(1.0)
        ms = [s * 1000 for s in idle]
        print(f"{args.moves} moves of an idle user, package {sorted(sizes)} bytes: FLAG -> SWITCH median "
              f"{statistics.median(ms):.1f} ms, p90 {sorted(ms)[int(len(ms) * 0.9) - 1]:.1f} ms, "
              f"max {max(ms):.1f} ms (goal < 50 ms)")
        held_ms, plain_ms = statistics.median(held) * 1000, statistics.median(plain) * 1000
        print(f"a request parked by a move: median {held_ms:.1f} ms against {plain_ms:.1f} ms unheld "
              f"(+{held_ms - plain_ms:.1f} ms)")
    finally:
        for proc in procs.values():
            proc.send_signal(signal.SIGTERM)
        for proc in procs.values():
            try:
                proc.wait(5)
            except subprocess.TimeoutExpired:
                proc.kill()
        await asyncio.sleep(0.2)  # the channel's handlers see their workers' connections end
        await channel.stop()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--moves", type=int, default=40)
    parser.add_argument("--pad-kb", type=int, default=100)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="move-bench-") as where:
        asyncio.run(main_async(args, Path(where)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
