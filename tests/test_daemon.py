"""elasticd as a real subprocess on a fake cgroup tree: placement, limits, the front, reload, restart, stop."""

from __future__ import annotations

import os
import signal
import threading
import time

from harness import PYTHON

from elasticd.cgroup import disks_for_roots

TENANTS = """\
tenants:
  acme:
    resources:
      cpu: 150%
      memory: 1G
      pids: 512
      io_weight: 200
      io_bandwidth: {{read: 50M, write: 20M}}
    apps:
      shop:
        domains: [shop.localhost]
        root: {root}
        groups:
          green:
            command: ["{{python}}", "-m", "elasticd.demo"]
            env: {{COLOR: green}}
  globex:
    resources:
      cpu: {globex_cpu}
    apps:
      blog:
        domains: [blog.localhost]
        root: {root}
        groups:
          main:
            command: ["{{python}}", "-m", "elasticd.demo"]
            env: {{COLOR: {blog_color}}}
            pool: {{min_workers: 2}}
"""


def tenants(root, globex_cpu="50%", blog_color="blue") -> str:
    return TENANTS.format(root=root, globex_cpu=globex_cpu, blog_color=blog_color)


def read(path) -> str:
    return path.read_text().strip()


def test_start_places_workers_writes_limits_and_serves(daemons, tmp_path):
    d = daemons(tenants(tmp_path))
    d.start()
    cg = d.cgroup
    # Controllers enabled down base → tenants → tenant; limits written in the tenant group.
    assert read(cg / "cgroup.subtree_control") == "+cpu +memory +pids +io"
    assert read(cg / "tenants" / "cgroup.subtree_control") == "+cpu +memory +pids +io"
    assert read(cg / "tenants" / "acme" / "cgroup.subtree_control") == "+cpu +memory +pids +io"
    acme = cg / "tenants" / "acme"
    assert read(acme / "cpu.max") == "150000 100000"
    assert read(acme / "memory.max") == str(1024**3)
    assert read(acme / "memory.swap.max") == "0"
    assert read(acme / "pids.max") == "512"
    assert read(acme / "io.weight") == "default 200"
    disks, _ = disks_for_roots([str(tmp_path)])
    if disks:  # the last io.max write is for the last disk (a fake file keeps only the last write)
        assert read(acme / "io.max") == f"{disks[-1]} rbps={50 * 1024**2} wbps={20 * 1024**2}"
    globex = cg / "tenants" / "globex"
    assert read(globex / "cpu.max") == "50000 100000"
    assert read(globex / "memory.max") == "max"  # absent limits are lifted, not left as they were
    assert read(globex / "pids.max") == "max"
    assert read(globex / "io.weight") == "default 100"
    # A leaf holds processes, so it never enables controllers; the worker wrote its own pid into it.
    assert not (acme / "shop" / "cgroup.subtree_control").exists()
    shop = d.workers("acme", "shop", "green")
    assert [w["state"] for w in shop] == ["running"]
    assert read(acme / "shop" / "cgroup.procs") == str(shop[0]["pid"])
    # The front reaches the worker by Host header; the port in Host is ignored.
    code, body, _ = d.get(f"shop.localhost:{d.port}")
    assert code == 200
    assert f"worker acme.shop.green.1 pid {shop[0]['pid']}" in body
    code, body, _ = d.get("nobody.localhost")
    assert code == 404
    # A new user (no cookie) is born on the group's reception, its first routable worker.
    seen = {d.get("blog.localhost")[1].split()[1] for _ in range(4)}
    assert seen == {"globex.blog.main.1"}
    assert oct(d.admin.stat().st_mode & 0o777) == "0o600"  # root only, unless admin_group
    status = d.status()
    assert status["cgroups"]["enforced"] is True
    assert status["cgroups"]["missing_controllers"] == []
    assert "STATUS" in d.notify.wait_for("READY", "1")


def test_status_table_and_check(daemons, tmp_path):
    d = daemons(tenants(tmp_path))
    d.start()
    table = d.ctl("status")
    assert table.returncode == 0, table.stderr
    assert "acme.shop.green.1" in table.stdout and "running" in table.stdout
    assert "enforced under" in table.stdout
    import subprocess
    ok = subprocess.run([PYTHON, "-m", "elasticd.daemon", "--config", str(d.config_path), "--check"],
                        capture_output=True, text=True)
    assert ok.returncode == 0, ok.stderr
    bad = tmp_path / "bad.yaml"
    bad.write_text("tenants:\n  acme:\n    resources:\n      cpu: 15O%\n")
    refused = subprocess.run([PYTHON, "-m", "elasticd.daemon", "--config", str(bad), "--check"],
                             capture_output=True, text=True)
    assert refused.returncode == 1
    assert 'tenants.acme.resources.cpu (line 4): "15O%" is not a percentage' in refused.stderr


def test_sighup_rewrites_limits_and_keeps_unchanged_workers(daemons, tmp_path):
    d = daemons(tenants(tmp_path))
    d.start()
    shop_before = [w["pid"] for w in d.workers("acme", "shop", "green")]
    blog_before = [w["pid"] for w in d.workers("globex", "blog", "main")]
    d.write_config(tenants(tmp_path, globex_cpu="20%"))
    d.reload()
    assert read(d.cgroup / "tenants" / "globex" / "cpu.max") == "20000 100000"
    assert [w["pid"] for w in d.workers("acme", "shop", "green")] == shop_before
    assert [w["pid"] for w in d.workers("globex", "blog", "main")] == blog_before
    # A changed env replaces that group's workers (new pids), and only that group's.
    d.write_config(tenants(tmp_path, globex_cpu="20%", blog_color="red"))
    d.reload()
    blog_after = d.workers("globex", "blog", "main")
    assert {w["state"] for w in blog_after} == {"running"}
    assert not {w["pid"] for w in blog_after} & set(blog_before)
    assert [w["pid"] for w in d.workers("acme", "shop", "green")] == shop_before
    for pid in blog_before:
        assert _gone(pid)


def test_broken_reload_keeps_everything(daemons, tmp_path):
    d = daemons(tenants(tmp_path))
    d.start()
    before = [w["pid"] for w in d.workers("acme", "shop", "green")]
    d.config_path.write_text(d.config_path.read_text().replace("cpu: 150%", "cpu: 15O%"))
    ready = d.reload()
    assert "refused" in ready.get("STATUS", "")
    assert read(d.cgroup / "tenants" / "acme" / "cpu.max") == "150000 100000"
    assert [w["pid"] for w in d.workers("acme", "shop", "green")] == before
    assert "reload refused" in d.log_text()
    assert '"15O%" is not a percentage' in d.log_text()
    # The same through the admin API: exit 1 and the error on stderr.
    result = d.ctl("reload")
    assert result.returncode == 1
    assert "tenants.acme.resources.cpu" in result.stderr
    assert d.status()["last_reload"]["ok"] is False


def test_removed_app_is_drained_and_its_cgroup_removed(daemons, tmp_path):
    d = daemons(tenants(tmp_path))
    d.start()
    blog = [w["pid"] for w in d.workers("globex", "blog", "main")]
    # A request open on the removed app's worker when the reload comes: it finishes, then the worker stops.
    answer: dict[str, object] = {}
    slow = threading.Thread(target=lambda: answer.update(r=d.get("blog.localhost", "/sleep?ms=2000")))
    slow.start()
    time.sleep(0.5)
    text = tenants(tmp_path)
    d.write_config(text[: text.index("  globex:")])
    d.reload()
    assert "globex" not in d.status()["tenants"]
    assert d.get("blog.localhost")[0] == 404  # its routes went at once
    assert all(not _gone(pid, 0.1) for pid in blog)  # its worker waits for the open request
    slow.join(10)
    assert answer["r"][0] == 200 and "slept_ms" in answer["r"][1]
    for pid in blog:
        assert _gone(pid)
    deadline = time.monotonic() + 10
    while (d.cgroup / "tenants" / "globex").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not (d.cgroup / "tenants" / "globex").exists()


def test_killed_worker_is_restarted(daemons, tmp_path):
    d = daemons(tenants(tmp_path))
    d.start()
    [worker] = d.workers("acme", "shop", "green")
    os.kill(worker["pid"], signal.SIGKILL)
    [after] = d.wait_workers("acme", "shop", "green",
                             lambda ws: ws[0]["state"] == "running" and ws[0]["pid"] != worker["pid"])
    assert after["restarts"] == 1
    assert d.get("shop.localhost")[0] == 200


def test_sigterm_leaves_no_worker_behind(daemons, tmp_path):
    d = daemons(tenants(tmp_path))
    d.start()
    d.status()
    pids = set(d.seen_pids)
    assert len(pids) == 3
    mark = len(d.notify.messages)
    assert d.stop() == 0
    assert any(m.get("STOPPING") == "1" for m in d.notify.messages[mark:])
    assert d.leftover_workers() == []
    assert not d.admin.exists()


def test_required_mode_refuses_without_a_usable_base(daemons, tmp_path):
    d = daemons(tenants(tmp_path))
    (d.cgroup / "cgroup.controllers").unlink()
    d.start(wait_ready=False)
    assert d.process.wait(30) == 1
    assert "refusing to start" in d.log_text()


def test_auto_mode_serves_unenforced_with_one_warning(daemons, tmp_path):
    d = daemons(tenants(tmp_path), mode="auto")
    (d.cgroup / "cgroup.controllers").unlink()
    d.start()
    status = d.status()
    assert status["cgroups"]["enforced"] is False
    assert status["cgroups"]["warning"]
    assert d.get("shop.localhost")[0] == 200
    assert not (d.cgroup / "tenants").exists()


def _gone(pid: int, timeout: float = 10.0) -> bool:
    import psutil
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            return True
        time.sleep(0.05)
    return False


def test_a_tenant_without_a_user_is_warned_about_once_per_start(daemons, tmp_path):
    d = daemons(tenants(tmp_path))
    d.start()
    d.reload()
    text = d.log_text()
    assert text.count("2 tenants run as root: acme, globex: their workers can undo their own limits") == 1
