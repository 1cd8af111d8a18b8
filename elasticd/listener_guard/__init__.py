"""elasticd's own listeners (``metrics_listen``, ``agent_listen``) answer no tenant's process: ``sock_diag`` asks the
kernel whose a local peer's socket is, ``verdict`` decides (pure), ``guard`` sits in front of each listener."""
