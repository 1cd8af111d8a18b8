from __future__ import annotations

import os
from pathlib import Path

import pytest

from elasticd.cgroup import disks
from elasticd.cgroup.disks import disk_of, disk_of_device, disks_for_roots

SDA = "devices/pci0000:00/0000:00:1f.2/ata1/host0/target0:0:0/0:0:0:0/block/sda"
VDA = "devices/pci0000:00/0000:00:04.0/virtio1/block/vda"
NVME = "devices/pci0000:00/0000:00:1d.0/0000:3d:00.0/nvme/nvme0/nvme0n1"


def _device(sys: Path, rel: str, dev: str, partition: int | None = None) -> None:
    """A device directory as the kernel has it, and its /sys/dev/block/MAJ:MIN symlink (relative)."""
    directory = sys / rel
    directory.mkdir(parents=True)
    (directory / "dev").write_text(dev + "\n")
    if partition is not None:
        (directory / "partition").write_text(f"{partition}\n")
    link = sys / "dev" / "block" / dev
    link.parent.mkdir(parents=True, exist_ok=True)
    link.symlink_to(os.path.join("..", "..", rel))


@pytest.fixture
def fake_sys(tmp_path: Path) -> str:
    sys = tmp_path / "sys"
    _device(sys, SDA, "8:0")
    _device(sys, f"{SDA}/sda1", "8:1", partition=1)
    _device(sys, VDA, "254:0")
    _device(sys, NVME, "259:0")
    _device(sys, f"{NVME}/nvme0n1p2", "259:2", partition=2)
    return str(sys)


@pytest.mark.parametrize(
    ("major", "minor", "disk"),
    [
        (8, 1, "8:0"),  # partition -> its disk
        (8, 0, "8:0"),
        (254, 0, "254:0"),  # a whole virtio disk
        (259, 2, "259:0"),  # nvme0n1p2 -> nvme0n1
        (259, 7, None),  # no sysfs entry
        (0, 42, None),  # tmpfs, overlay, btrfs subvolume
    ],
)
def test_disk_of_device(fake_sys: str, major: int, minor: int, disk: str | None) -> None:
    assert disk_of_device(major, minor, fake_sys) == disk


def test_disks_for_roots(fake_sys: str, tmp_path: Path) -> None:
    srv = tmp_path / "srv"
    (srv / "acme").mkdir(parents=True)
    (srv / "shop").mkdir()
    devices = {
        str(srv / "acme"): os.makedev(8, 1),
        str(srv / "shop"): os.makedev(259, 2),
        str(srv): os.makedev(8, 1),
        str(tmp_path): os.makedev(0, 50),
    }
    seen: list[str] = []

    def device_of(path: str) -> int:
        seen.append(path)
        return devices[path]

    roots = [str(srv / "shop"), str(srv / "acme"), str(srv / "not" / "yet"), str(tmp_path / "tmpfs-app")]
    assert disks_for_roots(roots, fake_sys, device_of=device_of) == (
        ["8:0", "259:0"],
        [str(tmp_path / "tmpfs-app")],
    )
    # A root that does not exist yet is looked up at its nearest existing parent.
    assert str(srv) in seen and str(tmp_path) in seen


def test_disk_of_stats_the_path(fake_sys: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(disks, "_device_of", lambda path: os.makedev(8, 1))
    assert disk_of("/anything", fake_sys) == "8:0"
    monkeypatch.setattr(disks, "_device_of", lambda path: os.makedev(0, 30))
    assert disk_of("/anything", fake_sys) is None


def test_disk_of_a_real_path_does_not_crash(tmp_path: Path) -> None:
    result = disk_of(str(tmp_path))
    assert result is None or ":" in result
