"""Accounting (issue #4): sample every tenant and app cgroup, export the samples as metrics, and measure
usage over an interval for ``elasticctl high``.

parse.py, sample.py, usage.py, high.py are pure; files.py and sampler.py are the I/O shell.
"""

from __future__ import annotations
