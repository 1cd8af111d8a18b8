"""The group queue's hand-over behind requests that wait for a saturated worker, as a figure: the parking lot's
QUEUE spot holds ``--waiting`` requests of sticky users for worker w2 (saturated), and each new user's request
that queues behind them is handed a slot on w1 (``ParkingLot.take_first``, what ``FrontQueue.drain`` asks for a
freed slot).

    .venv/bin/python benchmarks/queue_bench.py [--waiting 10000] [--handovers 2000] [--repo PATH ...] [--compiled]

A hostile tenant can keep its sticky users' requests piled up for one worker (up to its group's ``queue.max``):
what a slot on its other workers costs then is CPU of the daemon every tenant shares. Prints µs per hand-over for
each checkout (``--repo``, default this one; e.g. ``git worktree add /tmp/before <commit>``), from its sources and,
with ``--compiled``, compiled with mypyc as the .deb ships it. Each measurement runs in a fresh interpreter.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

from compiled_tree import compile_front

REPO = Path(__file__).resolve().parent.parent

_ONE_RUN = r'''
import inspect, sys, time
sys.path.insert(0, sys.argv[1])
WAITING, HANDOVERS = int(sys.argv[2]), int(sys.argv[3])
from elasticd.front.core.exchange import Exchange
from elasticd.front.core.parking import PARKED_QUEUE, ParkingLot
lot = ParkingLot()
for n in range(WAITING):
    lot.park(PARKED_QUEUE, "acme/shop/green", f"sticky{n}", Exchange(), float(n), wants="w2")
try:  # take_first(reason, key, free, known); before it, take_first(reason, key, may_go)
    by_sets = len(inspect.signature(ParkingLot.take_first).parameters) == 5
except (TypeError, ValueError):  # (compiled: no signature to read) by what it accepts
    try:
        lot.take_first(PARKED_QUEUE, "acme/shop/none", ["w1"], ["w1", "w2"])
        by_sets = True
    except TypeError:
        by_sets = False
def may_go(wants):
    return wants == "" or wants == "w1"
started = time.process_time()
for n in range(HANDOVERS):
    lot.park(PARKED_QUEUE, "acme/shop/green", f"new{n}", Exchange(), 1e9 + n)
    found = (lot.take_first(PARKED_QUEUE, "acme/shop/green", ["w1"], ["w1", "w2"]) if by_sets
             else lot.take_first(PARKED_QUEUE, "acme/shop/green", may_go))
    if found is None or found[0] != f"new{n}":
        raise SystemExit(f"the new user's request was not the one handed the slot: {found!r}")
print((time.process_time() - started) / HANDOVERS * 1e6)
'''


def measure(tree: Path, waiting: int, handovers: int) -> float:
    out = subprocess.run([sys.executable, "-c", _ONE_RUN, str(tree), str(waiting), str(handovers)], check=True,
                         capture_output=True, text=True, timeout=600).stdout
    return float(out.strip())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--waiting", type=int, default=10_000, help="requests waiting for the saturated worker")
    parser.add_argument("--handovers", type=int, default=2_000, help="hand-overs measured")
    parser.add_argument("--repo", type=Path, action="append", help="a checkout to measure (default: this one)")
    parser.add_argument("--compiled", action="store_true", help="also each checkout's front compiled with mypyc")
    args = parser.parse_args()
    repos = args.repo or [REPO]
    with tempfile.TemporaryDirectory(prefix="queue-bench-") as where:
        trees = [tree for n, repo in enumerate(repos)
                 for tree in ((repo,) + ((compile_front(repo.resolve(), Path(where) / str(n)),) if args.compiled
                                         else ()))]
        print(f"µs a hand-over to a new user's request queued behind {args.waiting} for a saturated worker")
        for tree in trees:
            print(f"  {tree!s:50} {measure(tree, args.waiting, args.handovers):10.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
