"""Per-user state a live move carries (seed 000, "Moving a live user"): the worker library's side.

    from elasticd.worker import setup, user_state
    async def counter(request):
        state = user_state(request)          # this user's own dict, in this worker
        state["count"] = state.get("count", 0) + 1

When elasticd moves the user to another worker of the group, the dict goes with it: pickled here (a move
stays within one group, so one runtime and one code version), installed there, and forgotten here once the
user is the other worker's. State an app keeps elsewhere (a cache, an open document) joins the package through
two hooks, ``on_move(app, snapshot=..., install=...)``: ``snapshot(user) -> object`` (picklable) and
``install(user, obj)``.

The package is built and installed in the library's move thread (not the app's event loop, and not the
report thread), while no request of that user runs: elasticd holds the user's new requests and waits until
its open ones have ended before it asks. So a user's dict is not touched by the app meanwhile; the hooks must
only take the same care for what they read and write.
"""

from __future__ import annotations

import pickle
import threading
from collections.abc import Callable
from typing import Any

__all__ = ["UserStates"]


class UserStates:
    __slots__ = ("_install", "_lock", "_snapshot", "_states")

    def __init__(self) -> None:
        self._states: dict[str, dict[str, Any]] = {}
        self._lock = threading.Lock()  # the move thread and the app's loop both reach the table
        self._snapshot: Callable[[str], Any] | None = None
        self._install: Callable[[str, Any], None] | None = None

    def __len__(self) -> int:
        return len(self._states)

    def hooks(self, snapshot: Callable[[str], Any] | None, install: Callable[[str, Any], None] | None) -> None:
        if (snapshot is None) != (install is None):
            raise ValueError("on_move needs both hooks, snapshot and install, or neither")
        self._snapshot, self._install = snapshot, install

    def of(self, user: str) -> dict[str, Any]:
        """``user``'s dict, made empty on first use."""
        with self._lock:
            state = self._states.get(user)
            if state is None:
                state = self._states[user] = {}
            return state

    def snapshot(self, user: str) -> bytes:
        """The user's package: its dict and what the app's snapshot hook gives (pickled; kept here until
        ``forget``: a move that aborts leaves the user here with its state)."""
        with self._lock:
            state = dict(self._states.get(user, {}))
        extra = self._snapshot(user) if self._snapshot is not None else None
        return pickle.dumps({"state": state, "extra": extra}, protocol=pickle.HIGHEST_PROTOCOL)

    def install(self, user: str, package: bytes) -> None:
        """Install a package another worker of the group built (replacing what this one had for the user)."""
        content = pickle.loads(package)
        if not isinstance(content, dict) or not isinstance(content.get("state"), dict):
            raise ValueError("not a package of elasticd.worker's")
        if self._install is not None:
            self._install(user, content.get("extra"))
        with self._lock:
            self._states[user] = content["state"]

    def forget(self, user: str) -> None:
        """The user is another worker's now."""
        with self._lock:
            self._states.pop(user, None)
