"""Run-time limits (ADR-0010): an operator squeezes or frees a tenant now, and chooses whether it outlives
elasticd.

- ``overrides``: the override request (validated with the config's own field table) and the limits in force
  (pure);
- ``splice``: the pure half of ``--persist``, the operator's YAML spliced at ruamel's node spans, and its proof;
- ``persist``: the file shell around the splice (lock, atomic replace, backup);
- ``runtime``: the daemon's side, which writes overrides at once and reloads after a persist.
"""
