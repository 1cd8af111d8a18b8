"""Whether to enforce limits: facts about the base cgroup (probed) + ``server.cgroups.mode`` → a decision.

``decide`` is pure; ``probe`` gathers the facts. The rule that matters most: elasticd's own cgroup is used
only with evidence that it was delegated to us (systemd's ``Delegate=yes``). Started from a shell on a
workstation, its own cgroup is a systemd session scope; moving processes or enabling controllers there
would fight systemd, so it is "not delegated" and ``auto`` serves unenforced.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from elasticd.config.model import CgroupSettings

from .discovery import cgroup2_mounts, own_cgroup, parse_proc_cgroup

__all__ = ["DelegationProbe", "ModeDecision", "decide", "is_delegated_xattr", "probe"]

# systemd ≥ 251 marks a cgroup it delegated (Delegate=yes) with this xattr set to "1": trusted.* from the
# system manager (readable only with CAP_SYS_ADMIN), user.* from a user manager.
_DELEGATE_XATTRS = ("trusted.delegate", "user.delegate")
_HOW_TO = "run it under systemd with Delegate=yes, or set server.cgroups.path"


@dataclass(frozen=True, slots=True)
class DelegationProbe:
    base: Path | None
    base_is_own: bool
    writable: bool
    delegated: bool
    controllers: frozenset[str]
    reason: str | None  # why it is not usable, for humans; None when usable

    @property
    def usable(self) -> bool:
        return self.base is not None and self.writable and self.delegated


@dataclass(frozen=True, slots=True)
class ModeDecision:
    enforce: bool
    refuse: str | None  # set: do not start, with this message
    warning: str | None  # set: log once, then serve


def decide(mode: str, probe: DelegationProbe) -> ModeDecision:
    """``off``: never enforce. Usable: enforce. Unusable: ``required`` refuses, ``auto`` warns and serves."""
    if mode == "off":
        return ModeDecision(enforce=False, refuse=None, warning=None)
    if mode not in ("auto", "required"):
        raise ValueError(f"unknown cgroups mode {mode!r}")
    if probe.usable:
        return ModeDecision(enforce=True, refuse=None, warning=None)
    why = probe.reason or "no usable cgroup v2 base was found"
    if mode == "required":
        return ModeDecision(enforce=False, refuse=f"cgroups.mode is required but {why}", warning=None)
    return ModeDecision(
        enforce=False,
        refuse=None,
        warning=f"tenant limits are NOT enforced: {why}; "
                "serving without cgroup enforcement (cgroups.mode is auto)",
    )


# --------------------------------------------------------------------------------------------- the shell


def _access(path: Path, mode: int) -> bool:
    # Effective ids: what the kernel checks on open(2), not the real uid os.access uses by default.
    if os.access in os.supports_effective_ids:
        return os.access(path, mode, effective_ids=True)
    return os.access(path, mode)


def is_delegated_xattr(path: Path) -> bool:
    for name in _DELEGATE_XATTRS:
        try:
            if os.getxattr(path, name) == b"1":
                return True
        except OSError:  # ENODATA (absent), EPERM (trusted.* unprivileged), ENOTSUP
            continue
    return False


def _writable(base: Path) -> bool:
    """Write access to what we write in the base: new children, cgroup.procs, cgroup.subtree_control.

    A fake tree may lack cgroup.subtree_control until we write it; then the directory's access decides.
    """
    if not (_access(base, os.W_OK | os.X_OK) and _access(base / "cgroup.procs", os.W_OK)):
        return False
    subtree = base / "cgroup.subtree_control"
    return not subtree.exists() or _access(subtree, os.W_OK)


def _controllers(base: Path) -> frozenset[str]:
    try:
        return frozenset((base / "cgroup.controllers").read_text(encoding="ascii").split())
    except (OSError, UnicodeDecodeError):
        return frozenset()


def _read(path: Path) -> str | None:
    try:
        return path.read_text(encoding="utf-8", errors="surrogateescape")
    except OSError:
        return None


def _same(a: Path, b: Path) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


def probe(settings: CgroupSettings, proc: str = "/proc", keeper_base: str | None = None,
          keeper_refused: str | None = None) -> DelegationProbe:
    """The facts about the base cgroup ``settings`` names, else the keeper's unit's (``keeper_base``: elasticd runs
    with ``--keeper``; ``keeper_refused``: why the keeper could not take it), else our own cgroup."""
    mountinfo = _read(Path(proc, "self", "mountinfo"))
    proc_cgroup = _read(Path(proc, "self", "cgroup"))
    own = own_cgroup(mountinfo, proc_cgroup) if mountinfo is not None and proc_cgroup is not None else None
    if settings.path is not None:
        return _probe_explicit(Path(settings.path), own)
    if keeper_base is not None:
        return _probe_keeper(Path(keeper_base), keeper_refused)
    return _probe_own(own, mountinfo, proc_cgroup)


def _probe_keeper(base: Path, refused: str | None) -> DelegationProbe:
    """The cgroup of the keeper's unit (elasticd-keeper.service), which the keeper moved out of into ``keeper/``: used
    on the same evidence as elasticd's own, systemd's delegation, and only if the keeper could write there (it puts
    each worker in its leaf): a unit with ProtectControlGroups= has a read-only cgroupfs, elasticd's unit not."""
    unit = "elasticd-keeper.service"
    if not base.is_dir():
        return DelegationProbe(base, False, False, False, frozenset(), f"the keeper's cgroup {base} does not exist")
    controllers = _controllers(base)
    delegated = is_delegated_xattr(base)
    writable = refused is None and _writable(base)
    if not delegated:
        reason = f"the keeper's cgroup {base} is not delegated ({unit} needs Delegate=yes)"
    elif not writable:
        reason = f"the keeper's cgroup {base} is not writable" + (f" from its unit ({refused})" if refused else "")
    else:
        reason = None
    return DelegationProbe(base, False, writable, delegated, controllers, reason)


def _probe_explicit(base: Path, own: Path | None) -> DelegationProbe:
    """An operator-given base is trusted to be delegated if it looks like a cgroup (or a fake tree)."""
    # Given our own cgroup explicitly, we must still leave it for <base>/server: the kernel refuses to
    # enable controllers for children of a cgroup that holds processes ("no internal processes").
    is_own = own is not None and _same(base, own)
    if not base.is_dir():
        return DelegationProbe(base, is_own, False, False, frozenset(),
                     f"server.cgroups.path {base} does not exist or is not a directory")
    controllers = _controllers(base)
    if not ((base / "cgroup.controllers").is_file() and (base / "cgroup.procs").is_file()):
        return DelegationProbe(base, is_own, False, False, controllers,
                     f"server.cgroups.path {base} is not a cgroup (no cgroup.controllers and cgroup.procs)")
    if not _writable(base):
        return DelegationProbe(base, is_own, False, True, controllers, f"{base} is not writable")
    return DelegationProbe(base, is_own, True, True, controllers, None)


def _probe_own(own: Path | None, mountinfo: str | None, proc_cgroup: str | None) -> DelegationProbe:
    if mountinfo is None or not cgroup2_mounts(mountinfo):
        return DelegationProbe(None, True, False, False, frozenset(),
                     f"no cgroup v2 file system is mounted (set server.cgroups.path, or {_HOW_TO})")
    v2_path = parse_proc_cgroup(proc_cgroup or "")
    if own is None or v2_path is None:
        return DelegationProbe(None, True, False, False, frozenset(),
                     "elasticd's own cgroup v2 path cannot be found in /proc/self/cgroup and mountinfo")
    controllers = _controllers(own)
    if v2_path == "/":
        # The root cgroup is never ours to manage (and is exempt from rules we rely on).
        return DelegationProbe(own, True, False, False, controllers,
                     f"elasticd runs in the root cgroup {own}, which it never uses ({_HOW_TO})")
    delegated = is_delegated_xattr(own)
    writable = own.is_dir() and _writable(own)
    if not delegated:
        reason = f"elasticd's own cgroup {own} is not delegated ({_HOW_TO})"
    elif not writable:
        reason = f"elasticd's own cgroup {own} is not writable"
    else:
        reason = None
    return DelegationProbe(own, True, writable, delegated, controllers, reason)
