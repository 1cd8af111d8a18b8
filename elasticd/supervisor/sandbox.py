"""An isolated tenant's view of the host: bubblewrap's argv for one worker start.

Pure: a ``Sandbox`` is derived from the config with the worker's spec (and compared with it on reload); its argv
is derived from it, the worker's directory and leaf, and which of the paths to hide exist now (the shell looks).

Why bubblewrap, and why a namespace per worker. bubblewrap is Debian's ``bubblewrap`` (what Flatpak runs every app
in): it makes the mount and pid namespaces, the binds, a fresh /proc and a minimal /dev from one argv, and fails
closed — any bind it cannot make ends it before it execs anything. It runs as root here (no user namespace: the
unit forbids them, and a tenant's uid stays the host's), after the trampoline has put its pid in the leaf and
before setpriv drops to the tenant's user, so the tenant's first instruction runs in the view, unprivileged and in
its leaf (ADR-0010's contract; the argv after ``--`` is never read as an option). util-linux's unshare would need
a shell script of mounts; nsenter into a per-tenant namespace would need a long-lived holder process per tenant,
whose death would kill every worker of the tenant, and a per-tenant restart protocol. A namespace per worker has
none of that: it lives and dies with its worker, and a reload that changes the view replaces the workers as any
changed spec does. What the tenant's workers share is shared through binds: its roots, its /tmp and /var/tmp.

The view:

- the system read-only: /usr (and /bin, /sbin, /lib* as the host has them), /etc, /opt; /sys read-only, with an
  empty /sys/fs/cgroup (the hierarchy names every tenant and shows each one's usage);
- /proc of the worker's own pid namespace (only its own processes), a minimal /dev (null, zero, full, random,
  urandom, tty, a private devpts) and a private /dev/shm;
- the tenant's app roots, its ``writable:`` paths and its user's home read-write; its ``read_only:`` paths, and
  elasticd's own interpreter for a ``{python}`` command, read-only; its own socket directory (the worker's socket
  and the tenant's channel), read-write;
- /tmp and /var/tmp: directories of the tenant's own on the host (``<server.tmp_dir>/<tenant>/tmp``, ``var-tmp``),
  shared by all its workers and kept across their restarts, as a host's are. (A tmpfs per worker would be charged
  to the tenant's memory, but would be neither shared nor kept; a tmpfs per tenant would be a mount elasticd holds
  on the host, left behind if it is killed. A directory costs the tenant disk, as its writable roots already do.)
- Nothing else: no other tenant's root, no /home, /root, /srv or /var beyond the above, no /run but the tenant's
  sockets and the resolver's directory. Secrets that lie inside what is shown (elasticd's config and the files it
  names, /etc/shadow and its kind) are covered by an inaccessible file or directory (mode 0000, as systemd's
  InaccessiblePaths=): present, but no tenant may open them.

The network is the host's: workers listen on Unix sockets, and their outbound traffic is the app's business.
"""

from __future__ import annotations

import fnmatch
import os
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Final

from elasticd.config.isolation import BWRAP, SYSTEM_READ_ONLY, SYSTEM_TRY, inside, tmp_dirs
from elasticd.config.model import Config, Tenant

__all__ = ["SECRETS", "SYSTEM_READ_ONLY", "SYSTEM_TRY", "Mask", "Sandbox", "hidden_for", "inaccessible_path",
           "sandbox_for",
           "tmp_dirs", "with_interpreter"]

# Hidden inside what is shown, when they exist: secrets a host keeps under /etc (mostly unreadable to a tenant's
# user already; hidden all the same, so that no mode an operator sets by mistake exposes them).
SECRETS = ("/etc/shadow", "/etc/shadow-", "/etc/gshadow", "/etc/gshadow-", "/etc/security/opasswd", "/etc/sudoers",
           "/etc/sudoers.d", "/etc/ssh", "/etc/ssl/private", "/etc/elasticd")


@dataclass(frozen=True, slots=True)
class Mask:
    """A path to hide that exists now, and whether it is a directory (hidden by an empty one, else by a file)."""

    path: str
    directory: bool


@dataclass(frozen=True, slots=True)
class Sandbox:
    """Everything of a tenant's view that, when changed, requires new workers."""

    tenant: str
    roots: tuple[str, ...]  # its app roots (read-write)
    read_write: tuple[str, ...]  # its ``writable:`` paths and its user's home
    read_only: tuple[str, ...]  # its ``read_only:`` paths, elasticd's own interpreter for ``{python}``
    sockets: str  # its socket directory: <runtime_dir>/workers/<tenant>
    tmp: str  # <server.tmp_dir>/<tenant>: its /tmp and /var/tmp are tmp/ and var-tmp/ in it
    hidden: tuple[str, ...]  # what to hide when it exists (SECRETS, elasticd's config and the files it names)
    inaccessible: str  # a mode-0000 empty file of elasticd's, bound over each hidden file

    def argv(self, *, cwd: str, masks: Sequence[Mask]) -> list[str]:
        """bubblewrap's argv, ending at ``--``: what follows it is setpriv's argv. ``cwd``: the worker's directory
        inside the view; ``masks``: the ``hidden`` paths that exist now."""
        tmp, var_tmp = tmp_dirs(self.tmp)
        argv = [BWRAP,
                # Its own pid namespace (bubblewrap's pid 1 reaps orphans; the command is pid 2). Not IPC or cgroup
                # namespaces: each would cost the unit's exposure score a notch (RestrictNamespaces= allows exactly
                # what bubblewrap makes, for elasticd and every worker), for SysV IPC objects that their own modes
                # guard and a /proc/self/cgroup that names only the worker's own leaf.
                "--unshare-pid",
                # bubblewrap's own processes die with elasticd, taking the worker's namespace with them.
                "--die-with-parent"]
        for path in SYSTEM_READ_ONLY:
            argv += ["--ro-bind", path, path]
        made: set[str] = set()
        for path in SYSTEM_TRY:
            argv += [*_parents(path, made), "--ro-bind-try", path, path]
        # /sys read-only, its cgroup hierarchy hidden: it names every tenant and shows each one's usage.
        argv += ["--ro-bind", "/sys", "/sys", "--tmpfs", "/sys/fs/cgroup"]
        argv += ["--proc", "/proc", "--dev", "/dev", "--perms", "1777", "--tmpfs", "/dev/shm",
                 "--bind", tmp, "/tmp", *_parents("/var/tmp", made), "--bind", var_tmp, "/var/tmp"]
        for path in self.read_only:
            argv += [*_parents(path, made), "--ro-bind", path, path]
        for path in self.roots:
            # -try: an app root that does not exist yet is the worker's concern (it runs in /, with a warning), as
            # without isolation.
            argv += [*_parents(path, made), "--bind-try", path, path]
        for path in self.read_write:
            # Not -try: they were there at load; one gone since is a view that cannot be made (the worker does not
            # start, and bubblewrap's reason is in its log), never a view without it.
            argv += [*_parents(path, made), "--bind", path, path]
        argv += [*_parents(self.sockets, made), "--bind", self.sockets, self.sockets]
        for mask in (m for m in masks if self.shows(m.path)):
            argv += ["--perms", "0000", "--tmpfs", mask.path] if mask.directory else \
                ["--ro-bind", self.inaccessible, mask.path]
        return [*argv, "--chdir", cwd, "--"]

    def describe(self) -> dict[str, object]:
        """The view as ``GET /v1/status`` tells it (``tenants.<t>.isolation``)."""
        tmp, var_tmp = tmp_dirs(self.tmp)
        return {"tool": "bubblewrap", "namespaces": ["mount", "pid"], "read_write": [*self.roots, *self.read_write],
                "read_only": list(self.read_only), "tmp": tmp, "var_tmp": var_tmp}

    def shows(self, path: str) -> bool:
        """Whether ``path`` is inside what the view binds from the host (a hidden path elsewhere needs no mask:
        it is absent, and a mask would only tell where it is)."""
        return any(inside(path, base)
                   for base in (*SYSTEM_READ_ONLY, *SYSTEM_TRY, *self.read_only, *self.roots, *self.read_write))


def _parents(path: str, made: set[str]) -> list[str]:
    """Directories leading to a bind's destination, made before it with mode 0755: bubblewrap (0.8) makes missing
    parents 0700, which the tenant's user could not search. (One inside a bind made earlier, as a runtime directory
    under /tmp would be, is made in the bound directory itself.)"""
    argv: list[str] = []
    parts = path.strip("/").split("/")[:-1]
    for depth in range(1, len(parts) + 1):
        parent = "/" + "/".join(parts[:depth])
        if parent not in made:
            made.add(parent)
            argv += ["--perms", "0755", "--dir", parent]
    return argv


def hidden_for(config: Config) -> tuple[str, ...]:
    """What every isolated tenant's view hides: SECRETS, the config file and every secret file it names, the
    included files. The same for every tenant of a config: computed once per activation (hidden_for is a pass
    over every group; once per group, it was quadratic in the apps)."""
    server = config.server
    named = [config.source, *(f for f in _secret_files(config) if f is not None),
             *_include_covers(config), server.tenant_config_dir, server.state_dir]
    return tuple(dict.fromkeys((*SECRETS, *(p for p in named if p is not None and os.path.isabs(p)))))


def sandbox_for(config: Config, tenant: Tenant, hidden: tuple[str, ...] | None = None) -> Sandbox | None:
    """The tenant's view (None: not isolated). The config file is hidden, with every secret file it names, and the
    directories of its include: globs, server.tenant_config_dir and server.state_dir: each covered whole, once (a
    host of 2,000 tenant files is one cover, not 2,000 per worker start)."""
    view = tenant.isolation
    if view is None:
        return None
    server = config.server
    roots = tuple(dict.fromkeys(os.path.realpath(app.root) for app in tenant.apps.values()))
    # (A writable path inside a root is bound again on its own: its bind, unlike the root's, must succeed.)
    own = tuple(dict.fromkeys((*view.writable, *((view.home,) if view.home is not None else ()))))
    return Sandbox(tenant=tenant.name, roots=roots, read_write=own, read_only=view.read_only,
                   sockets=os.path.join(server.runtime_dir, "workers", tenant.name),
                   tmp=os.path.join(server.tmp_dir, tenant.name),
                   hidden=hidden if hidden is not None else hidden_for(config),
                   inaccessible=inaccessible_path(server.runtime_dir))


def with_interpreter(sandbox: Sandbox, paths: Sequence[str]) -> Sandbox:
    """The view with these paths (an interpreter's prefixes) read-only too, unless the system part shows them."""
    extra = tuple(p for p in paths if not any(inside(p, s) for s in (*SYSTEM_READ_ONLY, *SYSTEM_TRY)))
    return replace(sandbox, read_only=tuple(dict.fromkeys((*sandbox.read_only, *extra))))


def inaccessible_path(runtime_dir: str) -> str:
    """The empty mode-0000 file bound over hidden files (made by the supervisor at each activation)."""
    return os.path.join(runtime_dir, "inaccessible")


# Directories a view must show: an include glob there is hidden file by file, never by covering the directory.
_SHARED_DIRECTORIES = frozenset(("/", "/etc", "/usr", "/var", "/opt", "/srv", "/home", "/root", "/run", "/tmp"))


def _include_covers(config: Config) -> list[str]:
    """What hides the included files: each glob's directory, or (a directory every view needs, such as /etc) the
    files it matches now, plus the tenants' own files."""
    covers: list[str] = []
    for pattern in config.includes:
        directory = os.path.dirname(pattern)
        if directory in _SHARED_DIRECTORIES or any(c in directory for c in "*?["):
            covers += [path for path in config.tenant_files.values() if fnmatch.fnmatch(path, pattern)]
        else:
            covers.append(directory)
    return covers


def _secret_files(config: Config) -> list[str | None]:
    server = config.server
    files: list[str | None] = []
    if server.monitor is not None:
        files.append(server.monitor.password_file)
    if server.registry is not None:
        files += [server.registry.secret_file, server.registry.key_file]
    known = _TENANT_SECRETS
    seen: dict[str, tuple[Tenant, tuple[str | None, ...]]] = {}
    for tenant in config.tenants.values():
        kept = known.get(tenant.name)
        if kept is None or kept[0] is not tenant:
            kept = (tenant, _tenant_secret_files(tenant))
        seen[tenant.name] = kept
        files += kept[1]
    known.clear()  # (only the tenants of the last config are kept)
    known.update(seen)
    return files


def _tenant_secret_files(tenant: Tenant) -> tuple[str | None, ...]:
    return tuple(file for app in tenant.apps.values() for group in app.groups.values()
                 for capacity in (group.capacity, *(node.capacity for node in group.nodes)) if capacity is not None
                 for file in (capacity.secret_file, capacity.key_file))


# Each tenant's capacity secret files, by name, with the model they were read from: a tenant's model is the very
# object across reloads while its file is unchanged (config/include.py), so a reload walks the changed tenant's groups
# alone (all 10,000 apps' were ~10 ms of every reload, on the front's loop).
_TENANT_SECRETS: Final[dict[str, tuple[Tenant, tuple[str | None, ...]]]] = {}
