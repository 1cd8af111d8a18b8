"""GET /metrics on ``server.metrics_listen`` (and the monitor's routes beside it, ``monitor/page.py``): the
cgroup accounting (accounting/tenant_metrics.py), elasticd's own process metrics and build info, and whatever
collectors other parts add, in the Prometheus text format.

prometheus-client 0.16 (Debian bookworm) has no aiohttp integration: the page is the registry's text
format (generate_latest's bytes, written faster by accounting/exposition.py), served by aiohttp here.
"""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.gc_collector import GCCollector
from prometheus_client.platform_collector import PlatformCollector
from prometheus_client.process_collector import ProcessCollector
from prometheus_client.registry import Collector

from elasticd import __version__
from elasticd.accounting.exposition import expose
from elasticd.accounting.tenant_metrics import AccountingCollector, SampleSource
from elasticd.aiohttp_grace import grace
from elasticd.config.model import Address, Resources
from elasticd.heap import full_passes_held
from elasticd.listener_guard.accepting import GuardedAccept
from elasticd.listener_guard.guard import ListenerGuard
from elasticd.listeners import bind_tcp
from elasticd.loop_slices import gather_in_slices

__all__ = ["AccountingCollector", "Collector", "MetricsServer", "SampleSource"]

log = logging.getLogger("elasticd.metrics")


class _Extra(Collector):
    """Serves whatever collectors are in the list at scrape time (front, pool...)."""

    __slots__ = ("collectors",)

    def __init__(self, collectors: list[Collector]) -> None:
        self.collectors = collectors

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        for collector in list(self.collectors):
            try:
                yield from collector.collect()
            except Exception:  # one broken collector must not take /metrics down with it
                log.exception("metrics collector %r failed", collector)


class _BuildInfo(Collector):
    __slots__ = ()

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        family = GaugeMetricFamily("elasticd_build_info", "elasticd's version; always 1.", labels=["version"])
        family.add_metric([__version__], 1)
        yield family


class MetricsServer:
    """GET /metrics on ``address`` (port 0: any free port, see ``.port`` after start()).

    ``extra_collectors``: a list other parts append their collectors to (before or after start); each is
    asked at every scrape. ``registry`` holds everything served.
    """

    __slots__ = ("_accepts", "_executor", "_guard", "_routes", "_runner", "address", "extra_collectors", "port",
                 "registry")

    def __init__(self, address: Address, sampler: SampleSource,
                 limits_provider: Callable[[], Mapping[str, Resources]],
                 extra_collectors: Iterable[Collector] = (),
                 routes: Iterable[Callable[[web.Application], None]] = (),
                 shown: Callable[[str, str], bool] | None = None, guard: ListenerGuard | None = None) -> None:
        self.address = address
        self._guard = guard  # None: every peer is served (tests of the page alone)
        self._accepts: list[GuardedAccept] = []  # the guarded listeners' accept loops
        self._routes = list(routes)  # other pages on the same listener (the monitor's)
        self.port: int | None = None
        self.extra_collectors: list[Collector] = list(extra_collectors)
        # A private registry: nothing any library registers globally ends up on our page by surprise.
        self.registry = CollectorRegistry()
        self.registry.register(_BuildInfo())
        self.registry.register(AccountingCollector(sampler, limits_provider, shown))
        self.registry.register(_Extra(self.extra_collectors))
        ProcessCollector(registry=self.registry)
        PlatformCollector(registry=self.registry)
        GCCollector(registry=self.registry)
        self._runner: web.AppRunner | None = None
        self._executor: ThreadPoolExecutor | None = None

    def collect(self) -> list[Metric]:
        """Every family, collected now. On the event loop's thread: collectors read state the loop owns."""
        return list(self.registry.collect())

    def render(self) -> bytes:
        """The page: generate_latest(self.registry)'s bytes (also what tests and the benchmark time)."""
        return expose(self.collect())

    async def _metrics(self, request: web.Request) -> web.Response:
        # Collected on the loop (the collectors read what it owns) in slices between families: at 10,000 apps the
        # whole collection held the front's loop ~75 ms (loop_slices.py). Each family is made whole in one step.
        with full_passes_held():  # (the series live until the page is written: heap.py)
            families = await gather_in_slices(self.registry.collect())
            # Writing the text is most of a scrape (~45 ms for 1,000 apps on a small VM): in a thread, so the
            # event loop (the front proxy) runs meanwhile; it only reads the families collected above, which
            # nothing else holds. One thread: concurrent scrapes queue rather than pile up.
            body = await asyncio.get_running_loop().run_in_executor(self._executor, expose, families)
            del families
        # CONTENT_TYPE_LATEST carries a charset parameter, which web.Response(content_type=) refuses.
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def start(self, sockets: Sequence[socket.socket] | None = None) -> None:
        """Serve on ``sockets`` (the daemon's ``listeners.Listeners`` holds them), or on ones bound here."""
        app = web.Application()
        app.router.add_get("/metrics", self._metrics)
        for add_routes in self._routes:
            add_routes(app)
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="elasticd-metrics")
        on_runner, on_site = grace(1.0)  # a scrape in progress at a stop is not worth waiting for
        self._runner = web.AppRunner(app, access_log=None, **on_runner)
        await self._runner.setup()
        server = self._runner.server
        assert server is not None
        for sock in sockets if sockets is not None else bind_tcp(self.address.host, self.address.port, 128):
            if self._guard is not None:  # (accepted by the guard's loop: judged before aiohttp sees a byte)
                accept = GuardedAccept(sock, self._guard, "metrics", server)
                accept.start()
                self._accepts.append(accept)
            else:
                await web.SockSite(self._runner, sock, **on_site).start()
        self.port = (self._accepts[0].port if self._accepts else _bound_port(self._runner)) or self.address.port
        log.info("metrics on http://%s/metrics", Address(self.address.host, self.port))
        if self._routes:
            log.info("monitor on http://%s/monitor", Address(self.address.host, self.port))

    async def stop(self) -> None:
        for accept in self._accepts:  # (first: no new connection while the runner closes the open ones)
            accept.close()
        self._accepts = []
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        if self._executor is not None:
            self._executor.shutdown(wait=False, cancel_futures=True)
            self._executor = None


def _bound_port(runner: web.AppRunner) -> int | None:
    addresses: list[Any] = runner.addresses
    for address in addresses:
        if isinstance(address, tuple) and len(address) >= 2:
            return int(address[1])
    return None
