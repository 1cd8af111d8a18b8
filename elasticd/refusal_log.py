"""When a refusal is worth a line in elasticd's log: at most once a minute per peer and reason (issue 27).

Pure: time is passed in. A hostile worker can make elasticd refuse something thousands of times a second; one
journal line each was its own flood (into the journal every tenant and the operator share). Here a peer's
refusal is said when that peer was not refused for that reason within the last ``quiet`` seconds, with the count
of its refusals left unsaid since its last line: so a steady attack is at most one line a minute for each reason
it is refused for. (Once per change of reason was not enough: a worker that reconnects in a loop alternates
between two reasons, and each change was a line.) The counts are never lost: the channel counts every refusal in
``elasticd_channel_refused_total`` whatever is logged.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

__all__ = ["QUIET", "RefusalLog", "Saying"]

QUIET: Final = 60.0  # seconds before the same refusal of the same peer is said again (with its count)


@dataclass(frozen=True, slots=True)
class Saying:
    """Say this refusal now; ``unsaid`` refusals of this peer (last of reason ``previous``) were not said."""

    unsaid: int
    previous: str | None


class _Said:
    __slots__ = ("at", "previous", "unsaid")

    def __init__(self) -> None:
        self.at: dict[str, float] = {}  # reason → when it was last said
        self.unsaid = 0  # refusals not said since the last line
        self.previous: str | None = None  # the reason of the last of them


class RefusalLog:
    __slots__ = ("_peers", "_quiet")

    def __init__(self, quiet: float = QUIET) -> None:
        self._peers: dict[str, _Said] = {}
        self._quiet = quiet

    def note(self, peer: str, reason: str, now: float) -> Saying | None:
        """A refusal of ``peer`` for ``reason``: what to say now, or None to say nothing (it is counted)."""
        said = self._peers.get(peer)
        if said is None:
            said = self._peers[peer] = _Said()
        last = said.at.get(reason)
        if last is not None and now - last < self._quiet:
            said.unsaid += 1
            said.previous = reason
            return None
        saying = Saying(said.unsaid, said.previous)
        said.at[reason] = now
        said.unsaid, said.previous = 0, None
        return saying

    def forget(self, peer: str) -> None:
        """The peer is gone for good (its worker exited): a new process starts with a clean slate."""
        self._peers.pop(peer, None)

    def __len__(self) -> int:
        return len(self._peers)
