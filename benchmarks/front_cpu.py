"""The front's own CPU per request, with no socket: what our Python (and httptools) costs, apart from the
kernel and the event loop.

    .venv/bin/python benchmarks/front_cpu.py [--requests 60000] [--rounds 6] [--repo PATH ...] [--compiled]
                                             [--probe] [--queued]

One client connection and one pooled worker connection, both on fake transports: a request's bytes go into
the client side, the worker's answer's bytes into the worker side, and that is repeated, with the quota,
stickiness and the forward counters on, for a new user (no cookie) and for a returning one. Each
measurement runs in a fresh interpreter; with several ``--repo`` (checkouts, e.g. made with ``git worktree
add /tmp/before <commit>``) the runs alternate between them, and the minimum and the median of each are
printed; ``--compiled`` adds each checkout's front compiled with mypyc (setup.py, as the .deb ships it, built
into a temporary copy). On a shared machine front_bench.py's figures drift by several percent between runs;
these do much less, which is what a change of a few per cent needs. The kernel's part (the two sends, the two reads and
epoll, about 6 µs a request here) is measured by front_bench.py against nginx, not here.

``--probe`` adds each user with capacity admission at work (issue 16): the group's reception has a capacity
reading that says it is full, so every request is admitted past it — the front reads the cached refusal and
never a probe (the probes poll on their own timer).

``--queued`` adds each user with every request waiting in the group's queue (the front's config default, 8, with
more clients than that: front_bench.py's default, 42 waiting): a group of concurrency 1 and 43 clients, so each
request is queued behind 41 others, and handed the freed slot in the loop's next turn when its turn comes.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from compiled_tree import compile_front

REPO = Path(__file__).resolve().parent.parent
USER = "0123456789abcdef0123456789abcdef"

_ONE_RUN = r'''
import asyncio, sys, time
sys.path.insert(0, sys.argv[1])
N, RETURNING, PROBE, QUEUED = (int(sys.argv[2]), sys.argv[3] == "returning", sys.argv[5] == "probe",
                               sys.argv[5] == "queued")
try:
    from elasticd.config.model import Address, Quotas
except ImportError:  # a checkout from before config/ was a package
    from elasticd.config import Address, Quotas
from elasticd.front import AppRoute, Front, RouteTable, Upstream
import elasticd.front.upstream as upstream
from elasticd.front.client import ClientConn
Pool = getattr(upstream, "ConnectionPool", None) or getattr(upstream, "Pool")
USER = sys.argv[4]
REQUEST = (b"GET / HTTP/1.1\r\nHost: bench.localhost\r\nUser-Agent: wrk\r\n"
           + (b"Cookie: elastic_uid=" + USER.encode() + b"\r\n" if RETURNING else b"") + b"\r\n")
ANSWER = (b"HTTP/1.1 200 OK\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: 13\r\n"
          b"Date: Tue, 01 Dec 2026 13:00:00 GMT\r\nServer: Python/3.11 aiohttp/3.9.1\r\n\r\nHello, world!")

class Transport:
    def write(self, data): pass
    def get_extra_info(self, key, default=None): return ("127.0.0.1", 5555) if key == "peername" else default
    def is_closing(self): return False
    def close(self): raise SystemExit("the front closed a connection: the benchmark is broken")
    def pause_reading(self): pass
    def resume_reading(self): pass
    def can_write_eof(self): return True

async def main():
    # With a probe: the reception ("full") says it is full, so every request is admitted past it to "bench".
    upstreams = [Upstream("bench", "/nonexistent.sock")]
    if PROBE:
        upstreams.insert(0, Upstream("full", "/nonexistent-full.sock"))
    route = (AppRoute("acme", "shop", "green", concurrency=(("green", 1),)) if QUEUED
             else AppRoute("acme", "shop", "green"))
    front = Front(Address("127.0.0.1", 0), RouteTable({"bench.localhost": route}),
                  lambda tenant, app, group: upstreams,
                  quotas={"acme": Quotas(max_concurrent_requests=10_000, requests_per_second=1e9, burst=10_000_000)})
    front.surface.assign(USER, "bench", front.clock())
    health = getattr(front, "health", front)  # (a checkout from before the front's parts: the Front itself)
    if PROBE:
        if not hasattr(health, "full"):  # a checkout from before capacity admission
            print("nan")
            return
        health.full["full"] = (float("inf"), 1, 1.0)
    books = getattr(front, "forwards", None) or getattr(front, "accounting")
    if QUEUED and hasattr(front, "waiting"):  # the pool as the front makes it: its worker bound to the group's slots
        pool = front.worker_links.new_pool(upstreams[-1], route, "green")
    else:
        pool = Pool(upstreams[-1], books.worker("bench"))
        pools = front.worker_links.pools if hasattr(front, "worker_links") else front._pools
        pools["bench"] = pool
    worker = upstream.UpstreamConn(pool)
    worker.connection_made(Transport())
    pool.idle.append(worker)
    pool.conns.add(worker)
    def connection():
        client = front.listening.connection() if hasattr(front, "listening") else ClientConn(front)
        client.connection_made(Transport())
        return client
    client = connection()
    if QUEUED:
        if not hasattr(front, "waiting"):  # a checkout from before the group queue
            print("nan")
            return
        # A group of concurrency 1 and 43 clients: one request in flight, 42 waiting in the group's queue (as
        # front_bench.py's default: wrk's 50 connections, the config's concurrency of 8). Each answer frees the
        # slot, the loop's next turn hands it to the oldest waiting request, and the answered client asks again, at
        # the queue's tail: every request is queued once and handed over once.
        clients = [client] + [connection() for _ in range(42)]
        for each in clients:
            each.data_received(REQUEST)
        async def pair():
            for turn in clients:
                worker.data_received(ANSWER)  # the one in flight is answered: its slot comes free
                await asyncio.sleep(0)  # the hand-over's turn of the loop: the oldest waiting request goes
                turn.data_received(REQUEST)  # its client asks again, and waits
        rounds = N // len(clients)
        for _ in range(5000 // len(clients)):
            await pair()
        started = time.process_time()
        for _ in range(rounds):
            await pair()
        spent = time.process_time() - started
        # Less the benchmark's own task steps (a coroutine resumed after each sleep(0)), which the front does not
        # have: its hand-over runs as a plain callback of the loop.
        started = time.process_time()
        for _ in range(rounds * len(clients)):
            await asyncio.sleep(0)
        spent -= time.process_time() - started
        waited = front.forwards.queue("acme/shop/green").count
        if waited < rounds * len(clients):  # every measured request (and the warm-up's) went through the queue
            raise SystemExit(f"only {waited} requests waited in the queue: the benchmark is broken")
        print(spent / (rounds * len(clients)) * 1e6)
        return
    def one():
        client.data_received(REQUEST)
        worker.data_received(ANSWER)
    for _ in range(5000):
        one()
    started = time.process_time()
    for _ in range(N):
        one()
    print((time.process_time() - started) / N * 1e6)

if QUEUED:  # the hand-over takes a turn of the loop: the one the daemon's front runs on
    try:
        import uvloop
        uvloop.install()
    except ImportError:
        pass
asyncio.run(main())
'''


def measure(repo: Path, requests: int, who: str, probe: str = "none") -> float:
    out = subprocess.run([sys.executable, "-c", _ONE_RUN, str(repo), str(requests), who, USER, probe], check=True,
                         capture_output=True, text=True, timeout=300).stdout
    return float(out.strip())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=60_000, help="requests per measurement (default 60000)")
    parser.add_argument("--rounds", type=int, default=6, help="measurements per checkout and user (default 6)")
    parser.add_argument("--repo", type=Path, action="append", help="a checkout to measure (default: this one)")
    parser.add_argument("--compiled", action="store_true", help="also each checkout's front compiled with mypyc")
    parser.add_argument("--probe", action="store_true", help="also with a capacity reading refusing the reception")
    parser.add_argument("--queued", action="store_true",
                        help="also with every request waiting in the group's queue (concurrency 1, 43 clients)")
    args = parser.parse_args()
    repos = args.repo or [REPO]
    with tempfile.TemporaryDirectory(prefix="front-cpu-") as where:
        if args.compiled:
            repos = [tree for n, repo in enumerate(repos)
                     for tree in (repo, compile_front(repo.resolve(), Path(where) / str(n)))]
        report(repos, args)
    return 0


def report(repos: list[Path], args: argparse.Namespace) -> None:
    figures: dict[tuple[Path, str, str], list[float]] = {}
    probes = ("none",) + (("probe",) if args.probe else ()) + (("queued",) if args.queued else ())
    for _ in range(args.rounds):
        for repo in repos:
            for who in ("new", "returning"):
                for probe in probes:
                    figures.setdefault((repo, who, probe), []).append(measure(repo, args.requests, who, probe))
    print(f"the front's own CPU per request, µs (no socket; {args.requests} requests, {args.rounds} rounds)")
    for (repo, who, probe), values in figures.items():
        values = [v for v in values if v == v]  # (nan: that checkout has no capacity admission)
        if not values:
            continue
        label = f"{who} {({'probe': '+ full reading', 'queued': '+ queued'}).get(probe, '')}"
        print(f"  {repo!s:40} {label:25} min {min(values):5.2f}  median {statistics.median(values):5.2f}")


if __name__ == "__main__":
    raise SystemExit(main())
