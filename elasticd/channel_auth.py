"""Who may speak for a worker on the channel: the check every peer passes before its first report is read.

A hostile tenant can connect to its own channel socket (it is in its workers' directory) and claim any worker id.
A peer is the worker it claims only when all four hold: it is on that worker's own tenant's socket (each tenant's
socket is in its own workers directory, and an id of another tenant is refused here as well); it knows that worker's
token (given to the worker's process alone, at its start, and compared in constant time); its uid is the
tenant's user (SO_PEERCRED: the kernel's word, not the peer's); and its pid is in the worker's process tree (so
that a second program of the same tenant cannot speak for the worker, even with a leaked token).
"""

from __future__ import annotations

import hmac

from elasticd.pool.proc_sensor import in_process_tree
from elasticd.supervisor.supervisor import Supervisor

__all__ = ["ChannelAuth"]


class ChannelAuth:
    __slots__ = ("_supervisor",)

    def __init__(self, supervisor: Supervisor) -> None:
        self._supervisor = supervisor

    def __call__(self, tenant: str, worker_id: str, token: str, pid: int, uid: int) -> str | None:
        """None when the peer is the worker it claims; else why not (the channel logs it and hangs up)."""
        worker = self._supervisor.find(worker_id)
        if worker is None or worker.tenant != tenant:
            return f"no worker {worker_id[:80]!r} of tenant {tenant} runs here"
        if not worker.token or not hmac.compare_digest(token.encode(), worker.token.encode()):
            return f"wrong token for worker {worker_id}"
        run_as = worker.spec.run_as
        if run_as is not None and uid != run_as.uid:
            return f"uid {uid} is not the uid of tenant {worker.tenant}'s user {run_as.user} ({run_as.uid})"
        if worker.pid is None or not in_process_tree(pid, worker.pid):
            return f"pid {pid} is not in the process tree of worker {worker_id}"
        return None
