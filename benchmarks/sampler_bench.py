"""Sampler and /metrics cost on a fake tree of 1,000 apps over 100 tenants, plus the real cgroup2 files.

    .venv/bin/python benchmarks/sampler_bench.py [--tenants 100] [--apps 10] [--ticks 20] [--dir DIR]

Reports the sampler's CPU time (time.process_time) per tick and per cgroup, with the files unchanged
between ticks (idle apps) and with every counter changed before every tick (the worst case: everything
is parsed), the /metrics render time (in process and over HTTP), and, read-only, open+read+close against
pread on this machine's real cgroup2 files. Goal (issue #4): < 30 µs CPU per cgroup per tick for the nine
files, parsing included; a scrape < 100 ms. Run on demand, not by the tests. Never writes to cgroupfs.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import aiohttp
from prometheus_client import generate_latest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from elasticd.accounting.exposition import expose
from elasticd.accounting.fake import FakeCgroup, write_fake_cgroup
from elasticd.accounting.files import CgroupFiles
from elasticd.accounting.sample import FILES, SampleBuilder, sample_from_texts
from elasticd.accounting.sampler import Key, Sampler
from elasticd.cgroup.discovery import parse_mountinfo
from elasticd.config.model import Address, Resources
from elasticd.metrics import MetricsServer


def fake_state(i: int, tick: int) -> FakeCgroup:
    """Plausible numbers for cgroup ``i`` at ``tick``; every counter moves with the tick."""
    base = i * 1_000_003 + tick * 250_000
    io = {"8:0": (base * 4096, base * 512, base, base // 8)}
    if i % 3 == 0:  # some groups also touch a second and a third disk
        io["259:0"] = (base * 8192, base * 64, base // 2, base // 16)
        io["253:0"] = (base * 16, base * 16, base // 4, base // 4)
    return FakeCgroup(
        usage_usec=base * 3, user_usec=base * 2, system_usec=base, nr_periods=tick * 50, nr_throttled=tick,
        throttled_usec=tick * 1234, memory_current=200_000_000 + base, swap_current=0,
        memory_events={"high": tick, "max": tick // 10}, pids_current=10 + i % 50, io=io,
        pressure={"cpu": (1.25, base, 0.5, base // 2), "memory": (0.0, tick, 0.0, tick),
                  "io": (0.31, base // 3, 0.17, base // 4)},
    )


def make_tree(root: Path, tenants: int, apps: int) -> dict[Key, Path]:
    targets: dict[Key, Path] = {}
    i = 0
    for t in range(tenants):
        tenant = f"tenant{t:03d}"
        tdir = root / "tenants" / tenant
        targets[("tenant", tenant)] = tdir
        write_fake_cgroup(tdir, fake_state(i, 0))
        i += 1
        for a in range(apps):
            app = f"app{a:02d}"
            targets[("app", tenant, app)] = tdir / app
            write_fake_cgroup(tdir / app, fake_state(i, 0))
            i += 1
    return targets


def rewrite_all(targets: dict[Key, Path], tick: int) -> None:
    for i, path in enumerate(targets.values()):
        write_fake_cgroup(path, fake_state(i, tick))


def cpu_per_tick(sampler: Sampler, ticks: int, before: Callable[[int], None] | None = None) -> list[float]:
    """CPU seconds of each sample_once (the rewrites of ``before`` are not counted)."""
    costs = []
    for tick in range(1, ticks + 1):
        if before is not None:
            before(tick)
        start = time.process_time()
        sampler.sample_once(time.monotonic())
        costs.append(time.process_time() - start)
    return costs


def per_call_usec(fn: Callable[[], object], n: int) -> float:
    start = time.process_time()
    for _ in range(n):
        fn()
    return (time.process_time() - start) / n * 1e6


def real_cgroup2() -> Path | None:
    try:
        point = parse_mountinfo(Path("/proc/self/mountinfo").read_text())
    except OSError:
        return None
    return Path(point) if point else None


# Files of the cgroup2 root with the shape of those it lacks (the root has no memory.*, pids.*, io.stat).
_STAND_INS = {"memory.current": "cgroup.max.depth", "memory.swap.current": "cgroup.max.descendants",
              "memory.events": "cgroup.stat", "pids.current": "cgroup.pressure", "io.stat": "cpu.stat.local"}


def real_stand_ins(root: Path) -> tuple[str, ...] | None:
    names = []
    for name in FILES:
        if not (root / name).exists():
            name = _STAND_INS.get(name, name)
            if not (root / name).exists():
                return None
        names.append(name)
    return tuple(names)


def real_file_costs(root: Path, n: int = 20000) -> list[tuple[str, float, float]]:
    """(file, open+read+close µs, pread µs) for the accounting files present in ``root`` (read-only)."""
    rows = []
    for name in FILES:
        path = root / name
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            continue

        def orc(path: Path = path) -> None:
            f = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
            os.read(f, 65536)
            os.close(f)

        try:
            rows.append((name, per_call_usec(orc, n), per_call_usec(lambda fd=fd: os.pread(fd, 65536, 0), n)))
        finally:
            os.close(fd)
    return rows


async def scrape_http(server: MetricsServer, n: int) -> tuple[list[float], int]:
    times = []
    size = 0
    async with aiohttp.ClientSession() as session:
        for _ in range(n):
            start = time.perf_counter()
            async with session.get(f"http://127.0.0.1:{server.port}/metrics") as response:
                body = await response.read()
            times.append(time.perf_counter() - start)
            size = len(body)
    return times, size


async def scrape(sampler: Sampler, limits: dict[str, Resources], n: int) -> None:
    server = MetricsServer(Address("127.0.0.1", 0), sampler, lambda: limits)
    render = [0.0] * n
    collect = [0.0] * n
    library = [0.0] * n
    # CPU time in process (steady on a busy host), wall time over HTTP (what Prometheus waits).
    for i in range(n):
        start = time.process_time()
        families = server.collect()
        collect[i] = time.process_time() - start
        body = expose(families)
        render[i] = time.process_time() - start
        start = time.process_time()
        generate_latest(server.registry)
        library[i] = time.process_time() - start
    series = sum(1 for line in body.splitlines() if line and not line.startswith(b"#"))
    await server.start()
    try:
        http, size = await scrape_http(server, n)
    finally:
        await server.stop()
    print(f"\n/metrics: {series} series, {size / 1024:.0f} KiB ({n} scrapes)")
    for label, times in (("CPU: collect + write the text", render),
                         ("CPU:   of which collect (event loop)", collect),
                         ("CPU: generate_latest() instead", library),
                         ("wall: GET over HTTP (127.0.0.1)", http)):
        print(f"  {label:40} median {statistics.median(times) * 1e3:6.1f} ms   max {max(times) * 1e3:6.1f} ms")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tenants", type=int, default=100)
    parser.add_argument("--apps", type=int, default=10, help="apps per tenant")
    parser.add_argument("--ticks", type=int, default=20)
    parser.add_argument("--scrapes", type=int, default=10)
    parser.add_argument("--dir", help="where to make the fake tree (default: a temporary directory)")
    args = parser.parse_args()

    root = Path(tempfile.mkdtemp(prefix="elasticd-bench-", dir=args.dir))
    try:
        targets = make_tree(root, args.tenants, args.apps)
        groups = len(targets)
        print(f"fake tree: {args.tenants} tenants, {groups - args.tenants} apps, {groups} cgroups x "
              f"{len(FILES)} files under {root}")
        sampler = Sampler()
        sampler.set_targets(targets)
        sampler.sample_once(time.monotonic())  # opens every descriptor
        idle = cpu_per_tick(sampler, args.ticks)
        busy = cpu_per_tick(sampler, args.ticks, lambda tick: rewrite_all(targets, tick))

        texts = [(root / "tenants" / "tenant000" / "app00" / name).read_text() for name in FILES]
        parse = per_call_usec(lambda: sample_from_texts(0.0, texts), 20000)
        files = CgroupFiles(root / "tenants" / "tenant000" / "app00")
        files.read(0)
        read = per_call_usec(lambda: files.read(1), 20000)
        files.close()

        print(f"\nsampler CPU per tick ({args.ticks} ticks)      per tick            per cgroup")
        for label, costs in (("files unchanged (idle)", idle), ("every counter changed", busy)):
            med = statistics.median(costs)
            print(f"  {label:34} median {med * 1e3:6.2f} ms   median {med / groups * 1e6:5.1f} µs "
                  f"(max {max(costs) / groups * 1e6:.1f})")
        print(f"  parts: 9 preads of the fake files {read:.1f} µs; parsing all 9 texts {parse:.1f} µs")

        limits = {key[1]: Resources(cpu=150.0, memory=1 << 30, pids=512, io_read=50 << 20, io_write=20 << 20)
                  for key in targets if key[0] == "tenant"}
        asyncio.run(scrape(sampler, limits, args.scrapes))
        sampler.close()
    finally:
        shutil.rmtree(root, ignore_errors=True)

    real = real_cgroup2()
    if real is None:
        print("\nno cgroup2 mount: skipping the real-file measures")
        return 0
    rows = real_file_costs(real)
    if not rows:
        return 0
    print(f"\nreal cgroup2 files, read-only ({real}; {len(rows)} of the 9 present there)")
    for name, orc, pread in rows:
        print(f"  {name:18} open+read+close {orc:5.2f} µs    pread at 0 {pread:5.2f} µs")
    names = real_stand_ins(real)
    if names is not None:
        # One pass as the sampler makes it (descriptors kept, bytes compared, changed files parsed), over
        # as many cgroups as the fake tree has, each reading nine real cgroupfs files.
        readers = [(CgroupFiles(real, names), SampleBuilder()) for _ in range(groups)]
        costs = []
        for tick in range(args.ticks + 1):
            start = time.process_time()
            for files, builder in readers:
                builder.build(0.0, files.read(tick))
            costs.append(time.process_time() - start)
        for files, _ in readers:
            files.close()
        kern = statistics.median(costs[1:])  # the first pass opens the descriptors
        swapped = ", ".join(f"{a} for {b}" for a, b in zip(names, FILES, strict=True) if a != b)
        print(f"  a pass over {groups} cgroups x 9 real files ({swapped}): {kern * 1e3:.2f} ms CPU per tick, "
              f"{kern / groups * 1e6:.1f} µs per cgroup")
    mean_pread = statistics.mean(r[2] for r in rows)
    print(f"  every file changed on cgroupfs, estimated: 9 x {mean_pread:.2f} µs pread + {parse:.1f} µs "
          f"parsing = {9 * mean_pread + parse:.1f} µs per cgroup")
    return 0


if __name__ == "__main__":
    sys.exit(main())
