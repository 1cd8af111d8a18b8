"""An isolated tenant's view as an argv (supervisor/sandbox.py) and where it goes in a worker's start (spawn.py):
tables, no process started."""

from __future__ import annotations

import pytest

from elasticd.config.isolation import BWRAP
from elasticd.config.model import App, Group, RunAs
from elasticd.supervisor.sandbox import SECRETS, Mask, Sandbox
from elasticd.supervisor.sandbox_host import innermost_pid
from elasticd.supervisor.spawn import SETPRIV, TRAMPOLINE, UMASK, JournalStream, spawn_argv, spec_for

VIEW = Sandbox(tenant="acme", roots=("/srv/acme/shop",), read_write=("/home/acme",), read_only=("/opt/runtime",),
               sockets="/run/elasticd/workers/acme", tmp="/var/tmp/elasticd/acme", hidden=SECRETS,
               inaccessible="/run/elasticd/inaccessible")
RUN_AS = RunAs("acme", 1234, "acme", 1235, "/home/acme")


def _pairs(argv: list[str], option: str) -> list[tuple[str, str]]:
    return [(argv[i + 1], argv[i + 2]) for i, arg in enumerate(argv) if arg == option]


def test_the_trampoline_is_unchanged():
    # ADR-0010's contract: one constant script, the leaf and argv as positional parameters.
    assert TRAMPOLINE == 'echo $$ > "$0/cgroup.procs" && exec "$@"'
    assert UMASK == 'umask 027 && exec "$@"'


def test_the_view_binds_what_the_tenant_owns_and_the_system_read_only():
    argv = VIEW.argv(cwd="/srv/acme/shop", masks=[])
    assert argv[0] == BWRAP and argv[-3:] == ["--chdir", "/srv/acme/shop", "--"]
    assert {"--unshare-pid", "--die-with-parent"} <= set(argv)
    # Only what the unit's RestrictNamespaces=mnt pid allows: never the network, a user namespace (the host's uids),
    # IPC or cgroup namespaces.
    assert not {"--unshare-net", "--unshare-user", "--unshare-all", "--unshare-ipc", "--unshare-cgroup",
                "--unshare-uts"} & set(argv)
    assert _pairs(argv, "--ro-bind")[:2] == [("/usr", "/usr"), ("/etc", "/etc")]
    assert ("/opt/runtime", "/opt/runtime") in _pairs(argv, "--ro-bind")
    assert _pairs(argv, "--bind-try") == [("/srv/acme/shop", "/srv/acme/shop")]  # (a root not made yet: in /)
    assert _pairs(argv, "--bind") == [("/var/tmp/elasticd/acme/tmp", "/tmp"),
                                      ("/var/tmp/elasticd/acme/var-tmp", "/var/tmp"),
                                      ("/home/acme", "/home/acme"),
                                      ("/run/elasticd/workers/acme", "/run/elasticd/workers/acme")]
    assert argv[argv.index("/sys/fs/cgroup") - 4: argv.index("/sys/fs/cgroup") + 1] == [
        "--ro-bind", "/sys", "/sys", "--tmpfs", "/sys/fs/cgroup"]  # (the hierarchy names every tenant: hidden)
    assert argv[argv.index("--proc"): argv.index("--proc") + 4] == ["--proc", "/proc", "--dev", "/dev"]
    # Nothing else of the host: no /home, /root, /srv or /run as a whole, nor elasticd's runtime directory.
    sources = {a for a, _ in _pairs(argv, "--bind") + _pairs(argv, "--ro-bind") + _pairs(argv, "--bind-try")}
    assert not {"/", "/home", "/root", "/srv", "/run", "/run/elasticd", "/var"} & sources


def test_parents_of_a_bind_are_made_searchable_before_it_once():
    argv = VIEW.argv(cwd="/", masks=[])
    dirs = [argv[i + 1] for i, arg in enumerate(argv) if arg == "--dir"]
    assert dirs == ["/run", "/run/systemd", "/var", "/opt", "/srv", "/srv/acme", "/home", "/run/elasticd",
                    "/run/elasticd/workers"]
    first = argv.index("--dir")
    assert argv[first - 2: first] == ["--perms", "0755"]
    assert argv.index("/srv/acme") < argv.index("/srv/acme/shop")


@pytest.mark.parametrize(("mask", "expected"), [
    (Mask("/etc/shadow", False), ["--ro-bind", "/run/elasticd/inaccessible", "/etc/shadow"]),
    (Mask("/etc/ssl/private", True), ["--perms", "0000", "--tmpfs", "/etc/ssl/private"]),
    (Mask("/root/elastic.yaml", False), None),  # not shown at all: a mask would only say where it is
])
def test_hidden_paths_are_covered_only_where_the_view_shows_them(mask, expected):
    argv = VIEW.argv(cwd="/", masks=[mask])
    if expected is None:
        assert mask.path not in argv
        return
    at = argv.index(mask.path)
    assert argv[at - len(expected) + 1: at + 1] == expected
    assert at > argv.index("/run/elasticd/workers/acme")  # after every bind: a mask inside one covers it


def test_a_worker_start_puts_the_view_between_the_umask_and_setpriv():
    app = App(name="shop", domains=("shop.example",), root="/srv/acme/shop", default_group="g",
              groups={"g": Group(name="g", command=("/usr/bin/gunicorn", "--bind", "unix:{socket}", "app:app"))})
    spec = spec_for(app, app.groups["g"], "/cg/tenants/acme/shop", RUN_AS, VIEW)
    journal = JournalStream("/usr/bin/systemd-cat", "acme.shop.g.1")
    argv = spawn_argv(spec, "/run/elasticd/workers/acme/shop.g.1.sock", journal, cwd="/srv/acme/shop",
                      masks=[Mask("/etc/shadow", False)])
    assert argv[:4] == ["/bin/sh", "-c", TRAMPOLINE, "/cg/tenants/acme/shop"]
    assert argv[4] == "/usr/bin/systemd-cat"
    umask = argv.index(UMASK)
    bwrap = argv.index(BWRAP)
    setpriv = argv.index(SETPRIV)
    assert argv[umask - 2: umask + 2] == ["/bin/sh", "-c", UMASK, "umask"] and umask + 2 == bwrap
    assert argv[setpriv - 1] == "--" and argv[setpriv - 3: setpriv - 1] == ["--chdir", "/srv/acme/shop"]
    assert f"--reuid={RUN_AS.uid}" in argv[setpriv:]
    assert argv[-4:] == ["/usr/bin/gunicorn", "--bind", "unix:/run/elasticd/workers/acme/shop.g.1.sock", "app:app"]


def test_a_tenant_without_a_view_starts_as_before():
    app = App(name="shop", domains=("shop.example",), root="/srv/acme/shop", default_group="g",
              groups={"g": Group(name="g", command=("/usr/bin/env",))})
    argv = spawn_argv(spec_for(app, app.groups["g"], "/cg/leaf", RUN_AS))
    assert BWRAP not in argv and argv[-1] == "/usr/bin/env"


def test_a_python_command_brings_elasticds_own_interpreter_into_the_view():
    app = App(name="shop", domains=("shop.example",), root="/srv/acme/shop", default_group="g",
              groups={"g": Group(name="g", command=("{python}", "-m", "elasticd.demo"))})
    with_own = spec_for(app, app.groups["g"], None, RUN_AS, VIEW)
    assert with_own.sandbox is not None
    # Its prefixes (a venv's) and the package's directory, unless /usr shows them already.
    assert set(VIEW.read_only) < set(with_own.sandbox.read_only) or all(
        p.startswith("/usr/") for p in with_own.sandbox.read_only if p not in VIEW.read_only)
    given = Group(name="g", command=("{python}", "-m", "app"), python="/opt/py/bin/python3")
    assert spec_for(app, given, None, RUN_AS, VIEW).sandbox == VIEW  # its own python: the operator binds it


@pytest.mark.parametrize(("status", "pid"), [
    ("Name:\tpython3\nNSpid:\t4312\t2\nNSpgid:\t4311\n", 2),
    ("NSpid:\t4312\n", 4312),
    ("Name:\tx\n", None),
    ("NSpid:\t\n", None),
])
def test_the_innermost_pid_is_read_from_the_status_text(status, pid):
    assert innermost_pid(status) == pid


def test_the_included_files_directories_and_elasticds_own_are_hidden_whole():
    """One cover for /etc/elastic.d however many tenant files it holds; an include straight under /etc is hidden file
    by file (covering /etc would hide the system); the state directory (backups of tenant files) too."""
    from elasticd.config.model import Config, Isolation, Resources, Server, Tenant
    from elasticd.supervisor.sandbox import sandbox_for

    tenant = Tenant(name="acme", resources=Resources(), quotas=None, apps={},  # type: ignore[arg-type]
                    run_as=RUN_AS, isolation=Isolation(home=None, writable=(), read_only=()))
    files = {f"t{n}": f"/etc/elastic.d/t{n}.yaml" for n in range(2000)} | {"edge": "/etc/elastic-edge.yaml"}
    config = Config(server=Server(tenant_config_dir="/etc/elastic.d", state_dir="/var/lib/elasticd"),
                    tenants={"acme": tenant}, source="/etc/elastic.yaml",
                    includes=("/etc/elastic.d/*.yaml", "/etc/elastic-*.yaml"), tenant_files=files)
    view = sandbox_for(config, tenant)
    assert view is not None
    hidden = set(view.hidden)
    assert {"/etc/elastic.yaml", "/etc/elastic.d", "/etc/elastic-edge.yaml", "/var/lib/elasticd"} <= hidden
    assert "/etc" not in hidden and not [path for path in hidden if path.startswith("/etc/elastic.d/")]
