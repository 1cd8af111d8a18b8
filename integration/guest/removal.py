"""Scenario 25, issue #42: ``apt-get remove elasticd`` with elasticd and its keeper running leaves nothing running —
no process in either unit's cgroup, the keeper's socket no longer listening — and keeps ``/etc/elastic.yaml`` (a
conffile). Then the .deb is installed again (``dpkg -i``: its Depends are still there), so that a scenario after
this one finds elasticd as the install left it.
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
    ensure_suite,
    keeper_pid,
    run,
    status,
    systemctl,
    timed,
    units_processes,
    wait_for,
    worker_pids,
)

KEEPER_SOCKET = Path("/run/elasticd-keeper/keeper.sock")


def s_remove() -> tuple[str, dict[str, Any]]:
    ensure_suite()
    workers = sum(len(pids) for pids in worker_pids(status()).values())
    keeper = keeper_pid()
    check(keeper and workers, f"nothing to remove: keeper {keeper}, {workers} workers")
    debs = sorted(Path("/tmp").glob("elasticd_*.deb"))
    check(debs, "the .deb 00-install copied to /tmp is not there")
    removed, seconds = timed(lambda: run(["apt-get", "remove", "-y", "elasticd"], timeout=600,
                                         env={"DEBIAN_FRONTEND": "noninteractive"}))
    try:
        check(removed.returncode == 0, f"apt-get remove failed:\n{removed.stdout[-2000:]}\n{removed.stderr[-2000:]}")
        left = wait_for(lambda: not units_processes(), 30, 0.5) or units_processes()
        check(left is True, f"processes left after apt-get remove: {left}")
        states = {unit: systemctl("is-active", unit).stdout.strip() for unit in (UNIT, KEEPER_UNIT, KEEPER_SOCKET_UNIT)}
        check(all(state in ("inactive", "unknown") for state in states.values()) and not KEEPER_SOCKET.exists(),
              f"after apt-get remove: {states}, {KEEPER_SOCKET} {'exists' if KEEPER_SOCKET.exists() else 'gone'}")
        check(CONFIG.exists(), f"apt-get remove took {CONFIG} (a conffile: only purge removes it)")
    finally:
        again = run(["dpkg", "-i", str(debs[0])], timeout=600, env={"DEBIAN_FRONTEND": "noninteractive"})
    check(again.returncode == 0, f"dpkg -i {debs[0].name} after the removal failed:\n{again.stderr[-2000:]}")
    return (f"apt-get remove with elasticd, its keeper (pid {keeper}) and {workers} workers running: {seconds:.1f}s, "
            f"then no process in either unit, {', '.join(f'{u} {s}' for u, s in states.items())}, the keeper's socket "
            f"gone, {CONFIG} kept; installed again with dpkg -i"), {"seconds": seconds, "states": states}
