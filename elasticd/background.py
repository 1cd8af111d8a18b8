"""Tasks a part of the daemon starts and does not await at once (reloads, retires, replacements, removals):
kept so that a stop can cancel them, and each one's failure logged — a background task that dies silently is
a decision that was never carried out."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine
from typing import Any

__all__ = ["Background", "watch"]


def watch(task: asyncio.Task[Any], log: logging.Logger, purpose: str) -> asyncio.Task[Any]:
    """Log ``task``'s failure, naming what it was for, as soon as it ends (a task nobody awaits would
    otherwise fail silently, or with asyncio's "exception was never retrieved" at garbage collection and no
    word of what it did). Cancellation is no failure. Returns the task."""
    def done(finished: asyncio.Task[Any]) -> None:
        if not finished.cancelled() and finished.exception() is not None:
            log.error("%s failed", purpose, exc_info=finished.exception())
    task.add_done_callback(done)
    return task


class Background:
    __slots__ = ("_log", "_tasks", "_what")

    def __init__(self, log: logging.Logger, what: str) -> None:
        self._log = log
        self._what = what  # for the log line: "a retire or replacement", "retiring workers", ...
        self._tasks: set[asyncio.Task[Any]] = set()

    def __len__(self) -> int:
        return len(self._tasks)

    def spawn(self, coroutine: Coroutine[Any, Any, Any], name: str | None = None) -> asyncio.Task[Any]:
        task = asyncio.get_running_loop().create_task(coroutine, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return watch(task, self._log, self._what)

    def cancel(self) -> None:
        for task in list(self._tasks):
            task.cancel()

    async def settle(self) -> None:
        """Cancel every task and wait for them to end (their own cleanup included)."""
        self.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
