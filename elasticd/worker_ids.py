"""The one place that knows a worker id's format: ``tenant.app.group.N``.

Tenant, app and group names match ``NAME_RE`` (no dot), so the id splits back without ambiguity. The id is
what the journal, the API, the metrics' ``worker`` label, the channel's announce and the socket name carry.
"""

from __future__ import annotations

from typing import NamedTuple

__all__ = ["WorkerId", "format_worker_id", "parse_worker_id"]


class WorkerId(NamedTuple):
    tenant: str
    app: str
    group: str
    number: int

    @property
    def group_key(self) -> tuple[str, str, str]:
        return (self.tenant, self.app, self.group)

    def __str__(self) -> str:
        return f"{self.tenant}.{self.app}.{self.group}.{self.number}"


def format_worker_id(tenant: str, app: str, group: str, number: int) -> str:
    return str(WorkerId(tenant, app, group, number))


def parse_worker_id(text: str) -> WorkerId | None:
    """The parts of ``text``; None when it is not a worker id."""
    parts = text.split(".")
    if len(parts) != 4 or not all(parts) or not (parts[3].isascii() and parts[3].isdigit()):
        return None
    return WorkerId(parts[0], parts[1], parts[2], int(parts[3]))
