from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from elasticd.cgroup import mode
from elasticd.cgroup.mode import DelegationProbe, ModeDecision, decide, probe
from elasticd.config.model import CgroupSettings

BASE = Path("/sys/fs/cgroup/x")
USABLE = DelegationProbe(BASE, True, True, True, frozenset({"cpu", "memory"}), None)
NOT_WRITABLE = DelegationProbe(BASE, False, False, True, frozenset(), "/sys/fs/cgroup/x is not writable")
NOT_DELEGATED = DelegationProbe(BASE, True, True, False, frozenset(),
                      "elasticd's own cgroup /sys/fs/cgroup/x is not delegated (...)")
NO_BASE = DelegationProbe(None, True, False, False, frozenset(), "no cgroup v2 file system is mounted")
NO_REASON = DelegationProbe(None, True, False, False, frozenset(), None)


@pytest.mark.parametrize(
    ("mode_", "facts", "enforce", "refuse", "warning"),
    [
        ("off", USABLE, False, None, None),
        ("off", NOT_WRITABLE, False, None, None),
        ("auto", USABLE, True, None, None),
        ("required", USABLE, True, None, None),
        ("required", NOT_WRITABLE, False,
         "cgroups.mode is required but /sys/fs/cgroup/x is not writable", None),
        ("required", NOT_DELEGATED, False, "is not delegated", None),
        ("required", NO_BASE, False, "no cgroup v2 file system", None),
        ("required", NO_REASON, False, "no usable cgroup v2 base", None),
        ("auto", NOT_WRITABLE, False, None, "/sys/fs/cgroup/x is not writable"),
        ("auto", NOT_DELEGATED, False, None, "is not delegated"),
        ("auto", NO_BASE, False, None, "no cgroup v2 file system"),
    ],
)
def test_decide(mode_: str, facts: DelegationProbe, enforce: bool, refuse: str | None, warning: str | None) -> None:
    decision = decide(mode_, facts)
    assert decision.enforce is enforce
    if refuse is None:
        assert decision.refuse is None
    else:
        assert decision.refuse is not None and refuse in decision.refuse
    if warning is None:
        assert decision.warning is None
    else:
        assert decision.warning is not None and warning in decision.warning
        assert "without cgroup enforcement" in decision.warning


def test_decide_usable_is_plain() -> None:
    assert decide("auto", USABLE) == ModeDecision(enforce=True, refuse=None, warning=None)


def test_decide_rejects_unknown_modes() -> None:
    with pytest.raises(ValueError):
        decide("sometimes", USABLE)


# --------------------------------------------------------------------------------------------- probe


def _fake_base(path: Path, controllers: str = "cpu memory pids io") -> Path:
    path.mkdir(parents=True)
    (path / "cgroup.controllers").write_text(controllers + "\n")
    (path / "cgroup.procs").write_text("")
    return path


def _fake_proc(tmp_path: Path, mountinfo: str, cgroup: str) -> str:
    proc = tmp_path / "proc"
    (proc / "self").mkdir(parents=True)
    (proc / "self" / "mountinfo").write_text(mountinfo)
    (proc / "self" / "cgroup").write_text(cgroup)
    return str(proc)


def test_probe_explicit_fake_tree_is_usable(tmp_path: Path) -> None:
    base = _fake_base(tmp_path / "cg")
    facts = probe(CgroupSettings(mode="required", path=str(base)), proc=str(tmp_path / "noproc"))
    assert facts == DelegationProbe(base, False, True, True, frozenset({"cpu", "memory", "pids", "io"}), None)
    assert decide("required", facts).enforce


def test_probe_explicit_missing_path(tmp_path: Path) -> None:
    missing = tmp_path / "nope"
    facts = probe(CgroupSettings(path=str(missing)), proc=str(tmp_path / "noproc"))
    assert not facts.usable
    assert facts.reason is not None and str(missing) in facts.reason
    assert str(missing) in (decide("required", facts).refuse or "")


def test_probe_explicit_plain_directory_is_not_a_cgroup(tmp_path: Path) -> None:
    (tmp_path / "plain").mkdir()
    facts = probe(CgroupSettings(path=str(tmp_path / "plain")), proc=str(tmp_path / "noproc"))
    assert not facts.delegated and "is not a cgroup" in (facts.reason or "")


def test_probe_explicit_not_writable(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    base = _fake_base(tmp_path / "cg")
    # We may run as root, where os.access always allows writing: fake the access check instead.
    monkeypatch.setattr(mode, "_access", lambda path, m: Path(path).name != "cgroup.procs")
    facts = probe(CgroupSettings(path=str(base)), proc=str(tmp_path / "noproc"))
    assert (facts.writable, facts.delegated) == (False, True)
    assert decide("required", facts).refuse == f"cgroups.mode is required but {base} is not writable"


def test_probe_explicit_own_cgroup_is_marked_own(tmp_path: Path) -> None:
    mount = tmp_path / "cgroup2"
    base = _fake_base(mount / "system.slice" / "elasticd.service")
    proc = _fake_proc(tmp_path, f"41 31 0:38 / {mount} rw - cgroup2 cgroup2 rw\n",
                      "0::/system.slice/elasticd.service\n")
    facts = probe(CgroupSettings(path=str(base)), proc=proc)
    assert facts.base_is_own and facts.usable


def test_probe_own_root_cgroup_on_hybrid_host_is_never_used(tmp_path: Path) -> None:
    proc = _fake_proc(
        tmp_path,
        "41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw\n",
        "9:name=systemd:/\n4:memory:/process_api/abc\n0::/",
    )
    facts = probe(CgroupSettings(), proc=proc)
    assert facts.base == Path("/sys/fs/cgroup/unified") and facts.base_is_own
    assert not facts.delegated and not facts.usable
    assert "root cgroup" in (facts.reason or "")
    decision = decide("auto", facts)
    assert not decision.enforce and decision.warning and "root cgroup" in decision.warning


def test_probe_without_cgroup2(tmp_path: Path) -> None:
    proc = _fake_proc(tmp_path, "31 23 0:28 / /sys/fs/cgroup rw - tmpfs tmpfs rw\n", "1:cpu:/\n")
    facts = probe(CgroupSettings(), proc=proc)
    assert facts.base is None and "no cgroup v2" in (facts.reason or "")


def _own_setup(tmp_path: Path) -> tuple[Path, str]:
    mount = tmp_path / "cgroup2"
    own = _fake_base(mount / "user.slice" / "session-2.scope")
    proc = _fake_proc(tmp_path, f"26 28 0:23 / {mount} rw - cgroup2 cgroup2 rw,nsdelegate\n",
                      "0::/user.slice/session-2.scope\n")
    return own, proc


def test_probe_own_cgroup_without_delegation_evidence(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    own, proc = _own_setup(tmp_path)

    def no_xattr(path: object, name: str) -> bytes:
        raise OSError(errno.ENODATA, "No data available")

    monkeypatch.setattr(os, "getxattr", no_xattr)
    facts = probe(CgroupSettings(), proc=proc)
    assert facts.base == own and facts.base_is_own and facts.writable and not facts.delegated
    assert facts.reason == (f"elasticd's own cgroup {own} is not delegated "
                            "(run it under systemd with Delegate=yes, or set server.cgroups.path)")


@pytest.mark.parametrize("xattr", ["trusted.delegate", "user.delegate"])
def test_probe_own_cgroup_delegated_by_systemd(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                               xattr: str) -> None:
    own, proc = _own_setup(tmp_path)

    def getxattr(path: object, name: str) -> bytes:
        if Path(str(path)) == own and name == xattr:
            return b"1"
        raise OSError(errno.ENODATA, "No data available")

    monkeypatch.setattr(os, "getxattr", getxattr)
    facts = probe(CgroupSettings(), proc=proc)
    assert facts == DelegationProbe(own, True, True, True, frozenset({"cpu", "memory", "pids", "io"}), None)


def test_probe_own_cgroup_xattr_zero_is_not_delegation(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _, proc = _own_setup(tmp_path)
    monkeypatch.setattr(os, "getxattr", lambda path, name: b"0")
    assert not probe(CgroupSettings(), proc=proc).delegated


@pytest.mark.parametrize(("delegated", "writable", "reason"), [
    (True, True, None),
    (False, True, "the keeper's cgroup {base} is not delegated (elasticd-keeper.service needs Delegate=yes)"),
    (True, False, "the keeper's cgroup {base} is not writable"),
])
def test_probe_of_the_keepers_unit_wants_its_delegation(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                        delegated: bool, writable: bool, reason: str | None) -> None:
    """elasticd --keeper: the base is the keeper's unit's cgroup, used on systemd's word as elasticd's own is; a base
    the configuration names wins over it."""
    base = _fake_base(tmp_path / "cgroup2" / "system.slice" / "elasticd-keeper.service")

    def getxattr(path: object, name: str) -> bytes:
        if delegated and Path(str(path)) == base and name == "trusted.delegate":
            return b"1"
        raise OSError(errno.ENODATA, "No data available")

    monkeypatch.setattr(os, "getxattr", getxattr)
    monkeypatch.setattr(mode, "_access", lambda path, m: writable or Path(path).name != "cgroup.procs")
    facts = probe(CgroupSettings(), proc=str(tmp_path / "noproc"), keeper_base=str(base))
    assert (facts.base, facts.base_is_own, facts.usable) == (base, False, reason is None)
    assert facts.reason == (reason.format(base=base) if reason else None)
    named = _fake_base(tmp_path / "named")
    assert probe(CgroupSettings(path=str(named)), proc=str(tmp_path / "noproc"), keeper_base=str(base)).base == named
    refused = probe(CgroupSettings(), proc=str(tmp_path / "noproc"), keeper_base=str(base),
                    keeper_refused="Read-only file system")
    assert not refused.usable
    assert refused.reason == (reason.format(base=base) if not delegated else
                              f"the keeper's cgroup {base} is not writable from its unit (Read-only file system)")
