"""The population's fan-out: one ``monitor`` request to each worker that runs the library, all at once, over
the channel — never over the front's connections to the workers (monitor traffic never mixes with the
forward path: a page refresh must not take a connection a user's request waits for, nor wait behind one).

Each request has its own timeout (``MONITOR_TIMEOUT``): a worker that is stopped, wedged or gone by then is an
error row of the population (``unreachable``), and the others' answers are used as they came.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Sequence
from typing import Any, Protocol

from elasticd.monitor.population import RegisterError, WorkerAnswer, parse_register

__all__ = ["MAX_REGISTER", "MONITOR_TIMEOUT", "Asker", "ask_all"]

log = logging.getLogger("elasticd.monitor")

MONITOR_TIMEOUT = 1.0  # seconds a worker has to answer: the page refreshes every few seconds
# The most bytes a worker's register may have: about 30,000 users of ~130 bytes each. A tenant's worker answers
# it, and elasticd holds it in memory and parses it: a bigger one closes the worker's channel and its row reads
# "unreachable".
MAX_REGISTER = 4 << 20


class Asker(Protocol):
    """The channel, as the census uses it (``pool.channel.ChannelServer``)."""

    def capabilities(self, worker_id: str) -> frozenset[str]: ...

    async def request(self, worker_id: str, message: dict[str, Any], timeout: float,
                      payload: bytes | None = None, *, answer_limit: int = ...,
                      ) -> tuple[dict[str, Any], bytes | None]: ...


async def ask_all(channel: Asker, workers: Sequence[tuple[str, str]],
                  timeout: float = MONITOR_TIMEOUT) -> list[WorkerAnswer]:
    """Ask each (worker, group) that announced the ``monitor`` capability for its register; the others are
    answers with ``asked`` False (their rows come from the surface alone). In the order given."""
    return list(await asyncio.gather(*(_ask(channel, worker, group, timeout) for worker, group in workers)))


async def _ask(channel: Asker, worker: str, group: str, timeout: float) -> WorkerAnswer:
    if "monitor" not in channel.capabilities(worker):
        return WorkerAnswer(worker, group, asked=False)
    try:
        answer, payload = await channel.request(worker, {"type": "monitor"}, timeout, answer_limit=MAX_REGISTER)
    except Exception as exc:  # TimeoutError, ChannelError (no connection, closed meanwhile), a send that failed
        log.debug("monitor: %s did not answer: %s", worker, exc)
        return WorkerAnswer(worker, group, error="unreachable")
    if answer.get("type") != "register":
        return WorkerAnswer(worker, group, error=f"refused: {str(answer.get('reason', answer.get('type')))[:200]}")
    try:
        if payload is None:
            raise RegisterError("the users must follow the answer as its payload")
        users = json.loads(payload)
        return WorkerAnswer(worker, group, register=parse_register(users))
    except (RegisterError, ValueError, RecursionError) as exc:  # (a worker's bytes: anything but a crash here)
        log.warning("monitor: %s sent a register elasticd cannot read: %s", worker, exc)
        return WorkerAnswer(worker, group, error=f"bad register: {str(exc)[:200]}")
