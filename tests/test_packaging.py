"""The example config, ./dev run and the .deb's postinst name the same demo users: a user added to the example
but not to the others would make the installed package (or ./dev run) refuse its own shipped config."""

from __future__ import annotations

import re
from pathlib import Path

from conftest import example_users

ROOT = Path(__file__).resolve().parent.parent


def test_dev_run_and_the_postinst_create_the_example_users():
    dev = re.search(r"^DEMO_USERS=\(([^)]*)\)$", (ROOT / "dev").read_text(), re.MULTILINE)
    postinst = re.search(r"for user in ([^;]*); do", (ROOT / "packaging/deb/debian/elasticd.postinst").read_text())
    assert dev and postinst
    assert sorted(dev.group(1).split()) == sorted(postinst.group(1).split()) == example_users()
    assert len(example_users()) >= 2  # every demo tenant runs as its own user


def test_the_postinst_creates_users_before_debhelper_starts_the_unit():
    text = (ROOT / "packaging/deb/debian/elasticd.postinst").read_text()
    assert text.index("adduser --system") < text.index("#DEBHELPER#")
    assert re.search(r"^Depends: adduser,", (ROOT / "packaging/deb/debian/control").read_text(), re.MULTILINE)
