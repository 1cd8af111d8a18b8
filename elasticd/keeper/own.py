"""Finding the keeper at a start: the one listening at the socket (the keeper's unit's; or, after a re-exec in place,
the one this process started before the exec), else one elasticd starts itself, tied to its life.

A keeper of elasticd's own (``--parent-death``: SIGTERM to it when elasticd dies, and it stops the workers) gives a
start from a terminal, ``./dev run`` and the tests what a unit without a keeper had: workers that end with elasticd.
It is forked from the event loop's thread, as the workers were: the parent-death signal follows the thread that
forked, and a re-exec in place keeps that thread (the keeper, and the workers, stay).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import sys
from collections.abc import Mapping, Sequence
from typing import Final

from elasticd.keeper.link import KeeperLink, KeptProcess, KeptRow

__all__ = ["KeeperSpawner", "keeper_socket", "reach_keeper"]

log = logging.getLogger("elasticd.keeper")

# A keeper systemd starts for elasticd's connect is a Python start: 1-3 s in the VM suite's TCG guests, more on a host
# starting thousands of workers at once. Only a keeper that cannot start waits this out.
_LISTEN_WAIT: Final = 30.0


class KeeperSpawner:
    """What the workers are started through: the keeper's link of the moment. When the keeper is lost (its workers
    with it), the daemon reaches another (one of its own, started anew; or its unit's, restarted by systemd), and a
    start waits for it meanwhile, up to ``_LISTEN_WAIT``."""

    __slots__ = ("_up", "link")

    def __init__(self, link: KeeperLink) -> None:
        self.link = link
        self._up = asyncio.Event()
        self._up.set()

    def lost(self) -> None:
        self._up.clear()

    def replace(self, link: KeeperLink) -> None:
        self.link = link
        self._up.set()

    async def spawn(self, argv: Sequence[str], env: Mapping[str, str], cwd: str, label: str,
                    stdio: tuple[int, int, int], hold: int | None = None) -> KeptProcess:
        if not self._up.is_set():
            try:
                await asyncio.wait_for(self._up.wait(), _LISTEN_WAIT)
            except TimeoutError:
                raise OSError("no keeper to start it through (the keeper was lost and not reached again)") from None
        return await self.link.spawn(argv, env, cwd, label, stdio, hold)


def keeper_socket(runtime_dir: str) -> str:
    return os.path.join(runtime_dir, "keeper", "keeper.sock")


async def reach_keeper(path: str, *, start: bool) -> tuple[KeeperLink, list[KeptRow]]:
    """The keeper at ``path`` (its table too); with ``start``, one started here when none listens; without, the one
    of its unit, waited for (it may be starting: the units start in order, a restart of its own is quick). OSError
    when none can be reached."""
    if start:
        try:
            return await KeeperLink.connect(path)
        except (FileNotFoundError, ConnectionRefusedError):
            pass
        process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "elasticd.keeper", "--socket", path, "--parent-death", "--orphan-bound", "0",
            stdin=asyncio.subprocess.DEVNULL, env={**os.environ, "PYTHONPATH": _package_root()})
        try:
            link, rows = await _connect_within(path, process)
        except OSError:
            with contextlib.suppress(ProcessLookupError):
                process.kill()
            raise
        log.info("elasticd's own keeper (pid %d) started: the workers end with elasticd", link.keeper_pid)
        return link, rows
    return await _connect_within(path, None)


async def _connect_within(path: str, process: asyncio.subprocess.Process | None) -> tuple[KeeperLink, list[KeptRow]]:
    """Connect to ``path`` as soon as it listens, within ``_LISTEN_WAIT`` (and while ``process``, the keeper started
    here, runs)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + _LISTEN_WAIT
    while True:
        if process is not None and process.returncode is not None:
            raise OSError(f"elasticd's keeper exited at its start (status {process.returncode})")
        whose = "elasticd's keeper" if process is not None else "the keeper's unit (elasticd-keeper.service)"
        try:
            # (bounded: under socket activation the connect succeeds at once, and the keeper systemd starts for it
            # answers once it runs, or never, when it fails to start)
            return await asyncio.wait_for(KeeperLink.connect(path), max(1.0, deadline - loop.time()))
        except TimeoutError:
            raise OSError(f"{whose} did not answer at {path} within {_LISTEN_WAIT:g}s (systemctl status "
                          "elasticd-keeper)") from None
        except (FileNotFoundError, ConnectionRefusedError) as exc:
            if loop.time() > deadline:
                raise OSError(f"{whose} did not listen at {path} within {_LISTEN_WAIT:g}s: {exc}") from None
        await asyncio.sleep(0.02 if process is not None else 0.1)


def _package_root() -> str:
    """Where this elasticd package is imported from, first on the keeper's path: the keeper runs the same code."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    existing = os.environ.get("PYTHONPATH")
    return f"{root}{os.pathsep}{existing}" if existing else root
