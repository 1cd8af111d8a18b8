"""What a worker is started with: its argv (through the cgroup trampoline and setpriv), environment and
directory.

Pure: a ``WorkerSpec`` is derived from the config and compared on reload (a changed spec means the
workers are replaced); the argv and environment of one start are derived from the spec.

The order of one start: elasticd forks (from the event loop's thread: see below), the child execs the
trampoline as root, which puts its own pid into the leaf; under journald it then execs ``systemd-cat``, which
connects the worker's stdout and stderr to a journald stream of its own (see ``JournalStream``); then it sets the
umask (027: no file a worker makes is anyone else's to read); for an isolated tenant it then execs bubblewrap,
which makes the worker's view of the host (``sandbox.py``) and forks the process that runs the rest inside it; then
``setpriv``, which drops to the tenant's
user (``--reuid/--regid``, no supplementary groups, no new privileges, every capability gone from the
inheritable and bounding sets) and sets the parent-death signal, then execs the command. So the tenant's first
instruction already runs unprivileged and inside its leaf, and can never regain privileges.

The parent-death signal (SIGKILL) is what keeps a worker from outliving an elasticd that was itself killed:
the kernel clears it when credentials change, so setpriv sets it after the change; and it fires when the
*thread* that forked dies, so workers are forked from the event loop's thread (asyncio's and uvloop's
subprocess calls fork there), never from an executor thread.
"""

from __future__ import annotations

import os
import stat
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from elasticd.config.model import App, Group, RunAs
from elasticd.supervisor.sandbox import Mask, Sandbox, with_interpreter
from elasticd.worker_ids import parse_worker_id

__all__ = ["SETPRIV", "TRAMPOLINE", "UMASK", "JournalStream", "WorkerSpec", "channel_path", "own_interpreter",
           "permits", "privileges", "socket_dir", "socket_path", "spawn_argv", "spec_for", "worker_env"]

# The one constant shell script of ADR-0010. It runs as the worker's own pid: it writes that pid into the
# leaf's cgroup.procs and only then execs the command, so the worker's first instruction (and every child
# it forks) is already inside the leaf. "$0" is the leaf and "$@" the argv: positional parameters are never
# parsed by the shell, so no byte of a tenant's command is interpreted. If the write fails, `&&` stops the
# exec: a worker never runs unconfined.
TRAMPOLINE = 'echo $$ > "$0/cgroup.procs" && exec "$@"'

# What a worker keeps of elasticd's own environment: nothing else (not NOTIFY_SOCKET, nor anything an operator
# exported for elasticd). HOME, USER and LOGNAME are the tenant's user's when it has one.
_PASSED_ENV = ("PATH", "LANG", "HOME", "USER", "LOGNAME")


@dataclass(frozen=True, slots=True)
class WorkerSpec:
    """Everything that, when changed, requires a new process."""

    argv: tuple[str, ...]
    env: tuple[tuple[str, str], ...]
    cwd: str
    leaf: str | None  # None: cgroups not enforced, start the command directly
    run_as: RunAs | None = None  # None: the tenant has no `user:` (its workers keep elasticd's credentials)
    sandbox: Sandbox | None = None  # None: the tenant is not isolated (its workers see the host as elasticd does)


def spec_for(app: App, group: Group, leaf: str | None, run_as: RunAs | None = None,
             sandbox: Sandbox | None = None) -> WorkerSpec:
    python = group.python or sys.executable
    argv = tuple(arg.replace("{python}", python) for arg in group.command)
    # ELASTIC_CONCURRENCY tells the sensor library its executor's size (an addition to DESIGN's contract).
    env = {**group.env, "ELASTIC_CONCURRENCY": str(group.concurrency)}
    if sandbox is not None and group.python is None and any("{python}" in arg for arg in group.command):
        # elasticd's own interpreter (the demo app's, say): its prefixes and its package, read-only in the view.
        sandbox = with_interpreter(sandbox, own_interpreter())
    return WorkerSpec(argv=argv, env=tuple(sorted(env.items())), cwd=app.root, leaf=leaf, run_as=run_as,
                      sandbox=sandbox)


def own_interpreter() -> tuple[str, ...]:
    """Where elasticd's own Python lives: its prefix (a venv's), the base prefix, and the directory elasticd's
    package is imported from (a source checkout, for an editable install)."""
    package = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # .../elasticd
    return tuple(dict.fromkeys(os.path.realpath(p) for p in (sys.prefix, sys.base_prefix, os.path.dirname(package))))


# Between the trampoline and setpriv, a second constant script sets the worker's umask: uvloop's spawn takes no
# umask argument, elasticd's own umask is not the tenants' business, and ADR-0010's trampoline stays as it is.
# "$0" is only a name; "$@" is setpriv's argv, never interpreted.
UMASK = 'umask 027 && exec "$@"'


# By its absolute path: it runs as root, and a name would be looked up on the PATH the worker is given, which a
# group's `env:` may set to a directory the tenant can write (its venv's bin/): a `setpriv` planted there would run
# as root. (util-linux, Essential on Debian, installs it here; /bin is /usr/bin on every supported release.)
SETPRIV = "/usr/bin/setpriv"


def privileges(run_as: RunAs | None) -> list[str]:
    """setpriv's part of the argv: the tenant's user without a way back, and the parent-death signal (for a
    tenant without a user too: a worker must never outlive elasticd)."""
    if run_as is None:
        return [SETPRIV, "--pdeathsig", "SIGKILL", "--"]
    return [SETPRIV, f"--reuid={run_as.uid}", f"--regid={run_as.gid}", "--clear-groups", "--no-new-privs",
            "--inh-caps=-all", "--bounding-set=-all", "--pdeathsig", "SIGKILL", "--"]


@dataclass(frozen=True, slots=True)
class JournalStream:
    """Under journald, a worker's stdout and stderr go to journald's stream socket without passing through
    elasticd: ``systemd-cat`` (package systemd, the standard tool for it) connects to
    /run/systemd/journal/stdout itself, puts that stream on fds 1 and 2 and execs the rest of the argv, so the
    pid stays the worker's. It comes right after the trampoline: it connects from inside the worker's leaf, and
    journald attributes a stream to the process that connected it — ``_SYSTEMD_CGROUP`` names the tenant and
    the app, ``_SYSTEMD_UNIT`` is still elasticd.service (``journalctl -u elasticd`` shows the lines), and
    ``SYSLOG_IDENTIFIER`` is the worker id (``journalctl -t acme.shop.green.1``). If it cannot connect it exits
    without exec'ing anything: the worker does not start, as when the trampoline fails.

    ``--level-prefix=false``: journald would otherwise read a leading ``<N>`` of each line as its priority, and a
    tenant printing ``<0>...`` would log at emerg, which journald sends to every terminal (ForwardToWall). Every
    line is at the fixed priority info instead — which also keeps a tenant out of the rate-limit pools of
    elasticd's own warnings and errors (journald's bucket is per unit and per priority class: see the README).
    Its options end at ``--`` (and its getopt stops at the first non-option): no byte of the command is read as
    an option. ``systemd_cat`` is an absolute path found once at start in the system's directories: it runs as
    root, so never through a PATH a group's ``env`` could point at a tenant's files.
    """

    systemd_cat: str
    identifier: str  # SYSLOG_IDENTIFIER: the worker id, tenant.app.group.N

    def argv(self) -> list[str]:
        return [self.systemd_cat, f"--identifier={self.identifier}", "--priority=info", "--level-prefix=false",
                "--"]


def spawn_argv(spec: WorkerSpec, socket: str | None = None, journal: JournalStream | None = None, *,
               cwd: str | None = None, masks: Sequence[Mask] = ()) -> list[str]:
    """The argv of one start. ``{socket}`` in the command is the worker's own socket path (the bare path of
    ELASTIC_LISTEN), so ``["gunicorn", "--bind", "unix:{socket}", "app:app"]`` needs no shell; it is per worker,
    hence substituted here and not in the group's spec. With ``journal``, the worker's output goes straight to
    journald (``JournalStream``); without, to whatever stdout and stderr elasticd gives the process. For an isolated
    tenant, ``cwd`` is the worker's directory inside its view (default: the app's root) and ``masks`` the hidden
    paths that exist now (``sandbox.Sandbox.argv``)."""
    argv = [arg.replace("{socket}", socket) for arg in spec.argv] if socket is not None else list(spec.argv)
    view = spec.sandbox.argv(cwd=cwd or spec.cwd, masks=masks) if spec.sandbox is not None else []
    argv = ["/bin/sh", "-c", UMASK, "umask", *view, *privileges(spec.run_as), *argv]
    if journal is not None:
        argv = [*journal.argv(), *argv]
    if spec.leaf is None:
        return argv
    return ["/bin/sh", "-c", TRAMPOLINE, spec.leaf, *argv]


def worker_env(spec: WorkerSpec, base: Mapping[str, str], *, worker_id: str, token: str, runtime_dir: str,
               occupancy_interval: float) -> dict[str, str]:
    env = {k: v for k, v in base.items() if k in _PASSED_ENV}
    if spec.run_as is not None:
        env.update(HOME=spec.run_as.home, USER=spec.run_as.user, LOGNAME=spec.run_as.user)
    env.update(spec.env)
    env.update({
        "ELASTIC_LISTEN": f"unix:{socket_path(runtime_dir, worker_id)}",
        "ELASTIC_CHANNEL": f"unix:{channel_path(runtime_dir, _tenant_of(worker_id))}",
        "ELASTIC_WORKER_ID": worker_id,
        "ELASTIC_TOKEN": token,
        "ELASTIC_OCCUPANCY_INTERVAL": f"{occupancy_interval:g}",
    })
    return env


def _tenant_of(worker_id: str) -> str:
    parts = parse_worker_id(worker_id)
    if parts is None:
        raise ValueError(f"{worker_id!r} is not a worker id (tenant.app.group.N)")
    return parts.tenant


def socket_dir(runtime_dir: str, tenant: str) -> str:
    """A tenant's worker sockets live in a directory of its own, which only its user (and elasticd) may enter:
    another tenant cannot connect to them."""
    return os.path.join(runtime_dir, "workers", tenant)


def channel_path(runtime_dir: str, tenant: str) -> str:
    """The channel socket a tenant's workers announce on: in its own socket directory, so no other tenant can even
    connect to it (a connection costs elasticd an accept and a descriptor before any token is checked)."""
    return os.path.join(socket_dir(runtime_dir, tenant), "channel.sock")


def socket_path(runtime_dir: str, worker_id: str) -> str:
    """``<runtime_dir>/workers/<tenant>/<app>.<group>.<N>.sock`` for worker tenant.app.group.N (names cannot hold
    a dot): the tenant is the directory, not repeated in the name (sun_path holds 107 bytes)."""
    parts = parse_worker_id(worker_id)
    if parts is None:
        raise ValueError(f"{worker_id!r} is not a worker id (tenant.app.group.N)")
    return os.path.join(socket_dir(runtime_dir, parts.tenant), f"{parts.app}.{parts.group}.{parts.number}.sock")


def permits(st: os.stat_result, uid: int, gid: int, want: int) -> bool:
    """Whether a process with this uid and (only) this gid has the ``want`` bits (4 r, 2 w, 1 x) on the file
    ``st`` describes: the owner's bits when it owns it, else the group's when its gid is the file's, else the
    others' — as the kernel checks, without supplementary groups (setpriv --clear-groups) or capabilities."""
    mode = stat.S_IMODE(st.st_mode)
    if uid == 0:
        return True
    if st.st_uid == uid:
        return (mode >> 6) & want == want
    if st.st_gid == gid:
        return (mode >> 3) & want == want
    return mode & want == want
