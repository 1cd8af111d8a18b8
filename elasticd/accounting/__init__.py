"""Accounting (issue #4, ADR-0010 "Accounting"): sample every tenant and app cgroup, export the samples as
metrics, and measure usage over an interval for ``GET /v1/tenants/usage`` and ``elasticctl high``.

Pure: parse.py (interface files → numbers), sample.py (texts → Sample), usage.py (two samples → usage),
high.py (usage → table), exposition.py (families → text). I/O shell: files.py (persistent descriptors),
sampler.py (the tick), tenant_metrics.py (the metric families over the latest tick); metrics.py serves them.
"""

# Nothing is re-exported: `import elasticd.ctl` (elasticctl) reads high.py alone, and a re-export here would load
# the sampler and the cgroup layer into every short-lived command.
