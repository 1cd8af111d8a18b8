"""cgroup v2 (ADR-0010): discovery, the enforcement decision, limit values, the subtree elasticd manages."""

from __future__ import annotations

from .discovery import own_cgroup, parse_mountinfo, parse_proc_cgroup, read_own_cgroup
from .disks import disk_of, disk_of_device, disks_for_roots
from .limits import WANTED_CONTROLLERS, limit_writes
from .mode import DelegationProbe, ModeDecision, decide, probe
from .tree import CgroupError, CgroupTree

__all__ = [
    "WANTED_CONTROLLERS",
    "CgroupError",
    "CgroupTree",
    "DelegationProbe",
    "ModeDecision",
    "decide",
    "disk_of",
    "disk_of_device",
    "disks_for_roots",
    "limit_writes",
    "own_cgroup",
    "parse_mountinfo",
    "parse_proc_cgroup",
    "probe",
    "read_own_cgroup",
]
