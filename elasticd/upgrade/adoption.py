"""Which of the previous image's workers the new one adopts (pure: the saved state, the new configuration's group
definitions and what lives now in, a verdict per worker out, each with its reason for the journal).

A worker is adopted only when its process is the one that was saved (its pid lives *and* started at the saved
time: after a reuse the pid is a stranger's) and its group's definition is unchanged. For any other worker the
new image does what a fresh start or a reload does for that part: a worker gone is not adopted (its group starts
to its floor as at a start), one whose group changed is stopped while the new definition starts, one whose group
was removed is stopped. Users stay on adopted workers with their state; the others' users are placed anew at their
next request, as after a restart.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass
from enum import StrEnum

from elasticd.upgrade.state import SavedState, SavedUser, SavedWorker

__all__ = ["Adoption", "Verdict", "plan_adoption"]


class Verdict(StrEnum):
    ADOPT = "adopt"  # the same process, its group unchanged: it keeps serving, its users with it
    GONE = "gone"  # its process is not there (exited, or its pid is another process now)
    CHANGED = "changed"  # its group's definition changed between the images: stopped, the new one starts
    REMOVED = "removed"  # its group is no longer in the configuration: stopped


@dataclass(frozen=True, slots=True)
class Adoption:
    workers: tuple[tuple[SavedWorker, Verdict, str], ...]
    users: tuple[SavedUser, ...]  # kept: on an adopted worker
    dropped_users: int  # on a worker not adopted: placed anew at their next request

    def of(self, verdict: Verdict) -> list[SavedWorker]:
        return [worker for worker, said, _ in self.workers if said is verdict]


def plan_adoption(saved: SavedState, groups: Mapping[str, str], alive: Mapping[int, int],
                  foreign: Collection[int] = ()) -> Adoption:
    """``groups``: "tenant/app/group" → the digest of its definition in the new configuration; ``alive``: pid →
    its process's start time, for the saved pids that exist now; ``foreign``: pids that live but are not the
    keeper's (the previous elasticd's own children, from a build before the keeper: replaced once)."""
    rows = []
    for worker in saved.workers:
        key = f"{worker.tenant}/{worker.app}/{worker.group}"
        started = alive.get(worker.pid)
        if started is None and worker.pid in foreign:
            rows.append((worker, Verdict.GONE, "started before the keeper (the previous elasticd's own child): "
                                               "replaced once"))
        elif started is None:
            rows.append((worker, Verdict.GONE, f"pid {worker.pid} is gone"))
        elif started != worker.started:
            rows.append((worker, Verdict.GONE, f"pid {worker.pid} is another process now (started at {started}, "
                                               f"not {worker.started})"))
        elif key not in groups:
            rows.append((worker, Verdict.REMOVED, f"group {key} is no longer configured"))
        elif groups[key] != worker.spec:
            rows.append((worker, Verdict.CHANGED, f"group {key}'s definition changed"))
        else:
            rows.append((worker, Verdict.ADOPT, "the same process, its group unchanged"))
    adopted = {worker.id for worker, verdict, _ in rows if verdict is Verdict.ADOPT}
    users = tuple(user for user in saved.users if user.worker in adopted)
    return Adoption(tuple(rows), users, len(saved.users) - len(users))
