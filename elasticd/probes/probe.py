"""A capacity probe's lifecycle (seed 001, ``Langertha::Skeid::CapacityProbe``): a timer, never the request path.

A probe describes one worker or node. ``start`` polls once at once (the first request must not wait an interval
for a reading) and then every ``poll_interval``: the block's ``interval`` times the number of probes polling the
same source, so what the operator configured is the rate the *source* sees (four nodes behind one registry do
not poll it four times as often). One poll is in flight at a time: a tick that finds one outstanding is skipped,
so a slow source is not buried under a queue of polls.

Two rules are not negotiable. A probe reports nothing rather than something old: a failing poll ``forget``s its
own reading (admission falls back to the open-request count, merely imprecise, where a stale reading is
confidently wrong). And ``stop`` drops the reading; an answer that arrives after ``stop`` — an HTTP request
still in flight at a reload — writes nothing, because the node may be gone or a new probe may describe it.

A subclass implements ``poll`` (a coroutine: it must not block the loop) and reports through ``report`` or
``forget``. It may set ``source`` (the name its readings are kept under); a probe with none (a custom one that
picks no name) forgets whatever reading its node has.
"""

from __future__ import annotations

import asyncio
import logging
import math
import socket
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Final, Protocol

import aiohttp
import aiohttp.abc
import aiohttp.resolver

from elasticd.background import watch
from elasticd.config.model import Capacity
from elasticd.listener_guard.own import OWN_LISTENERS
from elasticd.probes.reading import Reading

__all__ = ["CONNECT_TIMEOUT", "READ_TIMEOUT", "Probe", "ProbeSink", "ProbeTarget"]

log = logging.getLogger("elasticd.probes")

CONNECT_TIMEOUT: Final = 2.0  # seconds to connect to the source
READ_TIMEOUT: Final = 3.0  # seconds for its whole answer, once connected
MAX_BODY: Final = 4 << 20  # bytes: a metrics page over this is refused (a tenant's worker answers it: never trusted)
OK: Final = "ok"
FAILED: Final = "failed"  # a custom probe's own poll raised


@dataclass(frozen=True, slots=True)
class ProbeTarget:
    """What a probe describes: a worker (``socket``: its Unix socket; its metrics are read there) or a node
    (``url``: its base URL). ``limit``: the most it takes when the source does not say (the group's
    concurrency, or the block's ``limit``)."""

    node: str  # the worker's or node's id (the readings' key, the metrics' node label)
    tenant: str
    app: str
    group: str
    limit: int
    socket: str | None = None
    url: str | None = None


class ProbeSink(Protocol):
    """Where readings go (``state.CapacityState``)."""

    def set(self, node: str, reading: Reading) -> None: ...

    def forget(self, node: str, source: str | None) -> None: ...

    def failed(self, node: str, reason: str) -> None: ...


class Probe:
    source: ClassVar[str | None] = None

    def __init__(self, target: ProbeTarget, config: Capacity, sink: ProbeSink, *, sharing: int = 1,
                 clock: Callable[[], float] = time.time) -> None:
        self.target = target
        self.config = config  # the node's capacity block (``config.block``: verbatim)
        self.sink = sink
        self.sharing = max(1, sharing)
        self.clock = clock
        self.is_stopped = False
        self.state = "new"  # "ok", or why the last poll failed (logged on change only)
        self.polls = 0
        self.skipped = 0  # ticks that found a poll still in flight
        self._started = False
        self._timer: asyncio.TimerHandle | None = None
        self._polling: asyncio.Task[None] | None = None
        self._session: aiohttp.ClientSession | None = None
        self._closing: asyncio.Task[None] | None = None  # the session's close, which stop starts

    @property
    def closed(self) -> bool:
        """Stopped, and its HTTP session closed (or it never opened one)."""
        return self.is_stopped and self._session is None and (self._closing is None or self._closing.done())

    @property
    def node(self) -> str:
        return self.target.node

    @property
    def poll_interval(self) -> float:
        """How often this probe polls: the block's interval times the probes sharing its source."""
        return self.config.interval * self.sharing

    def start(self) -> None:
        """Poll now, then on the timer. Safe to call twice (and a no-op once stopped)."""
        if self._started or self.is_stopped:
            return
        self._started = True
        max_age = self.config.max_age
        if max_age > 0 and self.poll_interval >= max_age:
            log.warning("capacity probe of %s: it polls every %gs, not within its max_age (%gs): its reading "
                        "expires between polls, and admission falls back to open requests meanwhile",
                        self.node, self.poll_interval, max_age)
        self._poll_now()
        self._schedule()

    def stop(self) -> None:
        """Stop polling and drop the reading: admission goes back to the open-request count rather than acting on
        what this probe last said. A poll in flight finishes unheard."""
        if self.is_stopped:
            return
        self.is_stopped = True
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._forget_own()
        session, self._session = self._session, None
        if session is not None:
            polling = self._polling
            # The session closes once the poll in flight ends (closing it now would cut that poll short: its
            # answer must still arrive, to be ignored).
            self._closing = watch(asyncio.get_running_loop().create_task(_close_after(session, polling)), log,
                                  f"closing the capacity probe of {self.node}")

    async def aclose(self) -> None:
        """Stop, and wait for the poll in flight and the HTTP session (the daemon's shutdown)."""
        self.stop()
        polling = self._polling
        if polling is not None and not polling.done():
            polling.cancel()
            await asyncio.gather(polling, return_exceptions=True)
        if self._closing is not None:
            await asyncio.gather(self._closing, return_exceptions=True)

    # ------------------------------------------------------------------ what a subclass implements and calls

    async def poll(self) -> None:
        raise NotImplementedError

    def report(self, used: float, limit: float, *, at: float | None = None, expires_at: float | None = None) -> bool:
        """The source's answer: ``used`` of ``limit``. False (and nothing written) once stopped, or when the numbers
        are no reading (not finite, negative: 1e308 twice sums to inf, and inf is no JSON the registry can sign)."""
        if self.is_stopped:
            return False
        numbers = (used, limit, *(() if at is None else (at,)), *(() if expires_at is None else (expires_at,)))
        if not all(isinstance(n, (int, float)) and not isinstance(n, bool) and math.isfinite(n) for n in numbers) \
                or used < 0 or limit < 0:
            self.forget("malformed", f"used {used!r} of limit {limit!r} is no reading")
            return False
        reading = Reading(self.source or "custom", float(used), float(limit), self.clock() if at is None else at,
                          expires_at)
        try:
            self.sink.set(self.node, reading)
        except Exception:  # what the reading changes (the front's admission, the pool) failed: said, not a poll's
            log.exception("capacity of %s: carrying out its reading failed", self.node)
            return False
        self._state(OK, f"{used:g} of {limit:g}")
        return True

    def forget(self, state: str, detail: str = "") -> bool:
        """The poll failed (``state``: why, e.g. "unreachable"): its reading is dropped. False once stopped."""
        if self.is_stopped:
            return False
        self._forget_own()
        try:
            self.sink.failed(self.node, state.replace(" ", "-"))  # (elasticd_capacity_probe_failures_total)
        except Exception:
            log.exception("capacity of %s: counting its failure failed", self.node)
        self._state(state, detail)
        return True

    def _forget_own(self) -> None:
        """Only this probe's own source (a custom one with none writes under "custom"): a back-off recorded from a
        429 outlives a probe that went blind."""
        try:
            self.sink.forget(self.node, self.source or "custom")
        except Exception:
            log.exception("capacity of %s: carrying out the end of its reading failed", self.node)

    async def fetch(self, url: str, headers: Mapping[str, str] | None = None) -> tuple[int, bytes, Mapping[str, str]]:
        """GET ``url`` (on the worker's own socket when the target has one: the URL's host is then only the Host
        header), with the probe's timeouts: connect 2 s, then the whole answer within 3 s more (5 s in all, however
        its bytes trickle), and at most ``MAX_BODY`` bytes, never decompressed (a source that trickles or floods is
        refused, not waited for: it is a tenant's process, and the daemon serves every tenant)."""
        if self.is_stopped:
            raise _Stopped  # (a custom poll that awaited something first: no session opened after stop)
        if self._session is None:
            connector = (aiohttp.UnixConnector(path=self.target.socket) if self.target.socket is not None
                         else aiohttp.TCPConnector(limit=1, force_close=False, resolver=_NotOwnListeners()))
            timeout = aiohttp.ClientTimeout(total=CONNECT_TIMEOUT + READ_TIMEOUT, connect=CONNECT_TIMEOUT,
                                            sock_connect=CONNECT_TIMEOUT, sock_read=READ_TIMEOUT)
            self._session = aiohttp.ClientSession(connector=connector, timeout=timeout, auto_decompress=False)
        sent = {"Accept-Encoding": "identity", **(headers or {})}
        async with self._session.get(url, headers=sent, allow_redirects=False) as response:
            body = bytearray()
            while chunk := await response.content.read(65536):
                body += chunk
                if len(body) > MAX_BODY:
                    raise _TooBig(f"the answer of {url} is over {MAX_BODY >> 20} MiB")
            return response.status, bytes(body), response.headers

    # ------------------------------------------------------------------ the timer

    def _schedule(self) -> None:
        self._timer = asyncio.get_running_loop().call_later(self.poll_interval, self._tick)

    def _tick(self) -> None:
        self._timer = None
        if self.is_stopped:
            return
        self._poll_now()
        self._schedule()

    def _poll_now(self) -> None:
        if self._polling is not None and not self._polling.done():
            self.skipped += 1  # one poll in flight at a time
            return
        self.polls += 1
        self._polling = watch(asyncio.get_running_loop().create_task(self._run_poll()), log,
                              f"the capacity probe of {self.node}")

    async def _run_poll(self) -> None:
        if self.is_stopped:
            return  # stopped before this poll began (start then stop in one go): no request, no session to leak
        try:
            await self.poll()
        except asyncio.CancelledError:
            raise
        except _Stopped:
            return
        except _TooBig as exc:
            self.forget("too big", str(exc))
        except (TimeoutError, aiohttp.ClientError, OSError) as exc:
            self.forget("unreachable", _why(exc))
        except Exception as exc:  # a custom probe's bug: said (once per change), and its reading forgotten
            if not self.is_stopped and self.state != FAILED:
                log.exception("capacity probe of %s: its poll failed", self.node)
            self.forget(FAILED, _why(exc))

    def _state(self, state: str, detail: str) -> None:
        if state == self.state:
            return
        before, self.state = self.state, state
        if state == OK:
            log.info("capacity probe of %s: reading (%s)%s", self.node, detail,
                     f", after {before}" if before != "new" else "")
        else:
            log.warning("capacity probe of %s: %s%s: its reading is forgotten (admission counts open requests)",
                        self.node, state, f" ({detail})" if detail else "")

    def describe(self) -> dict[str, Any]:
        return {"kind": self.config.probe, "state": self.state, "interval": self.poll_interval,
                "polls": self.polls, "skipped": self.skipped}


class _Stopped(Exception):
    """``fetch`` after ``stop``."""


class _TooBig(Exception):
    """An answer over ``MAX_BODY``."""


class _NotOwnListeners(aiohttp.abc.AbstractResolver):
    """aiohttp's resolver, without the addresses that are elasticd's own listeners: a probe URL whose name resolves
    here (a tenant's DNS record) is not elasticd asking itself, as root, for the tenant. (A literal address is not
    resolved by aiohttp: one of elasticd's own is refused at load, config/checks.py.)"""

    def __init__(self) -> None:
        self._inner = aiohttp.resolver.DefaultResolver()

    async def resolve(self, host: str, port: int = 0, family: Any = socket.AF_INET) -> Any:
        found = await self._inner.resolve(host, port, family)
        kept = [entry for entry in found if not OWN_LISTENERS.reached((entry["host"], entry["port"]))]
        if found and not kept:
            raise OSError(f"{host}:{port} resolves to elasticd's own listener: not a probe's source")
        return kept

    async def close(self) -> None:
        await self._inner.close()


async def _close_after(session: aiohttp.ClientSession, polling: asyncio.Task[None] | None) -> None:
    if polling is not None and not polling.done():
        await asyncio.gather(polling, return_exceptions=True)
    await session.close()


def _why(exc: BaseException) -> str:
    text = str(exc)
    if isinstance(exc, asyncio.TimeoutError) or not text:
        return type(exc).__name__ if not isinstance(exc, asyncio.TimeoutError) else "timed out"
    return text
