"""Forward counters: what the front clocks around every relay. Pure: times are passed in.

- per worker, cumulative ``requests``, ``errors`` (answers >= 500, the front's own 502/504 included) and
  ``seconds`` of forwarding — the forward counters the pool's worker_metrics rows snapshot;
- per user, ``requests`` and ``seconds`` (``consumption``), kept on the user's surface entry so they are
  forgotten with it — credited by the exchange, which alone knows whether the answer was the worker's;
- the open requests: a dict id → the request (``.user``, ``.worker``, ``.ts``), not a counter — a drifted
  counter never heals, a stale entry is visible and swept by its timestamp; the pool quiesces a user on it;
- per (tenant, app), answers by status code and a latency histogram, per tenant the quota refusals, and per
  (tenant, app) what the front refused of its workers' answers, by reason (``bounds``): what
  ``request_metrics.FrontCollector`` exposes.

Everything here is read by other threads only through copies (the metrics page renders in a thread).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Final, Protocol

__all__ = ["BOUNDS", "QUEUE_FULL", "QUEUE_NO_WORKER", "QUEUE_TIMEOUT", "ForwardCounters", "OpenRequest", "QueueStats",
           "RouteStats", "WorkerCounters", "bucket"]

# Prometheus' default buckets: fine where a proxied request lives (ms to seconds).
BOUNDS: Final[tuple[float, ...]] = (0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0)


class OpenRequest(Protocol):
    """What an open-requests entry exposes (the front stores its own exchange object: no copy per request)."""

    user: str | None
    worker: str | None
    ts: float

    @property
    def started(self) -> bool:  # the worker's answer has begun
        ...

    @property
    def live(self) -> bool:  # still relaying to or from the worker
        ...


class WorkerCounters:
    __slots__ = ("answered", "concurrency", "errors", "group", "in_flight", "requests", "seconds", "worker")

    def __init__(self, worker: str = "") -> None:
        self.worker = worker
        # Requests forwarded to it and not yet ended, against its group's ``concurrency``: at or over it the worker
        # is saturated (``ForwardCounters.saturated``) and the group's next requests wait in the front's queue.
        # The front sets ``concurrency`` and ``group`` ("tenant/app/group") when it first forwards to the worker;
        # until then nothing saturates it.
        self.in_flight = 0
        self.concurrency = 1 << 30
        self.group = ""
        self.requests = 0
        self.errors = 0
        self.seconds = 0.0
        # Answers that came from the worker itself (complete, or a 101): the pool's evidence of progress. The
        # front's own 502/504/499 are in requests, never here: a hung worker's timeouts are not its progress.
        self.answered = 0

    def snapshot(self) -> dict[str, float]:
        return {"requests": self.requests, "errors": self.errors, "seconds": self.seconds}

    def __repr__(self) -> str:
        return f"WorkerCounters(requests={self.requests}, errors={self.errors}, seconds={self.seconds:.6f})"


def bucket(seconds: float) -> int:
    """The histogram bucket of a latency: the first bound it does not exceed (``bisect_left``, as a loop: most
    requests take under the first bound, and compiled (setup.py) the loop is a few C comparisons where the
    call to bisect is a Python call)."""
    i, bounds = 0, len(BOUNDS)
    while i < bounds and seconds > BOUNDS[i]:
        i += 1
    return i


class RouteStats:
    """Answers of one (tenant, app): count per status code; latency of the forwarded ones as a histogram
    (per-bucket counts, not cumulative: cumulated when exposed)."""

    __slots__ = ("buckets", "codes", "count", "defaults", "sum")

    def __init__(self) -> None:
        self.codes: dict[int, int] = {}
        # group → new users routed to it as the default (the "default" reason of ForwardCounters.routing, kept here
        # because it is counted for every cookieless request: a dict keyed by a string, no tuple made)
        self.defaults: dict[str, int] = {}
        self.buckets = [0] * (len(BOUNDS) + 1)
        self.count = 0
        self.sum = 0.0

    def answered(self, code: int) -> None:
        self.codes[code] = self.codes.get(code, 0) + 1

    def observe(self, seconds: float) -> None:
        self.buckets[bucket(seconds)] += 1
        self.count += 1
        self.sum += seconds


class QueueStats:
    """One group's queue (core/parking.py's WAKE and QUEUE): how long each request waited there (a histogram,
    per-bucket counts as ``RouteStats``'), and the requests answered 503 from it, by reason."""

    __slots__ = ("buckets", "count", "refused", "sum")

    def __init__(self) -> None:
        self.buckets = [0] * (len(BOUNDS) + 1)
        self.count = 0
        self.sum = 0.0
        self.refused: dict[str, int] = {}

    def waited(self, seconds: float) -> None:
        self.buckets[bucket(seconds)] += 1
        self.count += 1
        self.sum += seconds

    def refuse(self, reason: str) -> None:
        self.refused[reason] = self.refused.get(reason, 0) + 1


# Why a request was answered 503 from its group's queue (``elasticd_queue_refusals_total{reason}``).
QUEUE_FULL: Final = "full"  # queue.max requests waited already
QUEUE_TIMEOUT: Final = "timeout"  # it waited queue.timeout for a slot
QUEUE_NO_WORKER: Final = "no_worker"  # no worker came up for it (a failed start, or none within request_timeout)


class ForwardCounters:
    __slots__ = ("_next_id", "on_free", "open", "queues", "rejections", "routes", "routing", "saturated",
                 "upstream_refusals", "workers")

    def __init__(self) -> None:
        self.workers: dict[str, WorkerCounters] = {}
        # The workers with as many requests in flight as their concurrency: dispatch queues the requests they would
        # take (empty in the common case, so a request pays one truthiness test for it).
        self.saturated: set[str] = set()
        # Told when a saturated worker has room again; it says whether the worker leaves ``saturated`` now (True)
        # or stays in it until the front's queue has given the room to a request that waited (False). None: at
        # once.
        self.on_free: Callable[[WorkerCounters], bool] | None = None
        self.open: dict[int, OpenRequest] = {}
        self.routes: dict[tuple[str, str], RouteStats] = {}
        self.rejections: dict[tuple[str, str], int] = {}  # (tenant, reason) → count
        # (tenant, app, group, reason) → count: each new user's group and why, and each request of a user kept
        # on a group new users no longer go to (groups.py's reasons)
        self.routing: dict[tuple[str, str, str, str], int] = {}
        # (tenant, app, reason) → count: answers of its workers refused past a bound, and requests refused because
        # too many waited for a worker's connections (``bounds``' reasons)
        self.upstream_refusals: dict[tuple[str, str, str], int] = {}
        self.queues: dict[str, QueueStats] = {}  # "tenant/app/group" → its queue's waits and refusals
        self._next_id = 0

    # ------------------------------------------------------------------ the forward path

    def worker(self, worker_id: str) -> WorkerCounters:
        counters = self.workers.get(worker_id)
        if counters is None:
            counters = self.workers[worker_id] = WorkerCounters(worker_id)
        return counters

    def forwarded(self, counters: WorkerCounters) -> None:
        """One more request in flight on the worker (Exchange.forward inlines this)."""
        counters.in_flight += 1
        if counters.in_flight >= counters.concurrency:
            self.saturated.add(counters.worker)

    def ended(self, counters: WorkerCounters) -> None:
        """One request fewer in flight on the worker (``closed`` inlines this)."""
        counters.in_flight -= 1
        if self.saturated and counters.in_flight < counters.concurrency and counters.worker in self.saturated:
            self.has_room(counters)

    def bound(self, counters: WorkerCounters, concurrency: int) -> None:
        """The worker's group's concurrency (a reload may change it): it saturates, or has room, at the new one."""
        if counters.concurrency == concurrency:
            return
        counters.concurrency = concurrency
        if counters.in_flight >= concurrency:
            self.saturated.add(counters.worker)
        elif counters.worker in self.saturated:
            self.has_room(counters)

    def has_room(self, counters: WorkerCounters) -> None:
        """A saturated worker has room (a request ended, its concurrency was raised): out of ``saturated``, unless
        the front keeps it there for a request its queue will give the room to."""
        on_free = self.on_free
        if on_free is None or on_free(counters):
            self.saturated.discard(counters.worker)

    def queue(self, key: str) -> QueueStats:
        stats = self.queues.get(key)
        if stats is None:
            stats = self.queues[key] = QueueStats()
        return stats

    def route(self, tenant: str, app: str) -> RouteStats:
        stats = self.routes.get((tenant, app))
        if stats is None:
            stats = self.routes[(tenant, app)] = RouteStats()
        return stats

    def opened(self, request: OpenRequest) -> int:
        """Register a request being forwarded; the id to close it with."""
        self._next_id += 1
        self.open[self._next_id] = request
        return self._next_id

    def closed(self, request_id: int, status: int, seconds: float, counters: WorkerCounters,
               stats: RouteStats) -> None:
        """A forwarded request ended: answered with ``status`` (the front's own 502/504, or 499 when the
        client left first) after ``seconds``."""
        open_ = self.open
        if request_id in open_:  # (not .pop(request_id, None): mypyc calls that by name, these two it does not)
            del open_[request_id]
        counters.in_flight -= 1  # ended(), inlined
        if self.saturated and counters.in_flight < counters.concurrency and counters.worker in self.saturated:
            self.has_room(counters)
        counters.requests += 1
        counters.seconds += seconds
        if status >= 500:
            counters.errors += 1
        codes = stats.codes  # RouteStats.answered and .observe, inlined: this runs once per request
        codes[status] = codes.get(status, 0) + 1
        stats.buckets[bucket(seconds)] += 1
        stats.count += 1
        stats.sum += seconds

    def routing_counts(self) -> dict[tuple[str, str, str, str], int]:
        """(tenant, app, group, reason) → count: the routing table's and the routes' default counts together."""
        counts = dict(self.routing)
        for (tenant, app), stats in list(self.routes.items()):
            for group, count in list(stats.defaults.items()):
                key = (tenant, app, group, "default")
                counts[key] = counts.get(key, 0) + count
        return counts

    def routed(self, tenant: str, app: str, group: str, reason: str) -> None:
        key = (tenant, app, group, reason)
        self.routing[key] = self.routing.get(key, 0) + 1

    def refused(self, tenant: str, reason: str) -> None:
        key = (tenant, reason)
        self.rejections[key] = self.rejections.get(key, 0) + 1

    def upstream_refused(self, tenant: str, app: str, reason: str) -> None:
        """A worker of (tenant, app) passed one of the front's bounds (``reason``: ``bounds``' constants)."""
        key = (tenant, app, reason)
        self.upstream_refusals[key] = self.upstream_refusals.get(key, 0) + 1

    # ------------------------------------------------------------------ housekeeping and reading

    def sweep(self, horizon: float) -> list[OpenRequest]:
        """Drop open entries older than ``horizon`` that are no longer live: only a bug could leave one (every
        request closes its own entry however it ends), and a visible, then swept, stale entry is the point of
        using a dict. A request still relaying (a long download) is live whatever its age. Returns the dropped
        requests (the front gives back what else they held)."""
        stale = [(rid, request) for rid, request in list(self.open.items())
                 if request.ts < horizon and not request.live]
        for rid, _ in stale:
            self.open.pop(rid, None)
        return [request for _, request in stale]

    def open_of(self, user: str) -> list[OpenRequest]:
        """A user's requests in flight (a live move quiesces on this being empty)."""
        return [r for r in list(self.open.values()) if r.user == user]

    def open_by_worker(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for request in list(self.open.values()):
            if request.worker is not None:
                counts[request.worker] = counts.get(request.worker, 0) + 1
        return counts

    def oldest_open_by_worker(self) -> dict[str, float]:
        """Per worker, when the oldest request still waiting for the start of its answer was sent: the liveness
        rule of sensor-less workers (a stream, a long-poll or a download under way is an answer, not silence)."""
        oldest: dict[str, float] = {}
        for request in list(self.open.values()):
            worker = request.worker
            if worker is not None and not request.started and request.ts < oldest.get(worker, float("inf")):
                oldest[worker] = request.ts
        return oldest

    def forget_worker(self, worker_id: str) -> None:
        self.workers.pop(worker_id, None)
        self.saturated.discard(worker_id)

    def retain_routes(self, routed: Callable[[str, str], bool]) -> None:
        """After a reload: drop the stats of apps no longer routed (``routed(tenant, app)`` says no; their series
        end)."""
        for key in [k for k in self.routes if not routed(*k)]:
            del self.routes[key]
        for routing in [k for k in self.routing if not routed(k[0], k[1])]:
            del self.routing[routing]
        for queue in [k for k in self.queues if not routed(*k.split("/", 2)[:2])]:
            del self.queues[queue]
        for refusal in [k for k in self.upstream_refusals if not routed(k[0], k[1])]:
            del self.upstream_refusals[refusal]

    def retain_tenants(self, tenants: set[str]) -> None:
        for key in [k for k in self.rejections if k[0] not in tenants]:
            del self.rejections[key]

    def iter_routes(self) -> Iterator[tuple[tuple[str, str], RouteStats]]:
        return iter(list(self.routes.items()))
