"""A group's program must be in its isolated tenant's view (config/programs.py): refused at load with its key, its
line, the path and what the view shows instead. The user is ``nobody``; the paths are this test's own (its
tmp_path lies under /tmp, so an app root there is shown where the host has it, as bubblewrap binds it over the
tenant's own /tmp)."""

from __future__ import annotations

import os
import secrets
import shutil
from pathlib import Path

import pytest

import elasticd.config.isolation as isolation
from elasticd.config import ConfigError, parse_config

pytestmark = pytest.mark.skipif(not Path(isolation.BWRAP).exists(), reason="bubblewrap is not installed")


def _config(tmp_path: Path, group: str, tenant_extra: str = "") -> str:
    """The group's mapping is on line 12."""
    (tmp_path / "a").mkdir(exist_ok=True)
    return (f"server:\n  runtime_dir: {tmp_path}/run\n  tmp_dir: {tmp_path}/tt\ntenants:\n  acme:\n    user: nobody\n"
            f"{tenant_extra}    apps:\n      shop:\n        domains: [shop.localhost]\n        root: {tmp_path}/a\n"
            f"        groups:\n          main: {group}\n")


def _errors(text: str) -> list[str]:
    with pytest.raises(ConfigError) as info:
        parse_config(text)
    return [str(issue) for issue in info.value.issues]


def _venv(at: Path, home: str = "/usr/bin") -> Path:
    (at / "bin").mkdir(parents=True)
    (at / "bin" / "python").symlink_to("/usr/bin/python3")
    (at / "pyvenv.cfg").write_text(f"home = {home}\ninclude-system-site-packages = false\n")
    (at / "lib" / "python3.11" / "site-packages").mkdir(parents=True)
    return at / "bin" / "python"


@pytest.fixture
def host_tmp():
    """A directory in the host's /tmp outside pytest's (where an operator's venv under /tmp would be)."""
    path = Path("/tmp") / f"elasticd-venv-{secrets.token_hex(4)}"
    path.mkdir()
    yield path
    shutil.rmtree(path, ignore_errors=True)


def test_a_venv_in_the_hosts_tmp_is_refused_naming_what_the_tenant_sees_there(tmp_path, host_tmp):
    python = _venv(host_tmp / "venv")
    relative = python.relative_to("/tmp")
    errors = _errors(_config(tmp_path, f'{{command: ["{{python}}", app.py], python: {python}}}'))
    assert errors == [
        f"tenants.acme.apps.shop.groups.main.python (line 12): {python} is not in the tenant's view: its /tmp is a "
        f"directory of its own ({tmp_path}/tt/acme/tmp), which holds no {relative}: its workers could not start "
        "(\"No such file or directory\"). Put it under the app's root, or name its directory in isolation.read_only"]


def test_the_answer_is_the_same_whether_the_checker_sees_the_file_or_not(tmp_path):
    # (as the unit's ExecStartPre= does, whose /tmp is private: the venv is not there at all)
    errors = _errors(_config(tmp_path, "{command: [x], python: /tmp/no-such-venv/bin/python}"))
    assert errors[0].startswith("tenants.acme.apps.shop.groups.main.python (line 12): /tmp/no-such-venv/bin/python "
                                f"is not in the tenant's view: its /tmp is a directory of its own ({tmp_path}/tt/acme")


def test_a_venv_in_the_tenants_own_var_tmp_or_in_its_root_is_fine(tmp_path):
    _venv(tmp_path / "tt" / "acme" / "var-tmp" / "venv")
    parse_config(_config(tmp_path, "{command: [x], python: /var/tmp/venv/bin/python}"))
    python = _venv(tmp_path / "a" / ".venv")
    parse_config(_config(tmp_path, f"{{command: [x], python: {python}}}"))


def test_a_command_outside_the_view_is_refused_naming_what_it_shows(tmp_path):
    errors = _errors(_config(tmp_path, "{command: [/srv/other/bin/gunicorn, app:app]}"))
    assert errors == [
        "tenants.acme.apps.shop.groups.main.command[0] (line 12): /srv/other/bin/gunicorn is not in the tenant's "
        f"view, which shows of the host only the system (/usr, /etc, /opt, /bin, /lib…), its app roots "
        f"({tmp_path}/a): its workers could not start (\"No such file or directory\"). Put it under the app's root, "
        "or name its directory in isolation.read_only"]


def test_read_only_makes_a_shared_runtime_part_of_the_view(tmp_path):
    shared = tmp_path / "shared"
    python = _venv(shared / "venv")
    parse_config(_config(tmp_path, f"{{command: [x], python: {python}}}",
                         f"    isolation: {{read_only: [{shared}]}}\n"))


def test_a_venv_made_from_an_interpreter_the_view_hides_is_refused(tmp_path):
    python = _venv(tmp_path / "a" / ".venv", home="/root/.pyenv/versions/3.12.1/bin")
    errors = _errors(_config(tmp_path, f"{{command: [x], python: {python}}}"))
    assert errors[0].startswith("tenants.acme.apps.shop.groups.main.python (line 12): /root/.pyenv/versions/3.12.1/bin "
                                "is not in the tenant's view")


def test_an_editable_install_whose_sources_the_view_hides_is_refused(tmp_path, host_tmp):
    python = _venv(tmp_path / "a" / ".venv")
    site = tmp_path / "a" / ".venv" / "lib" / "python3.11" / "site-packages"
    (host_tmp / "src").mkdir()
    (site / "__editable__.mylib-1.0.pth").write_text(f"{host_tmp}/src\n")
    errors = _errors(_config(tmp_path, f"{{command: [x], python: {python}}}"))
    assert errors[0].startswith(f"tenants.acme.apps.shop.groups.main.python (line 12): {host_tmp}/src is not in the "
                                "tenant's view: its /tmp is a directory of its own")
    # setuptools' finder form: a mapping of packages to their sources
    (site / "__editable__.mylib-1.0.pth").unlink()
    (site / "__editable___mylib_1_0_finder.py").write_text(
        f"import sys\nMAPPING: dict[str, str] = {{'mylib': '{host_tmp}/src/mylib'}}\nNAMESPACES = {{}}\n")
    errors = _errors(_config(tmp_path, f"{{command: [x], python: {python}}}"))
    assert errors[0].startswith(f"tenants.acme.apps.shop.groups.main.python (line 12): {host_tmp}/src/mylib is not in")


def test_a_scripts_interpreter_is_judged_too(tmp_path, host_tmp):
    python = _venv(host_tmp / "venv")
    (tmp_path / "a" / "bin").mkdir(parents=True)
    script = tmp_path / "a" / "bin" / "serve"
    script.write_text(f"#!{python}\nprint('hi')\n")
    os.chmod(script, 0o755)
    for command in (f"[{script}]", "[bin/serve]"):
        errors = _errors(_config(tmp_path, f"{{command: {command}}}"))
        assert errors[0].startswith(f"tenants.acme.apps.shop.groups.main.command[0] (line 12): {python} is not in "
                                    "the tenant's view"), errors


def test_a_link_out_of_the_view_is_refused(tmp_path, host_tmp):
    (host_tmp / "python").symlink_to("/usr/bin/python3")
    (tmp_path / "a" / "py").mkdir(parents=True)
    (tmp_path / "a" / "py" / "python").symlink_to(host_tmp / "python")
    parse_config(_config(tmp_path, f"{{command: [x], python: {tmp_path}/a/py/python}}"))  # (at its end: shown)
    (host_tmp / "python").unlink()
    (host_tmp / "python").write_text("")
    errors = _errors(_config(tmp_path, f"{{command: [x], python: {tmp_path}/a/py/python}}"))
    assert errors[0].startswith(f"tenants.acme.apps.shop.groups.main.python (line 12): {tmp_path}/a/py/python leads "
                                f"to {host_tmp}/python, which is not in the tenant's view")


def test_a_tenant_without_a_view_of_its_own_is_not_judged(tmp_path, host_tmp):
    python = _venv(host_tmp / "venv")
    parse_config(_config(tmp_path, f"{{command: [x], python: {python}}}", "    isolation: {enabled: false}\n"))
