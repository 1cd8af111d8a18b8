"""The shell of the listener guard: each connection to ``metrics_listen`` or ``agent_listen`` is judged
(``verdict.judge``) before any byte of it is read (``accepting.GuardedAccept`` asks, on the bare accepted socket),
and a refusal is counted (``elasticd_listener_refusals_total``) and logged once a minute per tenant and reason."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator, Mapping
from typing import Final

from prometheus_client.core import CounterMetricFamily
from prometheus_client.registry import Collector

from elasticd.listener_guard.host import host_addresses
from elasticd.listener_guard.sock_diag import SockDiag, SockDiagError
from elasticd.listener_guard.verdict import REASONS, SERVED, PeerVerdict, is_local, judge
from elasticd.refusal_log import RefusalLog

__all__ = ["ListenerGuard"]

log = logging.getLogger("elasticd.listener_guard")

_ADDRESSES_FOR: Final = 30.0  # seconds the host's own addresses are taken as known (psutil reads every interface)

_SETTINGS = {"metrics": "server.metrics_listen", "agent": "server.agent_listen"}


class ListenerGuard:
    """Judges, counts and logs. ``tenants_by_cgroup`` and ``tenants_by_uid`` are read at each connection (the
    daemon's current config and cgroup tree); ``clock`` is for the log's once-a-minute."""

    __slots__ = ("_addresses", "_addresses_at", "_clock", "_diag", "_host_addresses", "_log", "_tenants_by_cgroup",
                 "_tenants_by_uid", "refusals")

    def __init__(self, tenants_by_cgroup: Callable[[], Mapping[int, str]],
                 tenants_by_uid: Callable[[], Mapping[int, str]], *,
                 diag: SockDiag | None = None, clock: Callable[[], float] = time.monotonic,
                 addresses: Callable[[], set[str]] = host_addresses) -> None:
        self._tenants_by_cgroup = tenants_by_cgroup
        self._tenants_by_uid = tenants_by_uid
        self._diag = diag if diag is not None else SockDiag()
        self._clock = clock
        self._host_addresses = addresses
        self._addresses: set[str] = set()
        self._addresses_at: float | None = None
        self._log = RefusalLog()
        self.refusals: dict[tuple[str, str], int] = {(name, reason): 0 for name in _SETTINGS for reason in REASONS}

    def judge(self, listener: str, peer: tuple[str, int], own: tuple[str, int]) -> PeerVerdict:
        """The verdict on a connection from ``peer`` to ``own`` (the accepted socket's addresses), counted and logged
        when refused."""
        if not self.local(peer, own):
            return SERVED
        verdict, failed = self._identify(peer, own)
        if not verdict.served:
            self._refused(listener, verdict, peer, failed)
        return verdict

    def local(self, peer: tuple[str, int], own: tuple[str, int]) -> bool:
        """Whether ``peer`` is at one of this host's addresses (where every tenant's process is too)."""
        return is_local(peer[0], own[0], self._known_addresses())

    def identify(self, peer: tuple[str, int], own: tuple[str, int]) -> PeerVerdict:
        """Whose a local peer is, as ``judge`` says it, neither counted nor logged (the front's proxy trust asks)."""
        return self._identify(peer, own)[0]

    def _identify(self, peer: tuple[str, int], own: tuple[str, int]) -> tuple[PeerVerdict, Exception | None]:
        found = None
        failed = None
        try:
            found = self._diag.peer(peer[:2], own[:2])
        except (SockDiagError, ValueError) as exc:
            failed = exc
        return judge(found, failed is not None, self._tenants_by_cgroup(), self._tenants_by_uid()), failed

    def _known_addresses(self) -> set[str]:
        now = self._clock()
        if self._addresses_at is None or now - self._addresses_at >= _ADDRESSES_FOR:
            self._addresses = self._host_addresses()
            self._addresses_at = now
        return self._addresses

    def _refused(self, listener: str, verdict: PeerVerdict, peer: tuple[str, int], failed: Exception | None) -> None:
        reason = verdict.reason or "?"
        key = (listener, reason)
        self.refusals[key] = self.refusals.get(key, 0) + 1
        saying = self._log.note(verdict.who, f"{listener} {reason}", self._clock())
        if saying is None:
            return
        more = f" ({saying.unsaid} more refusals of it since its last line)" if saying.unsaid else ""
        why = {"tenant-cgroup": "its socket was made in the tenant's cgroup",
               "tenant-user": f"its socket is owned by the tenant's user (uid {verdict.uid})",
               "peer-gone": "its socket was closed before it could be looked up",
               "lookup-failed": f"the kernel could not say whose it is ({failed})"}.get(reason, reason)
        log.warning("%s refused a connection from %s at %s: %s; it answers no tenant's process%s",
                    _SETTINGS.get(listener, listener), verdict.who, peer[0], why, more)

    def collector(self) -> Collector:
        return _RefusalsCollector(self.refusals)

    def close(self) -> None:
        self._diag.close()


class _RefusalsCollector(Collector):
    __slots__ = ("_refusals",)

    def __init__(self, refusals: Mapping[tuple[str, str], int]) -> None:
        self._refusals = refusals

    def describe(self) -> list[CounterMetricFamily]:
        return []

    def collect(self) -> Iterator[CounterMetricFamily]:
        family = CounterMetricFamily(
            "elasticd_listener_refusals", "Connections to elasticd's own listeners (metrics, agent) refused because "
            "the peer is a tenant's process (or cannot be told from one).", labels=["listener", "reason"])
        for (listener, reason), count in sorted(self._refusals.items()):
            family.add_metric([listener, reason], count)
        yield family
