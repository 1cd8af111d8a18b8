from __future__ import annotations

import subprocess
import sys

from elasticd.ctl import render_status

STATUS = {
    "version": "0.1.0", "pid": 42, "uptime": 125.0, "listen": "127.0.0.1:8080", "config": "/etc/elastic.yaml",
    "cgroups": {"mode": "auto", "enforced": True, "base": "/sys/fs/cgroup/elasticd.service",
                "missing_controllers": ["io"], "warning": None},
    "last_reload": {"ok": False, "error": "/etc/elastic.yaml:\ntenants.acme.resources.cpu (line 4): bad",
                    "problems": [], "at": "2026-11-30T12:00:00Z"},
    "tenants": {"acme": {"user": {"name": "shop", "uid": 1001, "group": "shop", "gid": 1001},
                         "limits": {"cpu": {"value": "50%", "source": "override", "config": "150%"},
                                    "memory": {"value": "1G", "source": "config"},
                                    "swap": {"value": "0B", "source": "config"},
                                    "pids": {"value": "max", "source": "config"},
                                    "io_weight": {"value": "default 100", "source": "config"},
                                    "io_bandwidth.read": {"value": "50M", "source": "config"},
                                    "io_bandwidth.write": {"value": "max", "source": "config"}},
                         "apps": {"shop": {"default_group": "green", "canary": {"group": "canary", "share": 0.1},
                                           "groups": {
        "green": {"sticky_users": 3, "workers": [{"id": "acme.shop.green.1", "pid": 7, "state": "running",
                                                  "uptime": 61.2, "restarts": 0}]},
        "canary": {"sticky_users": 0, "workers": []},
        "blue": {"sticky_users": 0, "workers": []}}}}}},
}


def test_status_table():
    text = render_status(STATUS)
    assert "enforced under /sys/fs/cgroup/elasticd.service (mode auto); missing controllers: io" in text
    assert "last reload: REFUSED" in text and "tenants.acme.resources.cpu (line 4): bad" in text
    lines = text.splitlines()
    header = next(i for i, line in enumerate(lines) if line.startswith("TENANT"))
    assert lines[header].split() == ["TENANT", "USER", "APP", "GROUP", "STICKY", "USERS", "WORKER", "PID", "STATE",
                                     "UPTIME", "RESTARTS"]
    assert lines[header + 1].split() == ["acme", "shop:shop", "shop", "green*", "3", "acme.shop.green.1", "7",
                                         "running", "1m01s", "0"]
    assert lines[header + 2].split() == ["acme", "shop:shop", "shop", "canary~10%", "0", "-", "-", "none", "(at",
                                         "zero)", "-", "-"]
    assert lines[header + 3].split() == ["acme", "shop:shop", "shop", "blue", "0", "-", "-", "none", "(at", "zero)",
                                         "-", "-"]


def test_status_shows_each_tenants_limits_and_marks_an_override_with_the_config_beneath():
    lines = render_status(STATUS).splitlines()
    header = next(i for i, line in enumerate(lines) if line.startswith("LIMITS"))
    assert lines[header].split() == ["LIMITS", "CPU", "MEMORY", "SWAP", "PIDS", "IO", "WEIGHT", "IO", "READ", "IO",
                                     "WRITE"]
    assert lines[header + 1].split() == ["acme", "50%*", "1G", "0B", "max", "default", "100", "50M", "max"]
    assert lines[header + 2].startswith("* an override until elasticd restarts")
    assert lines[header + 3] == "  acme cpu: 50% (the config says 150%)"


def test_status_says_when_the_limits_shown_are_not_enforced():
    status = {**STATUS, "cgroups": {"mode": "auto", "enforced": False, "base": None, "missing_controllers": [],
                                    "warning": "not in a delegated cgroup"}}
    text = render_status(status)
    assert "(not enforced here, as the cgroups line above says: these are the values elasticd would write)" in text


def _ctl(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "elasticd.ctl", *args], capture_output=True, text=True, timeout=30)


def test_usage_error_exits_2():
    assert _ctl("frobnicate").returncode == 2
    assert _ctl().returncode == 2


def test_unreachable_daemon_exits_1_with_the_reason(tmp_path):
    result = _ctl("--socket", str(tmp_path / "none.sock"), "status")
    assert result.returncode == 1
    assert f"cannot reach elasticd on {tmp_path / 'none.sock'}" in result.stderr
