"""The example config, ./dev run and the .deb's postinst name the same demo users: a user added to the example
but not to the others would make the installed package (or ./dev run) refuse its own shipped config."""

from __future__ import annotations

import os
import pwd
import re
import stat
from pathlib import Path

import pytest
from conftest import example_roots, example_users

ROOT = Path(__file__).resolve().parent.parent


def _pairs(text: str) -> list[tuple[str, str]]:
    return sorted(tuple(pair.split(":", 1)) for pair in text.split())  # type: ignore[misc]


def test_dev_and_the_postinst_create_the_example_users_and_their_app_roots():
    script = re.search(r'^DEMO="([^"]*)"$', (ROOT / "packaging/demo-tenants").read_text(), re.MULTILINE)
    postinst = re.search(r"for pair in ([^;]*); do", (ROOT / "packaging/deb/debian/elasticd.postinst").read_text())
    assert script and postinst
    assert _pairs(script.group(1)) == _pairs(postinst.group(1)) == example_roots()
    assert sorted({user for user, _root in example_roots()}) == example_users()
    assert len(example_users()) >= 2  # every demo tenant runs as its own user
    dev = (ROOT / "dev").read_text()
    assert "packaging/demo-tenants" in dev  # ./dev setup runs it


@pytest.mark.skipif(os.geteuid() != 0, reason="only root makes system users: ./dev setup as another user cannot")
def test_the_example_configs_users_and_roots_exist_after_dev_setup():
    """./dev setup (so ./dev run and ./dev test) and the suite root's run-tests make them: the example starts
    without "app root ... is not a directory", its workers in their roots, as their users."""
    for user, root in example_roots():
        entry = pwd.getpwnam(user)  # KeyError: ./dev setup did not run (as root) on this machine
        info = os.stat(root)
        assert stat.S_ISDIR(info.st_mode) and info.st_uid == entry.pw_uid, (root, user)
        assert stat.S_IMODE(info.st_mode) & 0o007 == 0, root  # the tenant's: another tenant may not read it


def test_the_postinst_creates_users_before_debhelper_starts_the_unit():
    text = (ROOT / "packaging/deb/debian/elasticd.postinst").read_text()
    assert text.index("adduser --system") < text.index("#DEBHELPER#")
    assert re.search(r"^Depends: adduser,", (ROOT / "packaging/deb/debian/control").read_text(), re.MULTILINE)


def _unit(name: str) -> dict[str, list[str]]:
    """A shipped unit's directives, KEY → its values in order (comments and sections dropped)."""
    found: dict[str, list[str]] = {}
    for line in (Path(__file__).resolve().parent.parent / "packaging" / "systemd" / name).read_text().splitlines():
        if "=" in line and not line.startswith(("#", "[")):
            key, value = line.split("=", 1)
            found.setdefault(key, []).append(value)
    return found


def test_the_keepers_units_and_elasticds_agree_on_the_socket_and_the_workers_view():
    """One socket path in the three units; the keeper's unit is not tied to elasticd's (a restart of a crashed
    elasticd must not restart the keeper, whose end is its workers'); the workers (the keeper's unit's processes)
    keep the hardening they had as elasticd's children; what a crash must not remove is kept."""
    elasticd, keeper, socket_unit = (_unit(n) for n in ("elasticd.service", "elasticd-keeper.service",
                                                        "elasticd-keeper.socket"))
    [path] = socket_unit["ListenSequentialPacket"]
    assert socket_unit["SocketMode"] == ["0600"]
    assert f"--keeper {path}" in elasticd["ExecStart"][0]
    assert f"--socket {path} --place" in keeper["ExecStart"][0]
    assert "elasticd-keeper.socket" in elasticd["Wants"][0] and "elasticd-keeper.socket" in elasticd["After"][0]
    assert not {"PartOf", "BindsTo", "Requisite"} & (set(keeper) | set(elasticd))
    assert "Restart" not in keeper and keeper["Delegate"] == ["yes"] and keeper["OOMPolicy"] == ["continue"]
    assert elasticd["RuntimeDirectoryPreserve"] == ["restart"]
    # (both ways: systemd 252 joins only along the started unit's own JoinsNamespaceOf=)
    assert elasticd["JoinsNamespaceOf"] == ["elasticd-keeper.service"] and keeper["JoinsNamespaceOf"] == [
        "elasticd.service"]
    assert elasticd["StartLimitBurst"] and elasticd["StartLimitIntervalSec"]
    hardening = ("CapabilityBoundingSet", "NoNewPrivileges", "RestrictNamespaces", "ProtectSystem", "PrivateMounts",
                 "PrivateTmp", "PrivateDevices", "ProtectKernelTunables", "ProtectKernelModules", "ProtectKernelLogs",
                 "ProtectClock", "ProtectHostname", "LockPersonality", "RestrictRealtime", "RestrictAddressFamilies",
                 "SystemCallArchitectures", "SystemCallFilter", "SystemCallErrorNumber", "UMask")
    assert {key: keeper.get(key) for key in hardening} == {key: elasticd.get(key) for key in hardening}
    assert keeper["LimitNOFILE"] == elasticd["LimitNOFILE"]  # (the workers inherit it)
