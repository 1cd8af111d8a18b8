"""A worker's life: its states, the transitions between them as a table, and the sets the rest of the daemon asks
about, each named once (pure).

h11's rule (``h11/_state.py``), as the front's relay has it: one owner of the states, the legal transitions written
out, an illegal one fails closed (``IllegalTransition``) rather than leave a worker in a state nobody planned for.
``Worker`` (worker_process.py) is the only writer; everyone else reads ``worker.state`` against the sets below, never
against a string.

    new ──► starting ──► running ──► exited ──► backoff ──► starting …
     │         │  │         │          │  │        │
     │         │  └─► exited / backoff / failed    └─► failed (a crash loop; or it cannot start at all)
     └──► failed         stopping ◄──┘  (stop or kill while a process lives)
                            │
    any ──► stopped ◄───────┘  (the end: a stopped worker never starts again; a restart is a new start of the same
                                id only through the run loop, which a stop ends)

The values are the strings ``GET /v1/status`` has always shown, so the API does not change.
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum

__all__ = ["COMING", "COUNTED", "GONE", "TRANSITIONS", "WILL_SERVE", "IllegalTransition", "WorkerState",
           "transition"]


class WorkerState(StrEnum):
    NEW = "new"  # made, its run loop not yet at its first start
    STARTING = "starting"  # its process started; its socket does not accept yet
    RUNNING = "running"  # its socket accepts: routable
    EXITED = "exited"  # its process ended unasked; the run loop decides between backoff and failed
    BACKOFF = "backoff"  # waiting out the restart delay
    STOPPING = "stopping"  # asked to stop (SIGTERM, or SIGKILL for a hung one); its process still lives
    STOPPED = "stopped"  # stopped by elasticd: gone for good
    FAILED = "failed"  # a crash loop, or it cannot start (a reload retries it as a new worker)


_S = WorkerState

# from → the states it may go to. STOPPED is reachable from every state but itself: a stop ends a worker wherever
# it is (a failed one too, when its group is reloaded or removed).
TRANSITIONS: Mapping[WorkerState, frozenset[WorkerState]] = {
    _S.NEW: frozenset({_S.STARTING, _S.FAILED, _S.STOPPED}),
    # (backoff or failed straight from starting: its process could not be created at all)
    _S.STARTING: frozenset({_S.RUNNING, _S.EXITED, _S.BACKOFF, _S.FAILED, _S.STOPPING, _S.STOPPED}),
    _S.RUNNING: frozenset({_S.EXITED, _S.STOPPING, _S.STOPPED}),
    _S.EXITED: frozenset({_S.BACKOFF, _S.FAILED, _S.STOPPED}),
    _S.BACKOFF: frozenset({_S.STARTING, _S.FAILED, _S.STOPPED}),
    _S.STOPPING: frozenset({_S.STOPPED}),
    _S.FAILED: frozenset({_S.STOPPED}),
    _S.STOPPED: frozenset(),
}

# A start in flight: it will be routable without anyone acting (a request for the group waits for it).
COMING = frozenset({_S.NEW, _S.STARTING, _S.BACKOFF})
# Serving, or about to.
WILL_SERVE = COMING | {_S.RUNNING}
# Its process is gone (its connections, readings and announcements go with it).
GONE = frozenset({_S.EXITED, _S.STOPPED, _S.FAILED})
# What the supervisor holds for a group: a process, or one about to be (draining and being-replaced ones included;
# failed and stopped ones not).
COUNTED = frozenset(_S) - {_S.FAILED, _S.STOPPED}


class IllegalTransition(RuntimeError):
    """A transition not in the table: a bug of elasticd's, refused rather than acted on."""


def transition(current: WorkerState, target: WorkerState, worker_id: str = "") -> WorkerState:
    """``target`` when the table allows it from ``current`` (staying put is always allowed); else
    IllegalTransition naming both."""
    if target is current or target in TRANSITIONS[current]:
        return target
    raise IllegalTransition(f"worker {worker_id or '?'}: {current} → {target} is not a transition of a worker's life "
                            f"(from {current}: {', '.join(sorted(TRANSITIONS[current])) or 'none'})")
