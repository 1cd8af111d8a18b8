"""The sandbox's shell: which hidden paths exist now, and which process of an isolated worker a stop signals.

Why a stop cannot signal the pid elasticd started. A new pid namespace takes a fork: the process that makes it stays
outside, and only its child is pid 1 inside. So an isolated worker is three processes: bubblewrap's monitor (the pid
elasticd started, whose exit status is the command's), bubblewrap's init (pid 1 inside: it reaps orphans and ends
the namespace when the command ends) and the command (pid 2 inside). Neither of bubblewrap's forwards a signal: the
monitor dies of a SIGTERM at once and its init then gets SIGKILL (``--die-with-parent``), and an init ignores every
signal it has no handler for. A graceful stop therefore signals the command itself: the process in the worker's tree
whose innermost pid is 2. Before it exists (the view still being made: milliseconds), there is nothing of the
tenant's to stop gracefully, and the monitor is signalled instead, which ends the whole sandbox.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterable

from elasticd.supervisor.sandbox import Mask

__all__ = ["command_pid", "innermost_pid", "present_masks"]

_COMMAND_NSPID = 2  # bubblewrap's init is 1 in the worker's namespace; the command it forks first is 2


def present_masks(hidden: Iterable[str]) -> list[Mask]:
    """The hidden paths that exist now (a bind over a missing path would fail, and the worker with it)."""
    found = []
    for path in hidden:
        with contextlib.suppress(OSError):
            os.lstat(path)
            found.append(Mask(path, os.path.isdir(path)))
    return found


def innermost_pid(status: str) -> int | None:
    """The pid in the innermost namespace from the text of /proc/<pid>/status (its ``NSpid:`` line)."""
    for line in status.splitlines():
        if line.startswith("NSpid:"):
            fields = line.split()[1:]
            return int(fields[-1]) if fields and fields[-1].isdigit() else None
    return None


def command_pid(monitor: int) -> int | None:
    """The host pid of an isolated worker's command: the grandchild of ``monitor`` (bubblewrap's first process)
    whose innermost pid is 2. None when there is none (not forked yet, or gone)."""
    for init in _children(monitor):
        for child in _children(init):
            try:
                with open(f"/proc/{child}/status", encoding="ascii", errors="replace") as status:
                    if innermost_pid(status.read()) == _COMMAND_NSPID:
                        return child
            except OSError:
                continue
    return None


def _children(pid: int) -> list[int]:
    try:
        with open(f"/proc/{pid}/task/{pid}/children", encoding="ascii") as children:
            return [int(p) for p in children.read().split()]
    except (OSError, ValueError):
        return []
