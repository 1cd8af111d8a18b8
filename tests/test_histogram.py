"""Per-bucket counts cumulated into a Prometheus histogram's ``le`` buckets."""

from __future__ import annotations

import pytest

from elasticd.histogram import cumulative_buckets


@pytest.mark.parametrize(("counts", "total", "expected"), [
    ([0, 0, 0], None, [("0.1", 0), ("1.0", 0), ("+Inf", 0)]),
    ([2, 1, 3], None, [("0.1", 2), ("1.0", 3), ("+Inf", 6)]),
    ([2, 1, 3], 7, [("0.1", 2), ("1.0", 3), ("+Inf", 7)]),  # a count that ran ahead of the buckets' copy
    ([2, 1, 3], 5, [("0.1", 2), ("1.0", 3), ("+Inf", 6)]),  # never under the buckets
])
def test_counts_are_cumulated_by_bound(counts, total, expected):
    assert cumulative_buckets((0.1, 1.0), counts, total) == expected


def test_one_count_past_the_last_bound_is_required():
    with pytest.raises(ValueError, match="3 counts for 3 bounds"):
        cumulative_buckets((0.1, 1.0, 2.0), [1, 2, 3])
