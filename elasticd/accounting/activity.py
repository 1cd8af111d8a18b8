"""Which apps ``/metrics`` shows per-app series for (pure: time passed in).

A hosting host of 10,000 apps, most of them scaled to zero, exported about 4 KB of series per app at every scrape,
nearly all of them zeros of apps that had not run: 40 MB a scrape at that scale. So an app's own series
(``elasticd_app_*``, its groups' queue and worker gauges) are shown while it is active and for ``window`` after
(``server.metrics.window``, 15 min by default); tenant series always are, and so is every counter once it has
counted (a request, a refusal, a move: those appear at their first event and stay). ``server.metrics.app_series:
all`` shows every app's, as before.

An app is active while the sampler finds its cgroup populated or elasticd holds a worker there (the sampler notes
it on every such read), so a burst of traffic to an idle app shows its series from the tick its first worker
starts. What a series appearing at its first event hides, ``increase()`` over the step it appeared in, is seen in
the tenant's series, always there: alert on ``elasticd_tenant_memory_events_total{event="oom_kill"}`` and
``elasticd_quota_rejections_total{tenant}``, not on an app's.
"""

from __future__ import annotations

from collections.abc import Callable

__all__ = ["Activity"]


class Activity:
    __slots__ = ("_last", "show_all", "window")

    def __init__(self, window: float = 900.0, show_all: bool = False) -> None:
        self._last: dict[tuple[str, str], float] = {}
        self.window = window
        self.show_all = show_all

    def configure(self, window: float, show_all: bool) -> None:
        self.window = window
        self.show_all = show_all

    def note(self, tenant: str, app: str, now: float) -> None:
        self._last[(tenant, app)] = now

    def shown(self, tenant: str, app: str, now: float) -> bool:
        if self.show_all:
            return True
        last = self._last.get((tenant, app))
        return last is not None and now - last <= self.window

    def active_count(self, now: float) -> int:
        return sum(1 for last in self._last.values() if now - last <= self.window)

    def forget(self, configured: Callable[[str, str], bool]) -> None:
        """Drop the apps a reload removed (a pass over the apps ever active, not over every app configured)."""
        self._last = {key: last for key, last in self._last.items() if configured(*key)}
