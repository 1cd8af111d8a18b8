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
