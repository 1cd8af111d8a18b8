"""What the front knows of its workers' health: the ones it found dead (``unroutable``, each probed until its socket
accepts again), the ones whose own capacity reading says they are full (``full``, written by the probes' shell), and
the warnings about what a worker did wrong, said once a minute per worker and kind (``RefusalLog``).

The front finds a worker dead on the request path (a refused connect, a connection lost before the answer) and no
supervisor event says when it is back, so the probe here does: the worker is routable again once its socket accepts,
and the requests waiting for its group go (``on_alive``). The supervisor's own verdicts (a worker exited, restarted)
come through ``clear``. Dispatch reads ``unroutable`` and ``full`` at every request, so the request path holds them
directly: they are changed in place, never replaced.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from functools import partial

from elasticd.background import watch
from elasticd.front import serving
from elasticd.front.core.counters import ForwardCounters
from elasticd.front.worker_links import WorkerLinks
from elasticd.refusal_log import RefusalLog

__all__ = ["WorkerHealth"]

log = logging.getLogger("elasticd.front")


class WorkerHealth:
    __slots__ = ("_probes", "clock", "forwards", "full", "on_alive", "said", "unroutable", "worker_links")

    def __init__(self, worker_links: WorkerLinks, forwards: ForwardCounters, clock: Callable[[], float]) -> None:
        self.worker_links = worker_links
        self.forwards = forwards
        self.clock = clock
        self.unroutable: set[str] = set()  # workers found dead, until their socket accepts again
        # Admission by capacity readings (probes/): the workers and nodes whose own reading says they are full,
        # by id → (until, Retry-After, how long a request may wait for room). Written by the probes' shell only.
        self.full: dict[str, tuple[float, int, float]] = {}
        # What a worker did wrong, said once a minute per worker and kind: a hostile worker failing every request
        # would otherwise make each one a line of elasticd's log (the counters count every one).
        self.said = RefusalLog()
        self._probes: dict[str, asyncio.Task[None]] = {}
        # A worker found dead accepts again: its group's waiting requests go (the waiting part's ``woke``, given by
        # the front: that part is made after this one).
        self.on_alive: Callable[[tuple[str, str, str]], int] | None = None

    def worker_failed(self, worker_id: str | None, path: str) -> None:
        """Refused, vanished or dropped a request unanswered (on its socket ``path``): unroutable until that
        socket accepts again."""
        if worker_id is None or worker_id in self.unroutable:
            return
        pool = self.worker_links.pools.get(worker_id)
        if pool is not None and pool.path != path:
            return  # an old socket's connection failed; the worker's current one is another pool's business
        self.unroutable.add(worker_id)
        self.worker_links.drop_pool(worker_id)
        probing = serving.probe(path, partial(self._accepting, worker_id))
        self._probes[worker_id] = watch(asyncio.get_running_loop().create_task(probing), log,
                                        f"probing worker {worker_id}'s socket")

    def _accepting(self, worker_id: str) -> None:
        self.unroutable.discard(worker_id)
        self._probes.pop(worker_id, None)
        log.info("worker %s accepts connections again: routable", worker_id)
        counters = self.forwards.workers.get(worker_id)
        if counters is not None and counters.group and self.on_alive is not None:
            # (requests that waited for it, or for any worker of its group)
            tenant, app, group = counters.group.split("/")
            self.on_alive((tenant, app, group))

    def clear(self, worker_id: str) -> None:
        """The worker is gone (the supervisor saw it exit): whether it was found dead is forgotten, its probe
        stopped (a restarted worker is the supervisor's to call routable again)."""
        self.unroutable.discard(worker_id)
        probe = self._probes.pop(worker_id, None)
        if probe is not None:
            probe.cancel()

    def stop(self) -> None:
        for task in list(self._probes.values()):
            task.cancel()

    def tell_of_worker(self, worker: str | None, kind: str, message: str, *args: object) -> None:
        """A warning about what ``worker`` did, said when it was not said for that worker and kind within the
        last minute (``RefusalLog``), with the count of those left unsaid since."""
        saying = self.said.note(worker or "", kind, self.clock())
        if saying is None:
            return
        if saying.unsaid:
            message += f" ({saying.unsaid} more of worker {worker} not logged since, the last: {saying.previous})"
        log.warning(message, *args)
