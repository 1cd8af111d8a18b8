"""A Prometheus histogram's buckets from per-bucket counts: the front's request latency and the pool's move
durations keep one count per bucket (cheap to add to), the exposition wants them cumulated, by ``le``."""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["cumulative_buckets"]


def cumulative_buckets(bounds: Sequence[float], counts: Sequence[int],
                       total: int | None = None) -> list[tuple[str, float]]:
    """``counts``: one per bound, then the one past the last (``+Inf``). ``total``: the observation count, when
    it is kept apart and may run ahead of a copy of the buckets taken a moment earlier (+Inf is then never
    under it)."""
    if len(counts) != len(bounds) + 1:
        raise ValueError(f"{len(counts)} counts for {len(bounds)} bounds (one more is +Inf)")
    out: list[tuple[str, float]] = []
    running = 0
    for bound, n in zip(bounds, counts, strict=False):
        running += n
        out.append((repr(bound), running))
    running += counts[-1]
    out.append(("+Inf", max(running, total) if total is not None else running))
    return out
