"""Scenario 26, issue #42: ``apt-get remove elasticd`` with elasticd, its keeper and a worker running leaves nothing
running — no process in either unit's cgroup, the keeper's socket no longer listening — and keeps
``/etc/elastic.yaml`` (a conffile). The last scenario: the package is not installed again (the guest powers off next;
a reinstall under TCG took 2-3 minutes of CI's time).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from common import (
    CONFIG,
    KEEPER_SOCKET_UNIT,
    KEEPER_UNIT,
    UNIT,
    check,
    keeper_pid,
    run,
    small_config,
    start_with,
    status,
    systemctl,
    timed,
    units_processes,
    wait_for,
    worker_pids,
)

KEEPER_SOCKET = Path("/run/elasticd-keeper/keeper.sock")


def s_remove() -> tuple[str, dict[str, Any]]:
    start_with(small_config("required"))  # (one worker: what is stopped matters, not how many)
    wait_for(lambda: sum(len(pids) for pids in worker_pids(status()).values()), 60, 0.5)
    workers = sum(len(pids) for pids in worker_pids(status()).values())
    keeper = keeper_pid()
    check(keeper and workers, f"nothing to remove: keeper {keeper}, {workers} workers")
    removed, seconds = timed(lambda: run(["apt-get", "remove", "-y", "elasticd"], timeout=600,
                                         env={"DEBIAN_FRONTEND": "noninteractive"}))
    check(removed.returncode == 0, f"apt-get remove failed:\n{removed.stdout[-2000:]}\n{removed.stderr[-2000:]}")
    left = wait_for(lambda: not units_processes(), 30, 0.5) or units_processes()
    check(left is True, f"processes left after apt-get remove: {left}")
    states = {unit: systemctl("is-active", unit).stdout.strip() for unit in (UNIT, KEEPER_UNIT, KEEPER_SOCKET_UNIT)}
    check(all(state in ("inactive", "unknown") for state in states.values()) and not KEEPER_SOCKET.exists(),
          f"after apt-get remove: {states}, {KEEPER_SOCKET} {'exists' if KEEPER_SOCKET.exists() else 'gone'}")
    check(CONFIG.exists(), f"apt-get remove took {CONFIG} (a conffile: only purge removes it)")
    return (f"apt-get remove with elasticd, its keeper (pid {keeper}) and {workers} workers running: {seconds:.1f}s, "
            f"then no process in either unit, {', '.join(f'{u} {s}' for u, s in states.items())}, the keeper's socket "
            f"gone, {CONFIG} kept"), {"seconds": seconds, "states": states}
