"""The I/O shell over elasticd's cgroup subtree: directories, controller enabling, limit writes, removal.

Layout (ADR-0010)::

    <base>/                        delegated to us (or server.cgroups.path)
    <base>/server                  elasticd itself, only when <base> is our own cgroup
    <base>/tenants/<tenant>/       the tenant's limits
    <base>/tenants/<tenant>/<app>  leaf: the app's worker processes

Kernel rules this shell is shaped by (cgroup v2, Documentation/admin-guide/cgroup-v2.rst):

- "No internal processes": a non-root cgroup that enables controllers in ``cgroup.subtree_control``
  may hold no processes, and a process cannot be moved into one that does. So elasticd leaves <base>
  for <base>/server before enabling anything, and processes live only in leaves, whose
  subtree_control is never written.
- A controller can be enabled for a cgroup's children only if the cgroup itself has it
  (its ``cgroup.controllers``, which is the parent's subtree_control).
- A subtree_control write is all or nothing: one bad token (or one controller the kernel refuses, e.g.
  cpu while realtime threads run outside the root) fails the whole write, hence the per-controller retry.
- Interface files are parsed per write(2): a value must go in one write, one io.max device per write.
- rmdir is the only way to remove a cgroup; it fails with EBUSY while processes or child cgroups
  remain (never ENOTEMPTY: the interface files are not real directory entries).

A fake tree (plain directories, plus ``cgroup.controllers`` and ``cgroup.procs`` files in <base>) works
the same: files are created where the kernel would have them, so tests read exactly what was written.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
from collections.abc import Iterable, Sequence
from pathlib import Path

from elasticd.config import NAME_RE, Resources

from .disks import disks_for_roots
from .limits import WANTED_CONTROLLERS, io_max_limited, limit_writes

__all__ = ["CgroupError", "CgroupTree", "write_file"]

log = logging.getLogger("elasticd.cgroup")


class CgroupError(OSError):
    """The subtree cannot be set up (e.g. elasticd cannot move itself out of <base>). An OSError, so
    callers that handle file-system failures of the tree handle it too."""


def write_file(path: Path, value: str) -> None:
    """Write ``value`` to an interface file in ONE write(2), truncating (as the shell's ``>`` does).

    On the real kernel the file exists; opening a missing one with O_CREAT would fail with a misleading
    EACCES (kernfs cannot create files), so O_CREAT is only tried after ENOENT, and if that also fails
    the ENOENT is what is reported. In a fake tree the O_CREAT retry creates the file.
    """
    data = value.encode()
    try:
        fd = os.open(path, os.O_WRONLY | os.O_TRUNC | os.O_CLOEXEC)
    except FileNotFoundError as missing:
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
        except OSError:
            raise missing from None
    try:
        written = os.write(fd, data)
        if written != len(data):  # kernfs takes a whole write or fails it; a short write means trouble
            raise OSError(errno.EIO, f"short write ({written} of {len(data)} bytes)", str(path))
    finally:
        os.close(fd)


def _read_words(path: Path) -> frozenset[str] | None:
    try:
        return frozenset(path.read_text(encoding="ascii").split())
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError) as exc:
        log.warning("cannot read %s: %s", path, exc)
        return frozenset()


def _check_name(name: str, what: str) -> str:
    # Names come from the validated config, but also from the admin API: never let one escape the base.
    if not NAME_RE.match(name):
        raise ValueError(f"{name!r} is not a valid {what} name")
    return name


def _describe(exc: OSError) -> str:
    return exc.strerror or str(exc)


class CgroupTree:
    """elasticd's subtree under ``base``. Not thread-safe: used from the event loop's thread only."""

    __slots__ = ("_enabled", "_logged_errors", "_no_disk_reported", "base", "base_is_own", "missing",
                 "sys_root", "tenant_by_cgroup_id")

    def __init__(self, base: Path, base_is_own: bool, sys_root: str = "/sys") -> None:
        self.base = Path(base)
        self.base_is_own = base_is_own
        self.sys_root = sys_root
        # Controllers reported missing, once per process lifetime, in report order (for /v1/status).
        self.missing: list[str] = []
        # Per directory: the controllers enabled in its subtree_control (= what its children have).
        self._enabled: dict[Path, frozenset[str]] = {}
        self._no_disk_reported: set[str] = set()
        self._logged_errors: set[tuple[object, ...]] = set()
        # The tenant whose group or leaf each cgroup id is (the directory's inode number, which is the id the kernel
        # gives a socket's cgroup: listener_guard tells a tenant's process by it). Ids are never reused.
        self.tenant_by_cgroup_id: dict[int, str] = {}

    # ----------------------------------------------------------------------------------------- paths

    @property
    def tenants_dir(self) -> Path:
        return self.base / "tenants"

    def tenant_dir(self, tenant: str) -> Path:
        return self.tenants_dir / _check_name(tenant, "tenant")

    def leaf(self, tenant: str, app: str) -> Path:
        return self.tenant_dir(tenant) / _check_name(app, "app")

    # ----------------------------------------------------------------------------------------- setup

    def setup(self) -> None:
        """Leave <base> for <base>/server (when <base> is ours), then enable controllers in <base> and
        <base>/tenants. Raises CgroupError when elasticd cannot leave <base> or create <base>/tenants.

        systemd may keep a ``.control`` child in a delegated cgroup (for ExecReload= etc.); it is
        systemd's and is never read, written or removed here.
        """
        if self.base_is_own:
            server = self.base / "server"
            try:
                server.mkdir(exist_ok=True)
                # Writing a pid moves its whole thread group (every thread of elasticd) at once.
                write_file(server / "cgroup.procs", str(os.getpid()))
            except OSError as exc:
                raise CgroupError(f"cannot move elasticd into {server}: {_describe(exc)}") from exc
            log.info("moved elasticd (pid %d) into %s", os.getpid(), server)
        base_has = _read_words(self.base / "cgroup.controllers") or frozenset()
        self._enable(self.base, base_has)
        try:
            self.tenants_dir.mkdir(exist_ok=True)
        except OSError as exc:
            raise CgroupError(f"cannot create {self.tenants_dir}: {_describe(exc)}") from exc
        self._enable(self.tenants_dir, self._available(self.tenants_dir, self.base))

    def _available(self, directory: Path, parent: Path) -> frozenset[str]:
        """What ``directory`` may enable for its children: its cgroup.controllers on the real kernel; in
        a fake tree (a plain directory, no such file) what we enabled in the parent."""
        words = _read_words(directory / "cgroup.controllers")
        if words is not None:
            return words
        return self._enabled.get(parent, frozenset())

    def _enable(self, directory: Path, available: frozenset[str]) -> frozenset[str]:
        wanted = [c for c in WANTED_CONTROLLERS if c in available]
        failed: dict[str, str] = {}
        enabled: set[str] = set()
        if wanted:
            try:
                write_file(directory / "cgroup.subtree_control", " ".join(f"+{c}" for c in wanted))
                enabled.update(wanted)
            except OSError as exc:
                log.debug("enabling %s in %s failed (%s); trying one by one", wanted, directory, exc)
                for controller in wanted:
                    try:
                        write_file(directory / "cgroup.subtree_control", f"+{controller}")
                        enabled.add(controller)
                    except OSError as one:
                        failed[controller] = self._explain_enable_error(directory, one)
        for controller in WANTED_CONTROLLERS:
            if controller in enabled:
                continue
            why = failed.get(controller, f"not offered in {directory / 'cgroup.controllers'}")
            self._report_missing(controller, directory, why)
        result = frozenset(enabled)
        self._enabled[directory] = result
        return result

    def _explain_enable_error(self, directory: Path, exc: OSError) -> str:
        text = _describe(exc)
        if exc.errno == errno.EBUSY:
            # The "no internal processes" rule: someone else's processes are still in this cgroup.
            pids = self._procs(directory)
            if pids:
                shown = " ".join(map(str, pids[:10]))
                text += f" (processes still in {directory}: {shown})"
        return f"enabling it failed: {text}"

    def _report_missing(self, controller: str, directory: Path, why: str) -> None:
        if controller in self.missing:
            return
        self.missing.append(controller)
        log.warning("cgroup controller %s is not available in %s (%s); its limits are skipped",
                    controller, directory, why)

    # ----------------------------------------------------------------------------------------- groups

    def ensure_tenant(self, tenant: str) -> Path:
        """Create the tenant group and enable controllers in it for its app leaves."""
        path = self.tenant_dir(tenant)
        path.mkdir(exist_ok=True)  # parents=False: setup() must have made <base>/tenants
        self.tenant_by_cgroup_id[path.stat().st_ino] = tenant
        self._enable(path, self._available(path, self.tenants_dir))
        return path

    def ensure_app(self, tenant: str, app: str, tenant_ready: bool = False) -> Path:
        """Create the tenant group (unless ``tenant_ready``: the caller just did) and the app's leaf; return the
        leaf. (A host of 10,000 apps made each tenant's group again for each of its apps: a mkdir, a read of
        cgroup.controllers and a write of cgroup.subtree_control per app, for nothing.)"""
        if not tenant_ready:
            self.ensure_tenant(tenant)
        path = self.leaf(tenant, app)
        path.mkdir(exist_ok=True)
        self.tenant_by_cgroup_id[path.stat().st_ino] = tenant
        return path

    def controllers_of(self, tenant: str) -> frozenset[str]:
        """The controllers the tenant group has, i.e. whose limit files can be written in it."""
        return self._available(self.tenant_dir(tenant), self.tenants_dir)

    def apply_limits(self, tenant: str, resources: Resources, roots: Sequence[str],
                     tenant_ready: bool = False) -> list[str]:
        """Write the tenant's limits (each activation that changed it). Returns this activation's problems; each
        is logged (a repeated write error, or a root on no block device, only the first time). ``tenant_ready``:
        the caller made its group just now (its controllers are the ones just enabled)."""
        try:
            path = self.tenant_dir(tenant) if tenant_ready else self.ensure_tenant(tenant)
        except OSError as exc:
            message = f"tenant {tenant}: cannot create its cgroup: {_describe(exc)}"
            log.warning("%s", message)
            return [message]
        controllers = self.controllers_of(tenant)
        problems: list[str] = []
        disks: list[str] = []
        stale: list[str] = []
        if "io" in controllers:
            disks, nowhere = disks_for_roots(roots, self.sys_root)
            if resources.io_read is not None or resources.io_write is not None:
                for root in nowhere:
                    message = (f"tenant {tenant}: io_bandwidth cannot apply to {root}: "
                               "it is on no block device (tmpfs, overlay, network or btrfs)")
                    problems.append(message)
                    if root not in self._no_disk_reported:
                        self._no_disk_reported.add(root)
                        log.warning("%s", message)
            # Disks limited earlier (by a previous activation or run) that hold no root now: lift them.
            with contextlib.suppress(OSError, UnicodeDecodeError):
                stale = io_max_limited((path / "io.max").read_text(encoding="ascii"))
        for name, value in limit_writes(resources, controllers, disks, stale):
            target = path / name
            try:
                write_file(target, value)
            except OSError as exc:
                message = f"cannot write {value!r} to {target}: {_describe(exc)}"
                problems.append(message)
                key = (tenant, name, exc.errno or 0)
                level = logging.DEBUG if key in self._logged_errors else logging.WARNING
                self._logged_errors.add(key)
                log.log(level, "%s", message)
        return problems

    def kill_leaf(self, tenant: str, app: str) -> bool:
        """SIGKILL every process in the leaf at once via cgroup.kill (kernel ≥ 5.14); False when the kernel
        has no cgroup.kill (the caller signals the pids itself) or the write fails."""
        target = self.leaf(tenant, app) / "cgroup.kill"
        if not target.exists():
            return False
        try:
            fd = os.open(target, os.O_WRONLY | os.O_CLOEXEC)  # never O_CREAT: a fake tree must not grow one
            try:
                os.write(fd, b"1")
            finally:
                os.close(fd)
        except OSError as exc:
            log.warning("cannot kill the processes of %s: %s", target.parent, _describe(exc))
            return False
        return True

    def remove_app(self, tenant: str, app: str) -> bool:
        """Remove the app's leaf (after its workers drained). False while processes remain (EBUSY)."""
        return self._remove(self.leaf(tenant, app))

    def remove_tenant(self, tenant: str) -> bool:
        """Remove the tenant group and any app leaves left in it. False while any still holds processes."""
        path = self.tenant_dir(tenant)
        ok = all([self._remove(child) for child in self._subdirs(path)])
        ok = self._remove(path) and ok
        if ok:
            self._enabled.pop(path, None)
        return ok

    def _remove(self, path: Path) -> bool:
        try:
            cgroup_id = path.stat().st_ino
            path.rmdir()
            self.tenant_by_cgroup_id.pop(cgroup_id, None)  # (not before: a group that stays holds a tenant's processes)
            return True
        except FileNotFoundError:
            return True
        except OSError as exc:
            if exc.errno != errno.ENOTEMPTY:
                if exc.errno == errno.EBUSY:
                    # Retried until it goes (activation.remove_dropped): said once, not at every try.
                    key = ("busy", str(path))
                    level = logging.DEBUG if key in self._logged_errors else logging.WARNING
                    self._logged_errors.add(key)
                    log.log(level, "cannot remove %s yet: processes or child groups remain (retrying)", path)
                else:
                    log.warning("cannot remove %s: %s", path, _describe(exc))
                return False
        # ENOTEMPTY only happens in a fake tree (see the module doc): there the interface files we wrote
        # are regular files. Remove those (names with a dot, like cpu.max), never directories, then retry.
        try:
            for entry in os.scandir(path):
                if "." in entry.name and entry.is_file(follow_symlinks=False):
                    os.unlink(entry.path)
            path.rmdir()
        except OSError as exc:
            log.warning("cannot remove %s: %s", path, _describe(exc))
            return False
        return True

    # ----------------------------------------------------------------------------------------- reading

    def _procs(self, directory: Path) -> list[int]:
        try:
            text = (directory / "cgroup.procs").read_text(encoding="ascii")
        except (OSError, UnicodeDecodeError):
            return []
        return [int(word) for word in text.split() if word.isdigit()]

    def populated(self, tenant: str, app: str) -> bool | None:
        """Whether processes remain in the leaf, from ``cgroup.events`` ("populated 0|1"); None when that
        file is absent (a fake tree: use procs_of). After cgroup.kill the processes die asynchronously, so
        remove_app fails with EBUSY until this turns False (the kernel also signals the change as a
        modification of cgroup.events, for inotify/poll)."""
        try:
            text = (self.leaf(tenant, app) / "cgroup.events").read_text(encoding="ascii")
        except (OSError, UnicodeDecodeError):
            return None
        for line in text.splitlines():
            key, _, value = line.partition(" ")
            if key == "populated":
                return value.strip() == "1"
        return None

    def procs_of(self, tenant: str, app: str) -> list[int]:
        """The pids in the app's leaf (empty when it does not exist)."""
        return self._procs(self.leaf(tenant, app))

    @staticmethod
    def _subdirs(path: Path) -> list[Path]:
        try:
            return sorted(Path(e.path) for e in os.scandir(path) if e.is_dir(follow_symlinks=False))
        except OSError:
            return []

    def inner_tenants(self) -> list[str]:
        """The tenant groups present (e.g. left by a previous run), sorted."""
        return _names(self._subdirs(self.tenants_dir))

    def inner_apps(self, tenant: str) -> list[str]:
        """The app leaves present in a tenant group, sorted."""
        return _names(self._subdirs(self.tenant_dir(tenant)))


def _names(paths: Iterable[Path]) -> list[str]:
    # Only names we could have made; anything else (e.g. an operator's own group) is not ours to touch.
    return [p.name for p in paths if NAME_RE.match(p.name)]
