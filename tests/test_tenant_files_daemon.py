"""Tenants managed by a program, on a real elasticd: elasticctl tenant add|set|remove|show and the API under them;
validation against the whole configuration before anything is written; two panels at once; a body too large or of
the wrong shape; a reload that writes only the changed tenant's cgroup files; limit --persist into the tenant's own
file with its lock and backup aside."""

from __future__ import annotations

import concurrent.futures
import http.client
import json
import os
import socket
import time
from pathlib import Path

import pytest


def _tenant_yaml(name: str, root: Path, cpu: str = "50%", domain: str | None = None) -> str:
    return (f"resources: {{cpu: {cpu}}}\napps:\n  web:\n    domains: [{domain or name + '.localhost'}]\n"
            f"    root: {root}\n    groups:\n      main:\n"
            '        command: ["{python}", "-m", "elasticd.demo"]\n'
            "        pool: {min_workers: 0, max_workers: 1}\n")


@pytest.fixture
def host(daemons, tmp_path):
    root = tmp_path / "root"
    root.mkdir(mode=0o755)
    confd = tmp_path / "elastic.d"
    confd.mkdir(mode=0o755)
    state = tmp_path / "state"
    for name in ("acme", "globex"):
        (confd / f"{name}.yaml").write_text("tenants:\n  " + name + ":\n" + "".join(
            "    " + line + "\n" for line in _tenant_yaml(name, root).splitlines()))
    main_tenant = "\n".join("    " + line for line in _tenant_yaml("local", root).splitlines())
    d = daemons(f"include: [{confd}/*.yaml]\ntenants:\n  local:\n{main_tenant}\n",
                extra_server=f"  tenant_config_dir: {confd}\n  state_dir: {state}\n")
    d.start()
    return d, confd, root, state


def _api(d, method: str, path: str, body: bytes | None = None, headers: dict[str, str] | None = None):
    class UnixConnection(http.client.HTTPConnection):
        def connect(self) -> None:
            self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            self.sock.connect(str(d.admin))
    conn = UnixConnection("elasticd", timeout=60)
    try:
        conn.request(method, path, body=body, headers=headers or {})
        response = conn.getresponse()
        return response.status, json.loads(response.read() or b"null")
    finally:
        conn.close()


def _cgroup_mtimes(d, tenant: str) -> dict[str, int]:
    base = d.cgroup / "tenants" / tenant
    return {str(p.relative_to(base)): p.stat().st_mtime_ns for p in base.rglob("*") if p.is_file()
            and p.name in ("cpu.max", "memory.max", "memory.swap.max", "pids.max", "io.weight")}


def test_add_show_set_remove_round_trip(host, tmp_path):
    d, confd, root, state = host
    source = tmp_path / "newco.yaml"
    source.write_text(_tenant_yaml("newco", root, cpu="25%"))
    added = d.ctl("tenant", "add", "newco", str(source))
    assert added.returncode == 0, added.stderr
    assert f"tenant newco: created {confd}/newco.yaml, applied" in added.stdout
    assert (d.cgroup / "tenants" / "newco" / "cpu.max").read_text().strip() == "25000 100000"
    status, _body, _ = d.get("newco.localhost", "/")  # routed at once: its first request starts its worker
    assert status == 200
    again = d.ctl("tenant", "add", "newco", str(source))
    assert again.returncode == 1 and "exists already" in again.stderr
    shown = json.loads(d.ctl("tenant", "show", "newco", "--json").stdout)
    assert shown["file"] == f"{confd}/newco.yaml" and shown["managed"] and shown["config"]["resources"]["cpu"] == "25%"
    source.write_text(_tenant_yaml("newco", root, cpu="75%"))
    replaced = d.ctl("tenant", "set", "newco", "-", input_file=source)
    assert replaced.returncode == 0, replaced.stderr
    assert (d.cgroup / "tenants" / "newco" / "cpu.max").read_text().strip() == "75000 100000"
    backups = sorted(os.listdir(state / "tenant-files"))
    assert backups and all(name.startswith("newco.yaml.bak.") for name in backups)
    removed = d.ctl("tenant", "remove", "newco")
    assert removed.returncode == 0, removed.stderr
    assert "workers draining" in removed.stdout
    assert sorted(os.listdir(confd)) == ["acme.yaml", "globex.yaml"]  # nothing of newco's left beside the others
    assert d.get("newco.localhost", "/")[0] == 404
    deadline = time.monotonic() + 30
    while (d.cgroup / "tenants" / "newco").exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not (d.cgroup / "tenants" / "newco").exists()
    assert d.ctl("tenant", "show", "newco").returncode == 1


def test_refusals_change_nothing(host, tmp_path):
    d, confd, root, _state = host
    before = {name: (confd / name).read_bytes() for name in os.listdir(confd)}
    bad = tmp_path / "bad.yaml"
    bad.write_text(_tenant_yaml("newco", root, cpu="15O%"))
    refused = d.ctl("tenant", "set", "newco", str(bad))
    assert refused.returncode == 1
    said = f"the body sent for {confd}/newco.yaml: tenants.newco.resources.cpu (line 1): \"15O%\" is not a percentage"
    assert said in refused.stderr
    bad.write_text(_tenant_yaml("newco", root, domain="acme.localhost"))
    refused = d.ctl("tenant", "set", "newco", str(bad))
    assert refused.returncode == 1 and '"acme.localhost" is already routed to tenants.acme.apps.web' in refused.stderr
    refused = d.ctl("tenant", "set", "local", str(bad))
    assert refused.returncode == 1 and f"tenant local is defined in {d.config_path}" in refused.stderr
    assert _api(d, "PUT", "/v1/tenants/newco/config", b"[1, 2]")[0] == 400
    assert _api(d, "PUT", "/v1/tenants/Bad.Name/config", b"{}")[0] == 400
    assert _api(d, "PUT", "/v1/tenants/newco/config", b"{not json")[0] == 400
    status, _body = _api(d, "PUT", "/v1/tenants/newco/config", b"x" * (100 << 20))
    assert status == 413
    assert _api(d, "DELETE", "/v1/tenants/nobody/config")[0] == 404
    assert {name: (confd / name).read_bytes() for name in os.listdir(confd)} == before
    assert d.get("acme.localhost", "/")[0] == 200  # and it serves on


def test_two_panels_at_once_are_serialized(host):
    d, confd, root, _state = host
    bodies = {f"t{n}": json.dumps({"resources": {"cpu": f"{10 + n}%"}, "apps": {"web": {
        "domains": [f"t{n}.localhost"], "root": str(root),
        "groups": {"main": {"command": ["x"], "pool": {"min_workers": 0}}}}}}).encode() for n in range(6)}
    with concurrent.futures.ThreadPoolExecutor(6) as pool:
        replies = list(pool.map(lambda item: _api(d, "PUT", f"/v1/tenants/{item[0]}/config", item[1]),
                                bodies.items()))
    assert [status for status, _ in replies] == [201] * 6
    for n in range(6):
        assert (d.cgroup / "tenants" / f"t{n}" / "cpu.max").read_text().strip() == f"{(10 + n) * 1000} 100000"
    assert not [name for name in os.listdir(confd) if name.startswith(".")]  # no temporary file left


def test_a_reload_writes_only_the_changed_tenants_cgroup_files(host):
    d, confd, _root, _state = host
    before = {t: _cgroup_mtimes(d, t) for t in ("acme", "globex", "local")}
    time.sleep(0.05)
    reloaded = d.ctl("reload")
    assert reloaded.returncode == 0 and "0 tenants' cgroup files written" in reloaded.stdout
    assert {t: _cgroup_mtimes(d, t) for t in before} == before  # nothing changed: no cgroup file written
    text = (confd / "globex.yaml").read_text().replace("cpu: 50%", "cpu: 60%")
    (confd / "globex.yaml").write_text(text)
    reloaded = d.ctl("reload")
    assert reloaded.returncode == 0 and "1 tenants' cgroup files written (globex)" in reloaded.stdout
    after = {t: _cgroup_mtimes(d, t) for t in before}
    assert after["acme"] == before["acme"] and after["local"] == before["local"]
    assert after["globex"]["cpu.max"] != before["globex"]["cpu.max"]
    everything = d.ctl("reload", "--all")
    assert everything.returncode == 0 and "3 tenants' cgroup files written" in everything.stdout


def test_limit_persist_writes_into_the_tenants_own_file_with_its_lock_and_backup_aside(host):
    d, confd, _root, state = host
    result = d.ctl("limit", "acme", "--cpu", "35%", "--persist")
    assert result.returncode == 0, result.stderr
    assert "cpu: 35%" in (confd / "acme.yaml").read_text()
    assert sorted(os.listdir(confd)) == ["acme.yaml", "globex.yaml"]
    aside = os.listdir(state / "tenant-files")
    assert "acme.yaml.lock" in aside and any(name.startswith("acme.yaml.bak.") for name in aside)
