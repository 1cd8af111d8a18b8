"""A worker process this image did not start: started by the image before a re-exec in place (``elasticd upgrade``),
and still this process's child, since ``exec`` keeps the pid and so the children.

asyncio's subprocess objects exist only for processes the loop itself spawned, so an adopted one is watched here: a
pidfd (``pidfd_open``, Linux 5.3) becomes readable when the process ends, and only then is it reaped, with
``waitpid(pid, WNOHANG)``. Why a pidfd and not SIGCHLD: the loop's own child handling (libuv's under uvloop,
asyncio's child watcher otherwise) waits only for the pids it spawned, so nothing else reaps an adopted child (and
nothing here reaps any of the loop's); and a pidfd names the process, not a number a reuse could give to another.

A child that ended during the exec is a zombie by the time the new image looks: its pid is still its own (a zombie's
pid is not reused until it is reaped), the pidfd is readable at once, and its status is read as any other exit's.

The object has the part of ``asyncio.subprocess.Process`` that ``Worker`` uses: ``pid``, ``returncode``,
``wait()`` and ``send_signal()``.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal

__all__ = ["AdoptedProcess", "start_time"]


class AdoptedProcess:
    __slots__ = ("_ended", "_pidfd", "pid", "returncode")

    def __init__(self, pid: int) -> None:
        """OSError (ESRCH) when no process has this pid: it is not adopted."""
        self.pid = pid
        self.returncode: int | None = None
        self._pidfd = os.pidfd_open(pid)  # (close-on-exec: a later re-exec adopts the process anew, by its pid)
        self._ended: asyncio.Event | None = None

    async def wait(self) -> int:
        if self.returncode is not None:
            return self.returncode
        if self._ended is None:
            self._ended = asyncio.Event()
            asyncio.get_running_loop().add_reader(self._pidfd, self._reap)
            self._reap()  # (ended already: a zombie)
        await self._ended.wait()
        assert self.returncode is not None
        return self.returncode

    def _reap(self) -> None:
        try:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
        except ChildProcessError:  # not our child after all (never adopted so), or reaped elsewhere: it is gone
            pid, status = self.pid, 255 << 8
        if pid == 0:
            return  # still running (the pidfd was readable for another reason: none on Linux, but harmless)
        self.returncode = os.waitstatus_to_exitcode(status)
        loop = asyncio.get_running_loop()
        loop.remove_reader(self._pidfd)
        os.close(self._pidfd)
        self._pidfd = -1
        if self._ended is not None:
            self._ended.set()

    def send_signal(self, signum: int) -> None:
        if self.returncode is not None:
            return
        # Through the pidfd: a signal to a number could reach another process if this one had ended and been
        # reaped; this one's pidfd cannot.
        with contextlib.suppress(ProcessLookupError):
            signal.pidfd_send_signal(self._pidfd, signum)

    def close(self) -> None:
        """Stop watching (the daemon is exiting without waiting for it)."""
        if self._pidfd >= 0:
            with contextlib.suppress(ValueError, RuntimeError):
                asyncio.get_running_loop().remove_reader(self._pidfd)
            os.close(self._pidfd)
            self._pidfd = -1


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
