"""A process's identity beside its pid: its start time (``/proc/PID/stat``'s 22nd field). A pid alone may be another
process's after a reuse; the pair may not. The keeper reads it for each child it starts, and elasticd for a child of
its own (a Worker driven alone)."""

from __future__ import annotations

import os

__all__ = ["start_time"]


def start_time(pid: int) -> int | None:
    """The start time (``/proc/PID/stat``'s 22nd field, clock ticks since boot) of this process's child ``pid``: with
    the pid, its identity (a pid alone may be another process's after a reuse). None when there is no such process,
    it is a zombie (ended: not a worker to adopt), or it is not this process's child (only a child can be waited
    for, and only a child of ours is a worker of ours)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            text = stat.read()
    except OSError:
        return None
    # The command name (field 2) is in parentheses and may hold spaces or parentheses: split after the last ")".
    fields = text[text.rfind(b")") + 2:].split()
    if len(fields) < 20 or fields[0] == b"Z" or int(fields[1]) != os.getpid():
        return None
    return int(fields[19])  # (field 22 of the whole line; 20th after the name, the state being the 1st)
