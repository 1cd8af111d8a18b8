"""A stall watch for a running daemon (diagnosis, not shipped): what holds its event loop, and for how long.

    ELASTICD_STALL_WATCH=1 PYTHONPATH=benchmarks/stall_watch:. .venv/bin/python -m elasticd.daemon --config ...

Python imports ``sitecustomize`` at start from the path, so the daemon runs unchanged with two probes added. Each
writes a line to stderr, stamped with ``time.monotonic()`` (one clock for every process on the host: a client's slow
answers can be matched to the lines by it) and its pid (the daemon's children inherit the environment, and watch too):

- ``stall-watch: gc``: every collection over 3 ms, its generation, duration and what it freed, and the thread it ran
  in (a collection holds the interpreter: no thread runs, the loop waits);
- ``stall-watch: held``: a watch thread wakes every millisecond; when it could not run for over 10 ms, something held
  the interpreter's lock that long without letting go at the switch interval (a collection, or one long C call: that
  is how ``gc.get_freeze_count()`` in a log argument was found, heap.py);
- ``stall-watch: busy``: the loop thread was seen inside a callback, sample after sample, for over 15 ms, with its
  most common stacks. Work done in slices (loop_slices.py) shows as one streak here though the loop turns between
  them: read it with the ``held`` lines and the client's figures.

Made for stop 53's search (docs/HOSTING.md); density_bench.py's FrontProbe is the client it was matched with.
"""

from __future__ import annotations

import collections
import gc
import os
import sys
import threading
import time
from types import FrameType
from typing import Any

_GC_OVER = 0.003
_HELD_OVER = 0.010
_BUSY_OVER = 0.015


def _say(text: str) -> None:
    sys.stderr.write(f"stall-watch: {time.monotonic():.3f} pid {os.getpid()} {text}\n")


def _stack(frame: FrameType | None, depth: int = 7) -> str:
    names: list[str] = []
    while frame is not None and len(names) < depth:
        names.append(f"{frame.f_code.co_name}:{frame.f_lineno}")
        frame = frame.f_back
    return " < ".join(names)


def _start() -> None:
    began: dict[int, float] = {}

    def collection(phase: str, info: dict[str, Any]) -> None:
        now, thread = time.perf_counter(), threading.get_ident()
        if phase == "start":
            began[thread] = now
            return
        start = began.pop(thread, None)
        if start is not None and now - start > _GC_OVER:
            _say(f"gc gen{info['generation']} {1000 * (now - start):.1f} ms, {info['collected']} freed, in "
                 f"{threading.current_thread().name}")

    gc.callbacks.append(collection)
    main = threading.main_thread().ident

    def watch() -> None:
        busy_since: float | None = None
        stacks: collections.Counter[str] = collections.Counter()
        last = time.perf_counter()
        while True:
            time.sleep(0.001)
            now = time.perf_counter()
            if now - last > _HELD_OVER:
                _say(f"held: the watch could not run for {1000 * (now - last):.1f} ms")
            last = now
            frame = sys._current_frames().get(main or 0)
            if frame is None:
                continue
            if frame.f_code.co_filename.endswith("runners.py"):  # (asyncio.Runner.run: the loop waits for events)
                if busy_since is not None and now - busy_since > _BUSY_OVER:
                    top = "; ".join(f"{n}x {s}" for s, n in stacks.most_common(4))
                    _say(f"busy {1000 * (now - busy_since):.1f} ms: {top}")
                busy_since = None
                stacks.clear()
            else:
                if busy_since is None:
                    busy_since = now
                stacks[_stack(frame)] += 1

    threading.Thread(target=watch, name="stall-watch", daemon=True).start()


if os.environ.get("ELASTICD_STALL_WATCH"):
    _start()
