"""What ``elasticctl upgrade`` prints and ``GET /v1/upgrade`` answers: how the last re-exec in place went (pure).

``outcome``: ``done`` (the new image took the state), ``fresh`` (it could not read the state: it started as a fresh
start does, the previous workers killed, and says why), ``failed`` (the exec itself failed: the old image kept
serving), ``refused`` (the preflight refused the installed elasticd: nothing was stopped). The accept gap is from
the moment the old image stopped accepting to the moment the new one accepts again: connections that came
meanwhile waited in the listening socket's backlog.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, Final

__all__ = ["DONE", "FAILED", "FRESH", "REFUSED", "NotKept", "UpgradeReport", "describe"]

DONE: Final = "done"
FRESH: Final = "fresh"
FAILED: Final = "failed"
REFUSED: Final = "refused"


@dataclass(frozen=True, slots=True)
class NotKept:
    worker: str
    verdict: str  # adoption.Verdict's value: gone, changed, removed; or "retiring"
    reason: str


@dataclass(frozen=True, slots=True)
class UpgradeReport:
    outcome: str
    generation: int  # re-execs this daemon process has been through, this one counted when it took place
    pid: int
    version_before: str
    version_after: str
    kept: tuple[str, ...] = ()  # workers adopted, serving on
    not_kept: tuple[NotKept, ...] = ()
    users_kept: int = 0
    users_dropped: int = 0
    connections: int = 0  # idle kept-alive client connections carried over
    tunnels: int = 0  # WebSocket tunnels carried over
    requests: int = 0  # requests awaiting their answer or not yet sent, carried over (answered by the new image)
    cut: int = 0  # requests in flight past the grace, their connections closed
    closed: int = 0  # client connections not carried
    waited: float = 0.0  # seconds the old image waited for requests in flight
    accept_gap: float | None = None
    wall: float | None = None  # from the request to the new image serving
    error: str | None = None
    notes: tuple[str, ...] = field(default=())

    def as_json(self) -> dict[str, Any]:
        return asdict(self)


def describe(report: dict[str, Any]) -> list[str]:
    """The report as lines for a terminal."""
    outcome = report.get("outcome")
    lines = []
    if outcome == REFUSED:
        return [f"upgrade refused, nothing was stopped: {report.get('error')}"]
    if outcome == FAILED:
        return [f"upgrade failed, elasticd {report.get('version_before')} serves on (pid {report.get('pid')}): "
                f"{report.get('error')}"]
    head = (f"upgraded in place: elasticd {report.get('version_before')} → {report.get('version_after')}, "
            f"pid {report.get('pid')} (re-exec {report.get('generation')})")
    if outcome == FRESH:
        head = (f"re-executed, but the state could not be taken ({report.get('error')}): started fresh, the previous "
                f"workers stopped; pid {report.get('pid')}")
    lines.append(head)
    kept = report.get("kept") or []
    lines.append(f"workers kept: {len(kept)}" + (f" ({', '.join(kept[:8])}{', …' if len(kept) > 8 else ''})"
                                                 if kept else ""))
    for item in report.get("not_kept") or []:
        lines.append(f"  not kept: {item.get('worker')}: {item.get('verdict')}: {item.get('reason')}")
    lines.append(f"users kept: {report.get('users_kept', 0)}, placed anew: {report.get('users_dropped', 0)}")
    lines.append(f"connections carried: {report.get('connections', 0)}, WebSocket tunnels: {report.get('tunnels', 0)}, "
                 f"requests in flight: {report.get('requests', 0)}; cut past the grace: "
                 f"{report.get('cut', 0)}, not carried: {report.get('closed', 0)}")
    gap, wall = report.get("accept_gap"), report.get("wall")
    if gap is not None:
        lines.append(f"accept gap: {gap * 1000:.0f} ms (new connections waited, none refused); whole step "
                     f"{wall:.2f} s, of which {report.get('waited', 0.0):.2f} s waiting for requests in flight"
                     if wall is not None else f"accept gap: {gap * 1000:.0f} ms")
    for note in report.get("notes") or []:
        lines.append(f"note: {note}")
    return lines
