"""The capacity readings in force, and what they change (a shell: timers, the front's and the pool's books).

It owns the probes (one per worker or node whose group asks for one), the readings book
(``reading.Readings``), and carries each change of a node's readings out to the two places that act on it:

- the front's ``full`` map (worker → until when it takes nothing, the Retry-After, the wait): admission on the
  request path reads that dict, never a probe (seed 001: never on the request path); when a node has room again,
  the requests waiting for it go (``WaitingRequests.room``);
- the pool's ``capacity`` occupancy component (``PoolManager.on_capacity``): a worker that says it is full is
  full, so placement avoids it and scale-up counts it.

A reading also ends by itself (``max_age``, its own ``expires_at``): one timer per node, set at its next
deadline, carries that out too, so no reading outlives its time anywhere.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from elasticd.config.model import Capacity
from elasticd.pool.ports import GroupKey
from elasticd.probes.factory import ProbeError, build_probe
from elasticd.probes.probe import Probe, ProbeTarget
from elasticd.probes.reading import Reading, Readings, backoff_reading, parse_retry_after

__all__ = ["CapacityState", "source_key"]

log = logging.getLogger("elasticd.probes")

FullMap = dict[str, tuple[float, int, float]]


def source_key(target: ProbeTarget, config: Capacity) -> str:
    """What a probe polls: probes with the same key share one rate (``Probe.poll_interval``)."""
    if config.url is not None:
        return config.url
    if target.socket is not None:
        return f"unix:{target.socket}{config.path}"
    return f"{target.url or target.node}{config.path}"


class CapacityState:
    __slots__ = ("_blocks", "_full", "_mono", "_on_capacity", "_on_room", "_probes", "_said", "_stopped", "_targets",
                 "_timers", "_wall", "failures", "readings")

    def __init__(self, full: FullMap, on_room: Callable[[str, GroupKey], Any],
                 on_capacity: Callable[[str, GroupKey, float | None], Any], *,
                 wall: Callable[[], float] = time.time, mono: Callable[[], float] = time.monotonic) -> None:
        self._full = full  # the front's (written here only)
        self._on_room = on_room
        self._on_capacity = on_capacity
        self._wall = wall
        self._mono = mono
        self.readings = Readings()
        self._targets: dict[str, ProbeTarget] = {}
        self._blocks: dict[str, Capacity] = {}
        self._probes: dict[str, Probe] = {}
        self._stopped: list[Probe] = []  # probes a sync stopped, until their HTTP session is closed
        self._timers: dict[str, asyncio.TimerHandle] = {}
        self._said: set[tuple[str, str]] = set()  # build failures warned about (once per node and error)
        # Failed polls, per target (tenant, app, group, node) and reason: elasticd_capacity_probe_failures_total.
        # A target's counts go with it (a worker's node name is its id: kept, they would grow with every restart).
        self.failures: dict[tuple[str, str, str, str], dict[str, int]] = {}

    # ------------------------------------------------------------------ which probes run

    def sync(self, targets: Sequence[tuple[ProbeTarget, Capacity]]) -> None:
        """The workers and nodes with a capacity block, as they are now (after a reload, a worker's start or
        end): a probe is stopped for each that went or changed, built and started for each new one. A block
        that fails to build is skipped with a warning; the others still start."""
        wanted = {target.node: (target, config) for target, config in targets}
        for node in [n for n in self._targets if n not in wanted or wanted[n] != (self._targets[n], self._blocks[n])]:
            self._drop(node)
        sharing: dict[str, int] = {}
        for target, config in wanted.values():
            if config.probed:
                key = source_key(target, config)
                sharing[key] = sharing.get(key, 0) + 1
        for node, (target, config) in wanted.items():
            if node not in self._targets:
                self._targets[node], self._blocks[node] = target, config
                self.readings.describe(node, config.max_age)
                self._build(target, config, sharing)
            elif config.probed and node not in self._probes:
                self._build(target, config, sharing)  # it failed to build before: tried again (a reload, a start)
            probe = self._probes.get(node)
            if probe is not None:
                probe.sharing = sharing.get(source_key(target, config), 1)  # (its next timer uses it)

    def _build(self, target: ProbeTarget, config: Capacity, sharing: dict[str, int]) -> None:
        try:
            probe = build_probe(target, config, self, sharing=sharing.get(source_key(target, config), 1),
                                clock=self._wall)
        except ProbeError as exc:
            if (target.node, str(exc)) not in self._said:
                self._said.add((target.node, str(exc)))
                log.warning("capacity probe of %s not started (admission counts its open requests): %s",
                            target.node, exc)
            return
        if probe is not None:
            self._probes[target.node] = probe
            probe.start()

    def _drop(self, node: str) -> None:
        probe = self._probes.pop(node, None)
        if probe is not None:
            probe.stop()
            self._stopped = [p for p in self._stopped if not p.closed] + [probe]  # its session closes later
        target = self._targets.pop(node)
        self.failures.pop((target.tenant, target.app, target.group, node), None)
        self._blocks.pop(node, None)
        self.readings.drop(node)
        self._changed(node, target)

    async def aclose(self) -> None:
        """Every probe stopped and its HTTP session closed (the daemon's shutdown)."""
        probes, self._probes = [*self._probes.values(), *self._stopped], {}
        self._stopped = []
        await asyncio.gather(*(probe.aclose() for probe in probes), return_exceptions=True)
        for timer in self._timers.values():
            timer.cancel()
        self._timers.clear()

    # ------------------------------------------------------------------ the sink the probes write to

    def set(self, node: str, reading: Reading) -> None:
        target = self._targets.get(node)
        if target is None:
            return  # a node no longer described (its probe's stop raced this answer)
        self.readings.set(node, reading)
        self._changed(node, target)

    def forget(self, node: str, source: str | None) -> None:
        target = self._targets.get(node)
        if self.readings.forget(node, source) and target is not None:
            self._changed(node, target)

    def failed(self, node: str, reason: str) -> None:
        target = self._targets.get(node)
        if target is None:
            return  # (a node no longer described)
        counts = self.failures.setdefault((target.tenant, target.app, target.group, node), {})
        counts[reason] = counts.get(reason, 0) + 1

    def backoff(self, node: str, retry_after: bytes) -> None:
        """A 429 from ``node``: with a Retry-After, and a capacity block other than ``inflight`` (an app's own
        429 to one user is not its capacity: the operator says whose is), it refuses until that ends."""
        config = self._blocks.get(node)
        if config is None or config.probe == "inflight":
            return
        now = self._wall()
        seconds = parse_retry_after(retry_after, now)
        if seconds is None:
            return
        before = self.readings.refusal(node, now)
        self.set(node, backoff_reading(seconds, now))
        if before is None or before.reading.retry_after is None:
            log.info("capacity of %s: it answered 429 with Retry-After %s: no request goes to it for %.0fs",
                     node, retry_after.decode("latin-1", "replace"), seconds)

    # ------------------------------------------------------------------ carrying a change out

    def _changed(self, node: str, target: ProbeTarget) -> None:
        now, mono = self._wall(), self._mono()
        key = (target.tenant, target.app, target.group)
        refusal = self.readings.refusal(node, now) if node in self._targets else None
        was_full = node in self._full
        if refusal is not None:
            wait = self._blocks[node].wait
            self._full[node] = (mono + (refusal.until - now), refusal.retry_after, wait)
        else:
            self._full.pop(node, None)
        tightest = self.readings.tightest(node, now) if node in self._targets else None
        self._on_capacity(node, key, None if tightest is None else tightest.ratio)
        if was_full and refusal is None:
            self._on_room(node, key)
        timer = self._timers.pop(node, None)
        if timer is not None:
            timer.cancel()
        deadline = self.readings.next_deadline(node, now) if node in self._targets else None
        if deadline is not None:
            self._timers[node] = asyncio.get_running_loop().call_later(
                max(deadline - now, 0.0) + 0.001, self._expired, node)

    def _expired(self, node: str) -> None:
        self._timers.pop(node, None)
        target = self._targets.get(node)
        if target is not None:
            try:
                self._changed(node, target)
            except Exception:  # a timer's failure must be said: the reading would otherwise outlive its time
                log.exception("capacity of %s: carrying out its reading's expiry failed", node)

    # ------------------------------------------------------------------ views

    def targets(self) -> Iterator[tuple[ProbeTarget, Capacity]]:
        for node, target in list(self._targets.items()):
            yield target, self._blocks[node]

    def tightest(self, node: str) -> Reading | None:
        return self.readings.tightest(node, self._wall())

    def fresh(self, node: str) -> list[Reading]:
        return self.readings.fresh(node, self._wall())

    def describe(self, node: str) -> dict[str, Any] | None:
        """The node's capacity for the API (``GET …/pool``): its block's kind, its probe's state, its readings."""
        config = self._blocks.get(node)
        if config is None:
            return None
        now = self._wall()
        probe = self._probes.get(node)
        refusal = self.readings.refusal(node, now)
        return {"probe": config.probe, "state": probe.state if probe is not None else None,
                "interval": probe.poll_interval if probe is not None else None, "max_age": config.max_age,
                "readings": [r.as_json(now) for r in self.readings.fresh(node, now)],
                "full": refusal is not None,
                "retry_after": refusal.retry_after if refusal is not None else None}

    def probe_of(self, node: str) -> Probe | None:
        return self._probes.get(node)
