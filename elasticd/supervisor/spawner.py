"""Who starts a worker's process: the keeper (``elasticd.keeper``: the daemon's way, so that workers outlive a crash
of elasticd), or elasticd itself (``DirectSpawner``: a Worker driven alone, as its tests drive it).

Both start ``argv`` in a session of its own (its process group is the worker's: a stop kills the group), with the
three descriptors given, and answer an object with ``pid``, ``returncode``, ``wait()`` and ``send_signal()``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from typing import Protocol

from elasticd.keeper.link import KeptProcess
from elasticd.supervisor.identity import start_time

__all__ = ["ChildProcess", "DirectSpawner", "Spawner", "process_start_time"]

# The process a worker runs: the keeper's child (the daemon's), or elasticd's own (a Worker driven alone).
ChildProcess = asyncio.subprocess.Process | KeptProcess


class Spawner(Protocol):
    async def spawn(self, argv: Sequence[str], env: Mapping[str, str], cwd: str, label: str,
                    stdio: tuple[int, int, int], hold: int | None = None) -> ChildProcess:
        """OSError when it cannot be started. ``hold``: the read end of the output pipe, for a keeper to keep."""


class DirectSpawner:
    """elasticd's own child (tied to its life: setpriv's parent-death signal)."""

    __slots__ = ()

    async def spawn(self, argv: Sequence[str], env: Mapping[str, str], cwd: str, label: str,
                    stdio: tuple[int, int, int], hold: int | None = None) -> ChildProcess:
        return await asyncio.create_subprocess_exec(*argv, env=dict(env), cwd=cwd, stdin=stdio[0], stdout=stdio[1],
                                                    stderr=stdio[2], start_new_session=True)


def process_start_time(process: ChildProcess) -> int | None:
    """Its start time (its identity with the pid, for the state a re-exec or a crash leaves): the keeper's word for
    its children, /proc's for this process's own."""
    if isinstance(process, KeptProcess):
        return process.started if process.returncode is None else None
    return start_time(process.pid)
