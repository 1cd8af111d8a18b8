from __future__ import annotations

import os
import pwd
import secrets
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest
from harness import Daemon
from ruamel.yaml import YAML


@pytest.fixture
def daemons(tmp_path):
    """Make real elasticd daemons; each is stopped by pid at the end, and so is any worker it left behind."""
    made: list[Daemon] = []

    def make(tenants_yaml: str, **kwargs) -> Daemon:
        daemon = Daemon(tmp_path / f"d{len(made)}", tenants_yaml, **kwargs) if made else Daemon(
            tmp_path, tenants_yaml, **kwargs)
        made.append(daemon)
        return daemon

    yield make
    for daemon in made:
        daemon.stop()
        daemon.kill_leftovers()


EXAMPLE_CONFIG = Path(__file__).resolve().parent.parent / "etc" / "elastic.yaml.example"


def example_tenants() -> dict:
    """The shipped example's tenants: its main file's and its included files' (etc/elastic.d/*.yaml)."""
    tenants = dict(YAML(typ="safe").load(EXAMPLE_CONFIG.read_text()).get("tenants") or {})
    for path in sorted((EXAMPLE_CONFIG.parent / "elastic.d").glob("*.yaml")):
        tenants.update(YAML(typ="safe").load(path.read_text())["tenants"])
    return tenants


def example_users() -> list[str]:
    """The users the shipped example's tenants run as (the .deb's postinst and ./dev run create them)."""
    return sorted({str(t["user"]) for t in example_tenants().values() if t.get("user") is not None})


def example_roots() -> list[tuple[str, str]]:
    """(user, app root) of each of the shipped example's apps (packaging/demo-tenants and the postinst make them)."""
    return sorted((str(t["user"]), str(app["root"])) for t in example_tenants().values()
                  for app in t["apps"].values())


@pytest.fixture(scope="session")
def demo_users():
    """The example config's users, so that it loads here as on an installed host. Made as ./dev run makes
    them (system users, own group, no home) when missing, and removed at the end only if made here: a
    developer's own, from ./dev run, stay."""
    missing = []
    for name in example_users():
        try:
            pwd.getpwnam(name)
        except KeyError:
            missing.append(name)
    if missing and (os.geteuid() != 0 or shutil.which("useradd") is None):
        pytest.skip(f"the example config's users {missing} do not exist and only root can make them")
    made = []
    try:
        for name in missing:
            subprocess.run(["useradd", "--system", "--user-group", "--no-create-home", "--home-dir", "/nonexistent",
                            "--shell", "/usr/sbin/nologin", name], check=True, capture_output=True)
            made.append(name)
        yield example_users()
    finally:
        for name in made:
            subprocess.run(["userdel", name], capture_output=True)
            subprocess.run(["groupdel", name], capture_output=True)  # gone with the user where USERGROUPS_ENAB


@pytest.fixture
def users():
    """Throw-away system users, made on demand (``make()`` → name, uid, gid) and removed at the end."""
    made: list[str] = []

    def make() -> tuple[str, int, int]:
        name = f"elt{secrets.token_hex(4)}"
        subprocess.run(["useradd", "--system", "--user-group", "--no-create-home", "--shell", "/usr/sbin/nologin",
                        name], check=True, capture_output=True)
        made.append(name)
        out = subprocess.run(["id", "-u", name], check=True, capture_output=True, text=True).stdout
        gid = subprocess.run(["id", "-g", name], check=True, capture_output=True, text=True).stdout
        return name, int(out), int(gid)

    yield make
    for name in made:
        subprocess.run(["userdel", name], capture_output=True)
        subprocess.run(["groupdel", name], capture_output=True)  # gone with the user where USERGROUPS_ENAB


@pytest.fixture
def base():
    """A directory under /tmp that other users may traverse (pytest's own tmp_path is root's alone, 0700)."""
    path = Path(tempfile.mkdtemp(prefix="elasticd-users-", dir="/tmp"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)
