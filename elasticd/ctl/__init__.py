"""elasticctl: the operator's command line, a client of the admin API on its Unix socket.

client.py (the socket, the one refusal idiom), commands.py (each command and the parser), render.py (the tables),
aliases.py (ADR-0010's elastic-limitcpu and friends). Importing it loads neither the cgroup layer nor the sampler:
elasticctl is short-lived.
"""

from __future__ import annotations

from .aliases import highcpu_main, highio_main, highram_main, limitcpu_main, limitio_main, limitram_main
from .client import DEFAULT_SOCKET, AdminClient, ApiError, CommandRefused
from .commands import main, parser
from .render import render_limits, render_pool, render_status

__all__ = ["DEFAULT_SOCKET", "AdminClient", "ApiError", "CommandRefused", "highcpu_main", "highio_main", "highram_main",
           "limitcpu_main", "limitio_main", "limitram_main", "main", "parser", "render_limits", "render_pool",
           "render_status"]
