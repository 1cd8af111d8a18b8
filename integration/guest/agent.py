"""Scenario 18, behind a balancer (issue #17): under systemd, HAProxy's agent-check is answered on
``server.agent_listen`` — ``up ready N%`` for the app its hint names, for the whole host without one — and
``systemctl stop`` with ``server.stop_drain`` answers ``drain`` first, for that long, while the front still serves
(the workers still in their leaf), then stops cleanly within the unit's timeout."""

from __future__ import annotations

import socket
import threading
import time
from pathlib import Path
from typing import Any

from common import (
    UNIT,
    browse,
    check,
    is_active,
    journal_cursor,
    journal_since,
    start_with,
    systemctl,
    tenant_user,
    wait_for,
)

TENANT, APP = "solo", "edge"
HOST = "agent.localhost"
ROOT = Path("/srv", TENANT, APP)
AGENT = ("127.0.0.1", 9465)
DRAIN = 4.0

CONFIG = """\
server:
  listen: 127.0.0.1:8080
  metrics_listen: 127.0.0.1:9464
  cgroups: {{mode: required}}
  stop_timeout: 5s
  occupancy_interval: 1s
  agent_listen: 127.0.0.1:9465
  stop_drain: {drain}s
tenants:
  {tenant}:
    user: {user}
    quotas: {{max_concurrent_requests: 32}}
    apps:
      {app}:
        domains: [{host}]
        root: {root}
        groups:
          main:
            command: ["{{python}}", "-m", "elasticd.demo"]
            pool: {{min_workers: 1, max_workers: 2}}
"""


def agent(send: bytes | None) -> str:
    """One check, as HAProxy makes it: connect, send the hint (if any), read the line."""
    with socket.create_connection(AGENT, timeout=10) as conn:
        if send is not None:
            conn.sendall(send)
        answer = b""
        while chunk := conn.recv(4096):
            answer += chunk
    return answer.decode()


def s_agent() -> tuple[str, dict[str, Any]]:
    ROOT.mkdir(parents=True, exist_ok=True)
    start_with(CONFIG.format(drain=int(DRAIN), tenant=TENANT, user=tenant_user(TENANT), app=APP, host=HOST,
                             root=ROOT))
    status, body, _ = browse(HOST, "/")
    check(status == 200, f"the app did not answer: {status} {body[-200:]!r}")
    line = agent(f"{HOST}\n".encode())
    check(line.startswith("up ready ") and "maxconn:32" in line and f"#{TENANT}/{APP}: room" in line,
          f"the agent's line for {HOST}: {line!r}")
    host_line = agent(None)
    check(host_line.startswith("up ready "), f"the agent's line for the host: {host_line!r}")
    check(agent(b"nobody.example\n").startswith("down #no app nobody.example"), "an unknown hint")

    cursor = journal_cursor()
    stopping: dict[str, Any] = {}

    def stop() -> None:
        began = time.monotonic()
        stopping["result"] = systemctl("stop", UNIT, timeout=120)
        stopping["seconds"] = time.monotonic() - began

    stopper = threading.Thread(target=stop)
    stopper.start()
    drained = wait_for(lambda: (answer := agent(f"{HOST}\n".encode())).startswith("drain") and answer, 10, 0.1)
    check(drained, "the agent did not answer drain once systemctl stop began")
    seen_at = time.monotonic()
    served = 0
    while time.monotonic() - seen_at < DRAIN - 1.5:  # still serving while it drains
        status, body, _ = browse(HOST, "/")
        check(status == 200, f"a request during the drain got {status}: {body[-200:]!r}")
        served += 1
        time.sleep(0.2)
    stopper.join(120)
    result = stopping["result"]
    check(result.returncode == 0, f"systemctl stop failed: {result.stderr.strip()}")
    check(not is_active(), "elasticd is still active after systemctl stop")
    check(stopping["seconds"] >= DRAIN, f"it stopped in {stopping['seconds']:.1f}s, before its {DRAIN:g}s drain")
    journal = journal_since(cursor)
    check("the agent answers drain for 4s first" in journal, f"no drain in the journal:\n{journal[-2000:]}")
    systemctl("start", UNIT)  # (left running for whatever comes next)
    return (f"agent line for {HOST}: {line.strip()!r}; for the host: {host_line.strip()!r}; systemctl stop "
            f"answered {drained.strip()!r} while the front served {served} more requests (all 200), and stopped "
            f"in {stopping['seconds']:.1f}s (stop_drain {DRAIN:g}s)",
            {"stop_seconds": stopping["seconds"], "served_while_draining": served})
