from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from elasticd.config import ConfigError, load_config, parse_config
from elasticd.config.load import MAX_PACKAGE
from elasticd.config.units import UnitError, format_size, parse_cpu, parse_duration, parse_size
from elasticd.frames import MAX_PAYLOAD

ROOT = Path(__file__).resolve().parent.parent

MINIMAL = """\
tenants:
  acme:
    resources:
      cpu: 150%
    apps:
      shop:
        domains: [shop.localhost]
        root: /srv/acme/shop
        groups:
          green:
            command: ["{python}", "-m", "elasticd.demo"]
"""


@pytest.mark.parametrize(("text", "expected"), [
    ("150%", 150.0), ("1%", 1.0), ("12.5%", 12.5), ("max", None), (" 50% ", 50.0),
])
def test_cpu_values(text, expected):
    assert parse_cpu(text) == expected


@pytest.mark.parametrize("text", ["15O%", "150", "-5%", "0.5%", "", "%", True])
def test_cpu_refusals(text):
    with pytest.raises(UnitError):
        parse_cpu(text)


@pytest.mark.parametrize(("text", "expected"), [
    ("1G", 1024**3), ("512M", 512 * 1024**2), ("1K", 1024), ("2T", 2 * 1024**4), (0, 0), ("4096", 4096),
    (4096, 4096), ("1.5G", 1536 * 1024**2), ("max", None),
])
def test_size_values(text, expected):
    assert parse_size(text) == expected


@pytest.mark.parametrize("text", ["1g", "1GB", "-1", "1.3K", "ten", "1 G"])
def test_size_refusals(text):
    with pytest.raises(UnitError):
        parse_size(text)


@pytest.mark.parametrize(("text", "expected"), [("500ms", 0.5), ("5s", 5.0), ("30m", 1800.0), ("1.5s", 1.5)])
def test_duration_values(text, expected):
    assert parse_duration(text) == expected


@pytest.mark.parametrize("text", ["5", "5h", "0s", "s", "-1s"])
def test_duration_refusals(text):
    with pytest.raises(UnitError):
        parse_duration(text)


@pytest.mark.parametrize(("n", "text"), [(1024**3, "1G"), (512 * 1024**2, "512M"), (1000, "1000"), (None, "max")])
def test_format_size(n, text):
    assert format_size(n) == text


def test_example_config_is_valid(demo_users):
    config = load_config(ROOT / "etc" / "elastic.yaml.example")
    assert set(config.tenants) == {"acme", "globex"}
    acme = config.tenants["acme"]
    assert [t.run_as.user for t in config.tenants.values()] == ["elastic-acme", "elastic-globex"] == demo_users
    assert acme.resources.cpu == 150.0
    assert acme.resources.memory == 1024**3
    assert acme.resources.io_read == 50 * 1024**2
    shop = acme.apps["shop"]
    assert shop.default_group == "green"
    assert shop.groups["green"].command == ("{python}", "-m", "elasticd.demo")


def test_defaults():
    config = parse_config(MINIMAL)
    assert config.server.stop_timeout == 10.0
    assert config.server.cgroups.mode == "auto"
    assert config.server.cgroups.path is None
    acme = config.tenants["acme"]
    assert acme.resources.swap == 0  # not unlimited: a memory limit must not be absorbed by swap
    assert acme.resources.memory is None
    app = acme.apps["shop"]
    assert app.default_group == "green"
    assert app.groups["green"].pool.min_workers == 1
    assert app.groups["green"].python is None


def _errors(text: str) -> list[str]:
    with pytest.raises(ConfigError) as info:
        parse_config(textwrap.dedent(text))
    return [str(issue) for issue in info.value.issues]


# One row per rule: the config text and the error it must produce (path and line included).
BAD = [
    ("cpu not a percentage", """\
        tenants:
          acme:
            resources:
              cpu: 15O%
        """, 'tenants.acme.resources.cpu (line 4): "15O%" is not a percentage'),
    ("memory unit", """\
        tenants:
          acme:
            resources:
              memory: 1GB
        """, 'tenants.acme.resources.memory (line 4): "1GB" is not a size'),
    ("memory zero", """\
        tenants:
          acme:
            resources:
              memory: 0
        """, "tenants.acme.resources.memory (line 4): \"0\" must be more than 0"),
    ("pids not a number", """\
        tenants:
          acme:
            resources:
              pids: lots
        """, 'tenants.acme.resources.pids (line 4): "lots" is not a whole number or "max"'),
    ("io weight range", """\
        tenants:
          acme:
            resources:
              io_weight: 20000
        """, "tenants.acme.resources.io_weight (line 4): 20000 is out of range"),
    ("io bandwidth key", """\
        tenants:
          acme:
            resources:
              io_bandwidth: {reed: 5M}
        """, "tenants.acme.resources.io_bandwidth.reed (line 4): unknown key"),
    ("unknown resource", """\
        tenants:
          acme:
            resources:
              cpus: 50%
        """, "tenants.acme.resources.cpus (line 4): unknown key"),
    ("bad tenant name", """\
        tenants:
          Acme:
            apps: {}
        """, 'tenants.Acme (line 2): "Acme" is not a valid tenant name'),
    ("escaping app name", """\
        tenants:
          acme:
            apps:
              ../etc:
                domains: [a.localhost]
        """, 'tenants.acme.apps.../etc (line 4): "../etc" is not a valid app name'),
    ("duration without unit", """\
        server:
          stop_timeout: 10
        """, "server.stop_timeout (line 2): \"10\" is not a duration"),
    ("bad listen", """\
        server:
          listen: localhost
        """, 'server.listen (line 2): "localhost" is not HOST:PORT'),
    ("bad mode", """\
        server:
          cgroups:
            mode: sometimes
        """, 'server.cgroups.mode (line 3): "sometimes" is not a mode'),
    ("relative base", """\
        server:
          cgroups:
            path: sys/fs/cgroup
        """, 'server.cgroups.path (line 3): "sys/fs/cgroup" is not an absolute path'),
    ("shell string command", """\
        tenants:
          acme:
            apps:
              shop:
                domains: [shop.localhost]
                root: /srv/shop
                groups:
                  green:
                    command: "python -m app"
        """, "tenants.acme.apps.shop.groups.green.command (line 9): must be a non-empty list"),
    ("missing root", """\
        tenants:
          acme:
            apps:
              shop:
                domains: [shop.localhost]
                groups:
                  green: {command: [app]}
        """, "tenants.acme.apps.shop.root (line 4): is required"),
    ("unknown default group", """\
        tenants:
          acme:
            apps:
              shop:
                domains: [shop.localhost]
                root: /srv/shop
                default_group: blue
                groups:
                  green: {command: [app]}
        """, 'tenants.acme.apps.shop.default_group (line 7): "blue" is not one of its groups (green)'),
    ("min over max", """\
        tenants:
          acme:
            apps:
              shop:
                domains: [shop.localhost]
                root: /srv/shop
                groups:
                  green:
                    command: [app]
                    pool: {min_workers: 5, max_workers: 2}
        """, "tenants.acme.apps.shop.groups.green.pool.min_workers (line 10): 5 is more than max_workers (2)"),
    ("threshold range", """\
        tenants:
          acme:
            apps:
              shop:
                domains: [shop.localhost]
                root: /srv/shop
                groups:
                  green:
                    command: [app]
                    pool:
                      admission_threshold: 1.5
        """, "tenants.acme.apps.shop.groups.green.pool.admission_threshold (line 11): 1.5 is not between 0 and 1"),
    ("reserved env", """\
        tenants:
          acme:
            apps:
              shop:
                domains: [shop.localhost]
                root: /srv/shop
                groups:
                  green:
                    command: [app]
                    env: {ELASTIC_TOKEN: x}
        """, "tenants.acme.apps.shop.groups.green.env.ELASTIC_TOKEN (line 10): ELASTIC_* variables are set"),
    ("bad domain", """\
        tenants:
          acme:
            apps:
              shop:
                domains: ["shop localhost"]
                root: /srv/shop
                groups:
                  green: {command: [app]}
        """, 'tenants.acme.apps.shop.domains[0] (line 5): "shop localhost" is not a host name'),
    ("domain twice", """\
        tenants:
          acme:
            apps:
              shop:
                domains: [shop.localhost]
                root: /srv/shop
                groups:
                  green: {command: [app]}
          globex:
            apps:
              blog:
                domains: [SHOP.localhost]
                root: /srv/blog
                groups:
                  main: {command: [app]}
        """, 'tenants.globex.apps.blog.domains (line 12): "shop.localhost" is already routed to '
             "tenants.acme.apps.shop"),
    ("burst alone", """\
        tenants:
          acme:
            quotas:
              burst: 10
        """, "tenants.acme.quotas.burst (line 4): needs requests_per_second beside it"),
    ("unknown top key", """\
        tenant:
          acme: {}
        """, "tenant (line 1): unknown key"),
    ("not yaml", """\
        tenants:
          acme: [1,
        """, "line 3: not valid YAML"),
    ("duplicate key", """\
        tenants:
          acme: {}
          acme: {}
        """, "not valid YAML"),
]


@pytest.mark.parametrize(("name", "text", "expected"), BAD, ids=[row[0] for row in BAD])
def test_each_rule_names_path_and_line(name, text, expected):
    errors = _errors(text)
    assert any(expected in e for e in errors), errors


def test_every_error_of_a_file_is_reported_at_once():
    errors = _errors("""\
        server:
          listen: nowhere
          stop_timeout: soon
        tenants:
          acme:
            resources:
              cpu: lots
              memory: huge
        """)
    assert len(errors) == 4
    assert [e.split(" ")[0] for e in errors] == [
        "server.listen", "server.stop_timeout", "tenants.acme.resources.cpu", "tenants.acme.resources.memory"]


def test_unreadable_file(tmp_path):
    with pytest.raises(ConfigError) as info:
        load_config(tmp_path / "missing.yaml")
    assert "cannot read" in str(info.value)


def test_empty_file_is_an_empty_config():
    config = parse_config("")
    assert config.tenants == {}


def test_ipv6_listen():
    config = parse_config('server: {listen: "[::1]:8081"}')
    assert (config.server.listen.host, config.server.listen.port) == ("::1", 8081)
    assert str(config.server.listen) == "[::1]:8081"


def test_worker_socket_paths_must_fit_a_unix_socket():
    long = "a" * 60
    errors = _errors(f"""\
        server:
          runtime_dir: /run/elasticd
        tenants:
          {long}:
            apps:
              {long}:
                domains: [x.localhost]
                root: /srv/x
                groups:
                  green: {{command: [app]}}
        """)
    assert any(f"tenants.{long}.apps.{long}.groups.green (line 10): its workers' socket paths" in e for e in errors)


def test_a_tenants_channel_socket_must_fit_a_unix_socket():
    long = "t" * 63
    errors = _errors(f"""\
        server:
          runtime_dir: /run/a-rather-long-runtime-directory
        tenants:
          {long}:
            apps:
              a:
                domains: [x.localhost]
                root: /srv/x
                groups:
                  g: {{command: [app]}}
        """)
    assert errors == [f"tenants.{long} (line 4): its channel socket /run/a-rather-long-runtime-directory/workers/{long}"
                      "/channel.sock would be 121 bytes, over the 107 a Unix socket allows: shorten the tenant's name "
                      "or the runtime_dir"]


GROUP_WITH_POOL = """\
tenants:
  acme:
    apps:
      shop:
        domains: [shop.localhost]
        root: /srv/shop
        groups:
          green:
            command: [app]
            pool: {pool}
"""


def test_max_workers_null_or_max_is_unbounded_and_absent_is_four():
    for spelling in ("{max_workers: null}", "{max_workers: max}", "{max_workers: ~}"):
        config = parse_config(GROUP_WITH_POOL.format(pool=spelling))
        assert config.tenants["acme"].apps["shop"].groups["green"].pool.max_workers is None, spelling
    config = parse_config(GROUP_WITH_POOL.format(pool="{min_workers: 1}"))
    assert config.tenants["acme"].apps["shop"].groups["green"].pool.max_workers == 4


def test_the_pools_drain_and_hold_keys():
    config = parse_config(GROUP_WITH_POOL.format(
        pool="{drain_timeout: 2m, cpu_held_at: 0.8, throttled_held_at: 0.6, memory_held_at: 0.95, pids_held_at: 1}"))
    pool = config.tenants["acme"].apps["shop"].groups["green"].pool
    assert (pool.drain_timeout, pool.cpu_held_at, pool.throttled_held_at, pool.memory_held_at,
            pool.pids_held_at) == (120.0, 0.8, 0.6, 0.95, 1.0)
    defaults = parse_config(GROUP_WITH_POOL.format(pool="{}")).tenants["acme"].apps["shop"].groups["green"].pool
    assert (defaults.drain_timeout, defaults.cpu_held_at, defaults.throttled_held_at, defaults.memory_held_at,
            defaults.pids_held_at) == (300.0, 0.9, 0.5, 0.9, 0.9)


@pytest.mark.parametrize(("pool", "expected"), [
    ("{cpu_held_at: 0}", "pool.cpu_held_at (line 10): 0 is not a share of a limit"),
    ("{memory_held_at: 1.2}", "pool.memory_held_at (line 10): 1.2 is not between 0 and 1"),
    ("{drain_timeout: soon}", 'pool.drain_timeout (line 10): "soon" is not a duration'),
    ("{pids_held_at: yes}", 'pool.pids_held_at (line 10): "yes" is not a number'),
    ("{max_package: 65M}", "pool.max_package (line 10): 68157440 bytes is over the channel's bound on one package"),
    ("{max_package: max}", 'pool.max_package (line 10): "max" is not allowed here'),
])
def test_pool_hold_key_refusals(pool, expected):
    with pytest.raises(ConfigError) as info:
        parse_config(GROUP_WITH_POOL.format(pool=pool))
    assert expected in str(info.value)


def test_max_package_defaults_to_16m_and_its_bound_is_the_channels():
    pools = [parse_config(GROUP_WITH_POOL.format(pool=pool)).tenants["acme"].apps["shop"].groups["green"].pool
             for pool in ("{}", "{max_package: 64M}", "{max_package: 0}")]
    assert [p.max_package for p in pools] == [16 << 20, 64 << 20, 0]
    assert MAX_PACKAGE == MAX_PAYLOAD  # the config's bound is the frame's


def test_hung_after_defaults_to_30s_and_never_under_three_intervals():
    assert parse_config("").server.hung_after == 30.0
    assert parse_config("server: {occupancy_interval: 200ms, hung_after: 600ms}").server.hung_after == 0.6
    with pytest.raises(ConfigError) as info:
        parse_config("server:\n  occupancy_interval: 5s\n  hung_after: 10s\n")
    assert str(info.value) == ("server.hung_after (line 3): hung_after (10s) must be at least 3 occupancy "
                               "intervals (15s): a worker is called hung only after 3 missed reports")
    with pytest.raises(ConfigError) as info:  # the default hung_after against a long interval: names the interval
        parse_config("server:\n  occupancy_interval: 20s\n")
    assert str(info.value).startswith("server.occupancy_interval (line 2): hung_after (30s) must be at least")


TENANT_USER = """\
tenants:
  acme:
{who}
    apps:
      shop:
        domains: [shop.localhost]
        root: /srv/shop
        groups:
          green: {{command: [app]}}
"""


def test_a_tenant_runs_as_its_user_and_its_primary_group_by_default():
    import grp
    import pwd
    nobody = pwd.getpwnam("nobody")
    tenant = parse_config(TENANT_USER.format(who="    user: nobody")).tenants["acme"]
    assert tenant.run_as is not None
    assert (tenant.run_as.user, tenant.run_as.uid, tenant.run_as.gid) == ("nobody", nobody.pw_uid, nobody.pw_gid)
    by_uid = parse_config(TENANT_USER.format(who=f"    user: {nobody.pw_uid}")).tenants["acme"].run_as
    assert by_uid is not None and by_uid.user == "nobody"
    group = grp.getgrgid(0).gr_name
    with_group = parse_config(TENANT_USER.format(who=f"    user: nobody\n    group: {group}")).tenants["acme"].run_as
    assert with_group is not None and (with_group.group, with_group.gid) == (group, 0)
    assert parse_config(TENANT_USER.format(who="    user: root")).tenants["acme"].run_as.uid == 0  # written: meant
    assert parse_config(TENANT_USER.format(who="")).tenants["acme"].run_as is None


@pytest.mark.parametrize(("who", "expected"), [
    ("    user: no-such-user-here", 'tenants.acme.user (line 3): "no-such-user-here" is not a user on this host'),
    ("    user: 0", "tenants.acme.user (line 3): the number 0 is root: write user: root if the tenant is meant"),
    ("    user: nobody\n    group: no-such-group-here",
     'tenants.acme.group (line 4): "no-such-group-here" is not a group on this host'),
    ("    group: nobody", "tenants.acme.group (line 3): needs user beside it"),
])
def test_tenant_user_refusals(who, expected):
    with pytest.raises(ConfigError) as info:
        parse_config(TENANT_USER.format(who=who))
    assert expected in str(info.value)


def test_an_app_root_others_can_write_is_refused(tmp_path):
    import os
    root = tmp_path / "shop"
    root.mkdir(mode=0o755)
    text = TENANT_USER.format(who="    user: nobody").replace("/srv/shop", str(root))
    parse_config(text)  # root's, 0755: fine
    os.chmod(root, 0o777)
    with pytest.raises(ConfigError) as info:
        parse_config(text)
    assert "tenants.acme.apps.shop.root (line 7): " in str(info.value) and "mode 0777) is writable by everyone" \
        in str(info.value)
    os.chmod(root, 0o775)  # group root (gid 0), not nobody's own group
    with pytest.raises(ConfigError, match="is writable by its group, which is not tenant acme's own"):
        parse_config(text)
    os.chmod(root, 0o755)
    os.chown(root, 65534, -1)  # nobody's: its own tenant's user may own it
    parse_config(text)


@pytest.mark.parametrize(("mode", "uid", "gid", "refused"), [
    (0o40755, 0, 0, None),
    (0o40777, 0, 0, "writable by everyone"),
    (0o40775, 0, 0, None),  # a root tenant's own group is root's
    (0o40775, 0, 50, "writable by its group"),
    (0o40755, 2001, 0, "belongs to the user of tenant globex"),
    (0o40755, 1001, 0, None),  # the tenant's own user
])
def test_root_refusal_table(mode, uid, gid, refused):
    import os

    from elasticd.config import RunAs, Tenant, root_refusal
    from elasticd.config.model import Quotas, Resources
    st = os.stat_result((mode, 1, 1, 1, uid, gid, 0, 0, 0, 0))
    mine = Tenant("acme", Resources(), Quotas(), {}, RunAs("acme", 1001, "acme", 0, "/"))
    found = root_refusal("/srv/acme", st, mine, {2001: "globex"})
    assert (found is None) if refused is None else (refused in found)


def test_move_timeout_defaults_to_10s_and_must_be_positive():
    assert parse_config("").server.move_timeout == 10.0
    assert parse_config("server: {move_timeout: 250ms}").server.move_timeout == 0.25
    with pytest.raises(ConfigError) as info:
        parse_config("server:\n  move_timeout: 0s\n")
    assert str(info.value) == 'server.move_timeout (line 2): "0s" must be longer than 0'


def test_the_fast_loader_and_the_one_with_lines_give_the_same_config(tmp_path):
    """A valid file is read by the safe (C) loader; a file with a problem again by the round-trip one, for its
    lines. Both must build the same model from the same text."""
    from elasticd.config.load import _assemble

    def _parse_with_lines(text: str, source: str):
        return _assemble(text, source, None, lines=True, overlay={})

    example = Path(__file__).resolve().parent.parent / "etc" / "elastic.yaml.example"
    root = tmp_path / "root"
    root.mkdir(mode=0o755)
    texts = [textwrap.dedent(f"""\
        server: {{listen: 127.0.0.1:9000, user_ttl: 5m, monitor: {{user: ops, password_file: /etc/pw}}}}
        tenants:
          acme:
            resources: {{cpu: 150%, memory: 1G, io_bandwidth: {{read: 5M}}}}
            quotas: {{requests_per_second: 2.5}}
            apps:
              shop:
                domains: [shop.localhost, "*.shop.test"]
                root: {root}
                default_group: green
                canary: {{group: blue, share: 12.5%}}
                groups:
                  green: {{command: ["{{python}}", "-m", "x"], env: {{A: "1", B: "yes"}}, concurrency: 4}}
                  blue: {{command: [x], pool: {{min_workers: 0, max_workers: null, idle_timeout: 90s}}}}
        """)]
    for source in texts:
        assert parse_config(source) == _parse_with_lines(source, "<string>")
    request_users = example.read_text()
    try:
        assert load_config(example) == _parse_with_lines(request_users, str(example))
    except ConfigError as exc:  # the example's tenant users do not exist on this machine: the same error both ways
        with pytest.raises(ConfigError) as again:
            _parse_with_lines(request_users, str(example))
        assert str(again.value) == str(exc)
