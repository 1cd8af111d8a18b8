"""elasticd: a supervisor for multi-tenant Linux hosts."""

from __future__ import annotations

__version__ = "0.1.0"
