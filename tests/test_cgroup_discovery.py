from __future__ import annotations

from pathlib import Path

import pytest

from elasticd.cgroup.discovery import (
    cgroup2_mounts,
    own_cgroup,
    parse_mountinfo,
    parse_proc_cgroup,
    read_own_cgroup,
)

PURE_V2 = """\
22 28 0:21 / /sys rw,nosuid,nodev,noexec,relatime shared:7 - sysfs sysfs rw
26 22 0:23 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime shared:9 - cgroup2 cgroup2 rw,nsdelegate
28 1 253:0 / / rw,relatime shared:1 - ext4 /dev/mapper/root rw
"""

HYBRID = """\
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
40 31 0:37 / /sys/fs/cgroup/systemd rw,relatime - cgroup cgroup rw,name=systemd
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
"""

ESCAPED = "50 28 0:40 / /mnt/my\\040cgroups rw,relatime shared:30 - cgroup2 none rw\n"

# A container without a cgroup namespace: the host's /docker/abc sub-tree bind-mounted at /sys/fs/cgroup.
BIND = "60 50 0:23 /docker/abc /sys/fs/cgroup ro,nosuid - cgroup2 cgroup rw\n"

HYBRID_CGROUP = "9:name=systemd:/\n4:memory:/process_api/abc\n0::/"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (PURE_V2, "/sys/fs/cgroup"),
        (HYBRID, "/sys/fs/cgroup/unified"),
        (ESCAPED, "/mnt/my cgroups"),
        (BIND, "/sys/fs/cgroup"),
        ("", None),
        ("31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755\n", None),
        ("garbage\n", None),
    ],
)
def test_parse_mountinfo(text: str, expected: str | None) -> None:
    assert parse_mountinfo(text) == expected


def test_cgroup2_mounts_keeps_the_root_field() -> None:
    assert cgroup2_mounts(BIND) == [("/sys/fs/cgroup", "/docker/abc")]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("0::/system.slice/elasticd.service\n", "/system.slice/elasticd.service"),
        (HYBRID_CGROUP, "/"),
        ("12:pids:/user.slice\n0::/user.slice/user-1000.slice/session-2.scope\n",
         "/user.slice/user-1000.slice/session-2.scope"),
        ("0::/system.slice/gone.service (deleted)\n", "/system.slice/gone.service"),
        ("9:name=systemd:/\n4:memory:/x\n", None),  # pure v1: no v2 line
        ("", None),
    ],
)
def test_parse_proc_cgroup(text: str, expected: str | None) -> None:
    assert parse_proc_cgroup(text) == expected


@pytest.mark.parametrize(
    ("mountinfo", "cgroup", "expected"),
    [
        (PURE_V2, "0::/system.slice/elasticd.service\n", "/sys/fs/cgroup/system.slice/elasticd.service"),
        (HYBRID, HYBRID_CGROUP, "/sys/fs/cgroup/unified"),
        (ESCAPED, "0::/a b\n", "/mnt/my cgroups/a b"),
        (BIND, "0::/docker/abc/inner\n", "/sys/fs/cgroup/inner"),
        (BIND, "0::/elsewhere\n", None),  # not visible under the bind mount
        (HYBRID.replace("cgroup2 cgroup2", "tmpfs tmpfs"), HYBRID_CGROUP, None),
        (PURE_V2, "1:cpu:/\n", None),
    ],
)
def test_own_cgroup(mountinfo: str, cgroup: str, expected: str | None) -> None:
    result = own_cgroup(mountinfo, cgroup)
    assert result == (Path(expected) if expected is not None else None)


def test_read_own_cgroup_from_a_fake_proc(tmp_path: Path) -> None:
    (tmp_path / "self").mkdir()
    (tmp_path / "self" / "mountinfo").write_text(HYBRID)
    (tmp_path / "self" / "cgroup").write_text("0::/x.slice/y.service\n")
    assert read_own_cgroup(str(tmp_path)) == Path("/sys/fs/cgroup/unified/x.slice/y.service")


def test_read_own_cgroup_without_proc(tmp_path: Path) -> None:
    assert read_own_cgroup(str(tmp_path / "nothing")) is None
