"""Scenario 11, run-time limits (issue #5): ``elasticctl limit`` on the real kernel and under systemd.

An override (no ``--persist``) is in the tenant's cpu.max when the command returns, survives a reload and is
gone after ``systemctl restart``. ``elasticctl limit acme --cpu 10% --persist`` changes cpu.max, edits exactly
one line of /etc/elastic.yaml (the previous file kept as ``.bak.<time>``), reloads through systemd (so
``systemctl status`` shows the reload) and survives ``systemctl restart``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from common import (
    BASE,
    CONFIG,
    UNIT,
    check,
    elasticctl,
    ensure_suite,
    journal_cursor,
    journal_since,
    main_pid,
    read,
    status,
    suite_config,
    systemctl,
    timed,
    wait_for,
    worker_pids,
    write_config,
)

SUITE_CPU = "50000 100000"  # acme and globex in the suite's config: cpu: 50%


def _cpu_max(tenant: str) -> str:
    return read(BASE / "tenants" / tenant / "cpu.max")


def _limit(*args: str) -> tuple[dict[str, Any], float]:
    result, seconds = timed(lambda: elasticctl("limit", *args, "--json"))
    check(result.returncode == 0, f"elasticctl limit {' '.join(args)} exited {result.returncode}: "
          f"{result.stderr.strip()[-1000:]}")
    return json.loads(result.stdout), seconds


def _cpu_source(tenant: str) -> dict[str, Any]:
    return status()["tenants"][tenant]["limits"]["cpu"]


def _backups() -> set[Path]:
    return set(CONFIG.parent.glob(CONFIG.name + ".bak.*"))


def s_limits() -> tuple[str, dict[str, Any]]:
    ensure_suite()
    check(_cpu_max("acme") == SUITE_CPU and _cpu_max("globex") == SUITE_CPU,
          f"cpu.max: acme {_cpu_max('acme')!r}, globex {_cpu_max('globex')!r}")
    main, pids0 = main_pid(), worker_pids(status())

    # An override: in the kernel when the command returns, shown as such, the config beneath it.
    override, override_s = _limit("globex", "--cpu", "30%")
    globex_now = _cpu_max("globex")
    check(globex_now == "30000 100000", f"globex cpu.max is {globex_now!r} when `elasticctl limit globex --cpu 30%` "
          "returned")
    check(override["limits"]["cpu"] == {"value": "30%", "source": "override", "config": "50%"},
          f"the reply shows {override['limits']['cpu']}")
    check(CONFIG.read_text() == suite_config(), "an override without --persist changed /etc/elastic.yaml")

    # --persist: the file, the kernel, a reload through systemd.
    before, backups0, cursor = CONFIG.read_text(), _backups(), journal_cursor()
    persisted, persist_s = _limit("acme", "--cpu", "10%", "--persist")
    acme_now = _cpu_max("acme")
    check(acme_now == "10000 100000", f"acme cpu.max is {acme_now!r} when `elasticctl limit acme --cpu 10% "
          "--persist` returned")
    check(persisted["persisted"] and persisted["limits"]["cpu"] == {"value": "10%", "source": "config"},
          f"the reply: {persisted}")
    new_backups = _backups() - backups0
    check(len(new_backups) == 1, f"expected one new {CONFIG}.bak.*, found {sorted(map(str, new_backups))}")
    (backup,) = new_backups
    check(str(backup) == persisted.get("backup"), f"the reply names the backup {persisted.get('backup')}, "
          f"the directory holds {backup}")
    check(backup.read_text() == before, f"{backup} is not the file as it was before the edit")
    old, new = backup.read_text().splitlines(), CONFIG.read_text().splitlines()
    differ = [i for i in range(max(len(old), len(new))) if i >= len(old) or i >= len(new) or old[i] != new[i]]
    check(len(old) == len(new) and len(differ) == 1, f"{CONFIG} and {backup.name} differ in lines "
          f"{[i + 1 for i in differ]} (lengths {len(old)}, {len(new)})")
    (line,) = differ
    check(old[line].replace("cpu: 50%", "cpu: 10%", 1) == new[line],
          f"line {line + 1} changed from {old[line]!r} to {new[line]!r}")

    def shown() -> str | None:
        text = systemctl("status", UNIT, "--no-pager", "-l", "-n", "30").stdout
        return text if "Reloaded elasticd.service" in text else None

    status_text = wait_for(shown, 10, 0.5)
    journal = journal_since(cursor)
    check(status_text, "`systemctl status elasticd` does not show the reload:\n"
          + systemctl("status", UNIT, "--no-pager", "-l", "-n", "30").stdout)
    reloaded = next(ln.strip() for ln in status_text.splitlines() if "Reloaded elasticd.service" in ln)
    reloaded = reloaded[reloaded.index("Reloaded elasticd.service"):].split(" - ")[0]  # without the description
    check("Reloading elasticd.service" in journal, f"the journal has no 'Reloading elasticd.service':\n{journal}")
    check(main_pid() == main, f"elasticd's pid changed: {main} → {main_pid()}")
    check(worker_pids(status()) == pids0, "a limits-only reload replaced workers")
    globex_after_reload = _cpu_max("globex")
    check(globex_after_reload == "30000 100000", f"globex's override did not survive the reload: cpu.max "
          f"{globex_after_reload!r}")

    # systemctl restart: the persisted value stays, the override is gone.
    # (acme's two workers start slowly under 10% of a CPU: READY=1 comes after the supervisor's 30 s start wait
    # with them still starting, which is how elasticd is meant to behave; they are not waited for here.)
    result, restart_s = timed(lambda: systemctl("restart", UNIT))
    check(result.returncode == 0, f"systemctl restart failed: {result.stderr.strip()}")
    acme_restart, globex_restart = _cpu_max("acme"), _cpu_max("globex")
    check(acme_restart == "10000 100000", f"after systemctl restart acme cpu.max is {acme_restart!r}")
    check(globex_restart == SUITE_CPU, f"after systemctl restart globex cpu.max is {globex_restart!r}: the "
          "override outlived elasticd")
    check(_cpu_source("globex") == {"value": "50%", "source": "config"}, f"globex: {_cpu_source('globex')}")
    check(_cpu_source("acme") == {"value": "10%", "source": "config"}, f"acme: {_cpu_source('acme')}")

    # Back to the suite's file (a reload: workers stay), so the next scenario finds what it expects.
    write_config(suite_config())
    restored = systemctl("reload", UNIT)
    check(restored.returncode == 0 and _cpu_max("acme") == SUITE_CPU,
          f"reload back to the suite's file: exit {restored.returncode}, acme cpu.max {_cpu_max('acme')!r}")
    figure = (f"override `limit globex --cpu 30%` ({override_s:.1f}s): cpu.max 50000→30000 on return, kept "
              f"across the next reload, back to 50000 after `systemctl restart`; `limit acme --cpu 10% --persist` "
              f"({persist_s:.1f}s): cpu.max 50000→10000 on return, {CONFIG} vs {backup.name}: 1 line differs "
              f"(line {line + 1}: \"{old[line].strip()}\" → \"{new[line].strip()}\"), reloaded through systemd "
              f"(`systemctl status` shows \"{reloaded}\"; elasticd pid and {sum(map(len, pids0.values()))} worker pids "
              f"kept); after `systemctl restart` ({restart_s:.1f}s) acme still 10000 100000")
    return figure, {"override": override, "persisted": persisted, "status": status_text, "journal": journal[-3000:]}
