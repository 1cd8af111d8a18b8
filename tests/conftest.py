from __future__ import annotations

import pytest
from harness import Daemon


@pytest.fixture
def daemons(tmp_path):
    """Make real elasticd daemons; each is stopped by pid at the end, and so is any worker it left behind."""
    made: list[Daemon] = []

    def make(tenants_yaml: str, **kwargs) -> Daemon:
        daemon = Daemon(tmp_path / f"d{len(made)}", tenants_yaml, **kwargs) if made else Daemon(
            tmp_path, tenants_yaml, **kwargs)
        made.append(daemon)
        return daemon

    yield make
    for daemon in made:
        daemon.stop()
        daemon.kill_leftovers()
