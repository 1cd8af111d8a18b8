"""Run-time limits through the real daemon: overrides, --persist, refusals (fake cgroup tree)."""

from __future__ import annotations

import asyncio
import difflib
import json

from elasticd.ctl import AdminClient

TENANTS = """\
tenants:
  acme:
    # the shop's tenant
    resources:
      cpu: 150%     # one and a half CPUs
      memory: 1G
    apps:
      shop:
        domains: [shop.localhost]
        root: {root}
        groups:
          green:
            command: ["{{python}}", "-m", "elasticd.demo"]
"""


def cpu_max(d) -> str:
    return (d.cgroup / "tenants" / "acme" / "cpu.max").read_text().strip()


def test_override_applies_at_once_survives_reload_and_ends_with_restart(daemons, tmp_path):
    d = daemons(TENANTS.format(root=tmp_path))
    d.start()
    before = d.config_path.read_bytes()
    result = d.ctl("limit", "acme", "--cpu", "10%", "--json")
    assert result.returncode == 0, result.stderr
    reply = json.loads(result.stdout)
    assert reply["limits"]["cpu"] == {"value": "10%", "source": "override", "config": "150%"}
    assert cpu_max(d) == "10000 100000"
    assert d.config_path.read_bytes() == before  # an override never touches the file
    table = d.ctl("status")
    assert table.returncode == 0
    assert d.status()["tenants"]["acme"]["limits"]["cpu"]["source"] == "override"
    d.reload()
    assert cpu_max(d) == "10000 100000"  # a reload does not undo it
    d.restart()
    assert cpu_max(d) == "150000 100000"  # a restart does
    assert d.status()["tenants"]["acme"]["limits"]["cpu"] == {"value": "150%", "source": "config"}


def test_clear_goes_back_to_the_config_at_once_and_names_what_went(daemons, tmp_path):
    d = daemons(TENANTS.format(root=tmp_path))
    d.start()
    before = d.config_path.read_bytes()
    memory = d.cgroup / "tenants" / "acme" / "memory.max"
    assert d.ctl("limit", "acme", "--cpu", "10%", "--memory", "256M", "--io-read", "5M").returncode == 0
    assert (cpu_max(d), memory.read_text().strip()) == ("10000 100000", str(256 * 1024**2))

    one = d.ctl("limit", "acme", "--clear", "cpu", "--json")  # only the CPU
    assert one.returncode == 0, one.stderr
    reply = json.loads(one.stdout)
    assert reply["cleared"] == ["cpu"] and reply["limits"]["cpu"] == {"value": "150%", "source": "config"}
    assert reply["limits"]["memory"] == {"value": "256M", "source": "override", "config": "1G"}
    assert (cpu_max(d), memory.read_text().strip()) == ("150000 100000", str(256 * 1024**2))
    assert "50%*" not in d.ctl("status").stdout and "acme memory: 256M (the config says 1G)" in d.ctl("status").stdout

    rest = d.ctl("limit", "acme", "--clear")  # everything left
    assert rest.returncode == 0, rest.stderr
    assert rest.stdout.startswith("cleared memory, io_read: back to the config")
    assert memory.read_text().strip() == str(1024**3)
    limits = d.status()["tenants"]["acme"]["limits"]
    assert all(limit["source"] == "config" for limit in limits.values()), limits
    again = d.ctl("limit", "acme", "--clear", "memory")
    assert again.returncode == 0 and again.stdout.startswith("no override to clear")
    d.reload()
    assert memory.read_text().strip() == str(1024**3)  # a reload does not bring a cleared override back
    assert d.config_path.read_bytes() == before  # and the file was never touched

    unknown = d.ctl("limit", "nobody", "--clear")
    assert unknown.returncode == 1 and 'no tenant "nobody"' in unknown.stderr
    assert d.ctl("limit", "acme", "--clear", "swap").returncode == 2  # not a limit an override sets
    assert d.ctl("limit", "acme", "--clear", "--cpu", "5%").returncode == 2
    code, body = asyncio.run(AdminClient(str(d.admin)).request("DELETE", "/v1/tenants/acme/limits?limits=cpu,swap"))
    assert code == 400 and body["error"].startswith('limits: "swap" is not a limit an override can set')


def test_persist_changes_only_that_line_and_survives_restart(daemons, tmp_path):
    d = daemons(TENANTS.format(root=tmp_path))
    d.start()
    before = d.config_path.read_text()
    result = d.ctl("limit", "acme", "--memory", "512M", "--persist")
    assert result.returncode == 0, result.stderr
    assert "persisted" in result.stdout
    after = d.config_path.read_text()
    changed = [line for line in difflib.unified_diff(before.splitlines(), after.splitlines(), lineterm="", n=0)
               if line[:1] in "+-" and not line.startswith(("+++", "---"))]
    assert changed == ["-      memory: 1G", "+      memory: 512M"]
    [backup] = d.tmp.glob("elastic.yaml.bak.*")
    assert backup.read_text() == before
    memory = d.cgroup / "tenants" / "acme" / "memory.max"
    assert memory.read_text().strip() == str(512 * 1024**2)
    assert d.status()["tenants"]["acme"]["limits"]["memory"] == {"value": "512M", "source": "config"}
    d.restart()
    assert memory.read_text().strip() == str(512 * 1024**2)


def test_refusals_change_nothing(daemons, tmp_path):
    d = daemons(TENANTS.format(root=tmp_path))
    d.start()
    before = d.config_path.read_bytes()
    bad = d.ctl("limit", "acme", "--cpu", "fifty", "--persist")
    assert bad.returncode == 1
    assert 'cpu: "fifty" is not a percentage' in bad.stderr
    unknown = d.ctl("limit", "nobody", "--cpu", "10%")
    assert unknown.returncode == 1
    assert 'no tenant "nobody"' in unknown.stderr
    usage = d.ctl("limit", "acme")
    assert usage.returncode == 2
    assert d.config_path.read_bytes() == before
    assert cpu_max(d) == "150000 100000"


def test_aliases(daemons, tmp_path):
    import subprocess
    import sys
    d = daemons(TENANTS.format(root=tmp_path))
    d.start()

    def alias(fn: str, *args: str) -> subprocess.CompletedProcess[str]:
        code = f"import sys; from elasticd.ctl import {fn}; sys.exit({fn}(sys.argv[1:]))"
        return subprocess.run([sys.executable, "-c", code, "--socket", str(d.admin), *args],
                              capture_output=True, text=True, timeout=60)

    assert alias("limitcpu_main", "acme", "20%").returncode == 0
    assert cpu_max(d) == "20000 100000"
    assert alias("limitram_main", "acme", "2G").returncode == 0
    assert (d.cgroup / "tenants" / "acme" / "memory.max").read_text().strip() == str(2 * 1024**3)
    assert alias("limitio_main", "acme", "--weight", "300").returncode == 0
    assert (d.cgroup / "tenants" / "acme" / "io.weight").read_text().strip() == "default 300"
    assert alias("limitio_main", "acme").returncode == 2
