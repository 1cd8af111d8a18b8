"""Accounting (issue #4, ADR-0010 "Accounting"): sample every tenant and app cgroup, export the samples as
metrics, and measure usage over an interval for ``GET /v1/tenants/usage`` and ``elasticctl high``.

Pure: parse.py (interface files → numbers), sample.py (texts → Sample), usage.py (two samples → usage),
high.py (usage → table), exposition.py (families → text). I/O shell: files.py (persistent descriptors),
sampler.py (the tick), tenant_metrics.py (the metric families over the latest tick); metrics.py serves them.
"""

from __future__ import annotations

from .high import ALIASES, SORTS, render_high
from .parse import Pressure
from .sample import FILES, Sample
from .sampler import Key, Sampler
from .usage import INTERVAL_MS_BOUNDS, measure, parse_apps_flag, parse_interval_ms, usage_between

__all__ = [
    "ALIASES",
    "FILES",
    "INTERVAL_MS_BOUNDS",
    "SORTS",
    "Key",
    "Pressure",
    "Sample",
    "Sampler",
    "measure",
    "parse_apps_flag",
    "parse_interval_ms",
    "render_high",
    "usage_between",
]
