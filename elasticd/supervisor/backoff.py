"""When to restart a worker that exited: exponential backoff, and a verdict of "failed" for a crash loop.

Pure and clock-free: the caller passes ``now`` and when the worker started, so a table test covers every
case. Rules: the delay starts at 1 s and doubles up to 60 s; a worker that stayed up 60 s was healthy and
its next delay starts again at 1 s; five deaths within 60 s mark it failed (reported, not restarted in a loop).
"""

from __future__ import annotations

from collections import deque

__all__ = ["RestartPolicy"]


class RestartPolicy:
    __slots__ = ("_deaths", "_given_up", "_next_delay", "base", "cap", "healthy_after", "max_deaths", "window")

    def __init__(self, *, base: float = 1.0, cap: float = 60.0, healthy_after: float = 60.0,
                 max_deaths: int = 5, window: float = 60.0) -> None:
        self.base = base
        self.cap = cap
        self.healthy_after = healthy_after
        self.max_deaths = max_deaths
        self.window = window
        self._next_delay = base
        self._deaths: deque[float] = deque()
        self._given_up = False

    def on_exit(self, now: float, started_at: float) -> float | None:
        """The delay before the next start, or None when the worker is to be marked failed."""
        if self._given_up:
            return None
        if now - started_at >= self.healthy_after:
            self._next_delay = self.base
        self._deaths.append(now)
        while self._deaths and now - self._deaths[0] > self.window:
            self._deaths.popleft()
        if len(self._deaths) >= self.max_deaths:
            return None
        delay = self._next_delay
        self._next_delay = min(self.cap, delay * 2)
        return delay

    @property
    def given_up(self) -> bool:
        return self._given_up

    def give_up(self) -> None:
        """The worker cannot start until something outside it changes (its command is not runnable): failed at
        once, not after a crash loop."""
        self._given_up = True

    def reset(self) -> None:
        """Forget the history (an operator's reload gives a failed worker a fresh start)."""
        self._next_delay = self.base
        self._deaths.clear()
        self._given_up = False
