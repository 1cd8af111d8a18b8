"""What a worker is started with: its argv (through the cgroup trampoline), environment and directory.

Pure: a ``WorkerSpec`` is derived from the config and compared on reload (a changed spec means the
workers are replaced); the argv and environment of one start are derived from the spec.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass

from elasticd.config import App, Group

__all__ = ["TRAMPOLINE", "WorkerSpec", "spawn_argv", "spec_for", "worker_env"]

# The one constant shell script of ADR-0010. It runs as the worker's own pid: it writes that pid into the
# leaf's cgroup.procs and only then execs the command, so the worker's first instruction (and every child
# it forks) is already inside the leaf. "$0" is the leaf and "$@" the argv: positional parameters are never
# parsed by the shell, so no byte of a tenant's command is interpreted. If the write fails, `&&` stops the
# exec: a worker never runs unconfined.
TRAMPOLINE = 'echo $$ > "$0/cgroup.procs" && exec "$@"'

# Variables of elasticd's own environment that describe elasticd's relation to systemd; a worker that
# inherited them could notify or log as if it were elasticd.
_PRIVATE_ENV = ("NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID", "LISTEN_FDS", "LISTEN_PID",
                "LISTEN_FDNAMES", "JOURNAL_STREAM", "MAINPID")


@dataclass(frozen=True, slots=True)
class WorkerSpec:
    """Everything that, when changed, requires a new process."""

    argv: tuple[str, ...]
    env: tuple[tuple[str, str], ...]
    cwd: str
    leaf: str | None  # None: cgroups not enforced, start the command directly


def spec_for(app: App, group: Group, leaf: str | None) -> WorkerSpec:
    python = group.python or sys.executable
    argv = tuple(arg.replace("{python}", python) for arg in group.command)
    # ELASTIC_CONCURRENCY tells the sensor library its executor's size (an addition to DESIGN's contract).
    env = {**group.env, "ELASTIC_CONCURRENCY": str(group.concurrency)}
    return WorkerSpec(argv=argv, env=tuple(sorted(env.items())), cwd=app.root, leaf=leaf)


def spawn_argv(spec: WorkerSpec, socket: str | None = None) -> list[str]:
    """The argv of one start. ``{socket}`` in the command is the worker's own socket path (the bare path of
    ELASTIC_LISTEN), so ``["gunicorn", "--bind", "unix:{socket}", "app:app"]`` needs no shell; it is per worker,
    hence substituted here and not in the group's spec."""
    argv = [arg.replace("{socket}", socket) for arg in spec.argv] if socket is not None else list(spec.argv)
    if spec.leaf is None:
        return argv
    return ["/bin/sh", "-c", TRAMPOLINE, spec.leaf, *argv]


def worker_env(spec: WorkerSpec, base: Mapping[str, str], *, worker_id: str, token: str, runtime_dir: str,
               occupancy_interval: float) -> dict[str, str]:
    env = {k: v for k, v in base.items() if k not in _PRIVATE_ENV}
    env.update(spec.env)
    env.update({
        "ELASTIC_LISTEN": f"unix:{socket_path(runtime_dir, worker_id)}",
        "ELASTIC_CHANNEL": f"unix:{os.path.join(runtime_dir, 'channel.sock')}",
        "ELASTIC_WORKER_ID": worker_id,
        "ELASTIC_TOKEN": token,
        "ELASTIC_OCCUPANCY_INTERVAL": f"{occupancy_interval:g}",
    })
    return env


def socket_path(runtime_dir: str, worker_id: str) -> str:
    return os.path.join(runtime_dir, "workers", f"{worker_id}.sock")
