"""The worker library's part in a live move: elasticd's ``snapshot``, ``install`` and ``forget`` requests,
answered from a thread of their own (a big package takes a while to pickle: the report thread keeps its
rhythm, and the app's event loop is not involved at all).

    elasticd → {"type": "snapshot", "id": 7, "user": U}
        worker → {"type": "package", "id": 7, "bytes": N} + N bytes
    elasticd → {"type": "install", "id": 8, "user": U, "bytes": N} + N bytes
        worker → {"type": "installed", "id": 8}
    elasticd → {"type": "forget", "user": U}      (no answer: U is another worker's now)
    a request that cannot be done: worker → {"type": "refused", "id": …, "reason": …}
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable
from typing import Any

from elasticd.frames import MAX_PAYLOAD
from elasticd.worker.user_state import UserStates

__all__ = ["MOVE_REQUESTS", "MoveHandler"]

log = logging.getLogger("elasticd.worker.moves")

MOVE_REQUESTS = frozenset({"snapshot", "install", "forget"})

Reply = Callable[[dict[str, Any], bytes | None], None]


class MoveHandler:
    __slots__ = ("_on_forget", "_queue", "_states", "_thread")

    def __init__(self, states: UserStates, on_forget: Callable[[str], None] | None = None) -> None:
        self._states = states
        self._on_forget = on_forget  # the sensor's register forgets the user too: it is another worker's now
        self._queue: queue.SimpleQueue[tuple[dict[str, Any], bytes | None, Reply] | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None

    def submit(self, message: dict[str, Any], payload: bytes | None, reply: Reply) -> None:
        """Queue a request (called from the channel thread); it is answered through ``reply``."""
        if self._thread is None or not self._thread.is_alive():
            self._thread = threading.Thread(target=self._run, name="elastic moves", daemon=True)
            self._thread.start()
        self._queue.put((message, payload, reply))

    def stop(self) -> None:
        if self._thread is not None:
            self._queue.put(None)
            self._thread.join(1.0)
            self._thread = None

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            message, payload, reply = item
            try:
                answer = self.answer(message, payload)
                if answer is not None:
                    reply(*answer)
            except Exception:  # the reply could not be sent (the channel went): elasticd's side times out
                log.exception("elasticd's %s request could not be answered", message.get("type"))

    def answer(self, message: dict[str, Any], payload: bytes | None) -> tuple[dict[str, Any], bytes | None] | None:
        """The reply to one request (None for ``forget``). Never raises for what the request or the app did:
        that is a refusal with its reason."""
        kind, move_id, user = message.get("type"), message.get("id"), message.get("user")
        if not isinstance(user, str) or not user:
            return ({"type": "refused", "id": move_id, "reason": f"{kind} needs a user"}, None)
        try:
            if kind == "snapshot":
                package = self._states.snapshot(user)
                if len(package) > MAX_PAYLOAD:
                    raise ValueError(f"the package is {len(package)} bytes, over the {MAX_PAYLOAD} a move carries")
                return ({"type": "package", "id": move_id}, package)
            if kind == "install":
                if payload is None:
                    raise ValueError("an install carries the package")
                self._states.install(user, payload)
                return ({"type": "installed", "id": move_id}, None)
            if kind == "forget":
                self._states.forget(user)
                if self._on_forget is not None:
                    self._on_forget(user)
                return None
            raise ValueError(f"unknown request {kind!r}")
        except Exception as exc:  # the app's hooks or an unreadable package: refused, the move aborts
            log.warning("%s of %s refused: %s", kind, user, exc)
            return ({"type": "refused", "id": move_id, "reason": f"{type(exc).__name__}: {exc}"}, None)
