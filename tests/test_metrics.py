"""GET /metrics over HTTP on 127.0.0.1: counters written into a fake tree come back as exact sample lines,
and ``promtool check metrics`` (Debian package prometheus) has nothing to say about the page."""

from __future__ import annotations

import shutil
import subprocess

import aiohttp
import pytest

from elasticd import __version__
from elasticd.accounting.fake import FakeCgroup, write_fake_cgroup
from elasticd.accounting.sampler import Sampler
from elasticd.config.model import Address, Resources
from elasticd.metrics import MetricsServer

LIMITS = {
    "acme": Resources(cpu=150.0, memory=1 << 30, swap=0, pids=512, io_weight=200, io_read=50 << 20,
                      io_write=20 << 20),
    "initech": Resources(),  # all unlimited: only the swap limit (0) and the io weight (100) are exported
}


@pytest.fixture
def tree(tmp_path):
    acme = tmp_path / "tenants" / "acme"
    write_fake_cgroup(acme, FakeCgroup(
        usage_usec=2_500_000, user_usec=2_000_000, system_usec=500_000, nr_periods=1000, nr_throttled=25,
        throttled_usec=1_250_000, memory_current=536870912, swap_current=4096, memory_events={"max": 3, "oom": 1},
        pids_current=42, io={"8:0": (1 << 20, 2 << 20, 10, 20), "259:0": (1 << 20, 0, 5, 0)},
        pressure={"cpu": (1.5, 1_000_000, 0.25, 250_000), "memory": (0.0, 0, 0.0, 0),
                  "io": (2.0, 3_000_000, 1.0, 2_000_000)}))
    write_fake_cgroup(acme / "shop", FakeCgroup(usage_usec=1_000_000, user_usec=600_000, system_usec=400_000,
                                                memory_current=1000, pids_current=7))
    # A tenant whose group has only cpu.stat (no memory, pids or io controller; no PSI): nothing else shows.
    write_fake_cgroup(tmp_path / "tenants" / "initech", FakeCgroup(usage_usec=5, throttling=False),
                      only=("cpu.stat",))
    return {("tenant", "acme"): acme, ("app", "acme", "shop"): acme / "shop",
            ("tenant", "initech"): tmp_path / "tenants" / "initech"}


@pytest.fixture
async def server(tree):
    sampler = Sampler(sys_root="/nonexistent")
    sampler.set_targets(tree)
    sampler.sample_once(1.0)
    server = MetricsServer(Address("127.0.0.1", 0), sampler, lambda: LIMITS)
    await server.start()
    yield server
    await server.stop()
    sampler.close()


async def _get(server: MetricsServer, path: str = "/metrics") -> tuple[int, str, str]:
    async with aiohttp.ClientSession() as session, session.get(f"http://127.0.0.1:{server.port}{path}") as r:
        return r.status, r.headers.get("Content-Type", ""), await r.text()


EXPECTED_TENANT = """\
elasticd_tenant_cpu_usage_seconds_total{tenant="acme"} 2.5
elasticd_tenant_cpu_user_seconds_total{tenant="acme"} 2.0
elasticd_tenant_cpu_system_seconds_total{tenant="acme"} 0.5
elasticd_tenant_cpu_throttled_seconds_total{tenant="acme"} 1.25
elasticd_tenant_cpu_throttled_periods_total{tenant="acme"} 25.0
elasticd_tenant_cpu_periods_total{tenant="acme"} 1000.0
elasticd_tenant_memory_bytes{tenant="acme"} 5.36870912e+08
elasticd_tenant_memory_swap_bytes{tenant="acme"} 4096.0
elasticd_tenant_pids{tenant="acme"} 42.0
elasticd_tenant_io_read_bytes_total{tenant="acme"} 2.097152e+06
elasticd_tenant_io_write_bytes_total{tenant="acme"} 2.097152e+06
elasticd_tenant_io_read_operations_total{tenant="acme"} 15.0
elasticd_tenant_io_write_operations_total{tenant="acme"} 20.0
elasticd_tenant_memory_events_total{event="low",tenant="acme"} 0.0
elasticd_tenant_memory_events_total{event="high",tenant="acme"} 0.0
elasticd_tenant_memory_events_total{event="max",tenant="acme"} 3.0
elasticd_tenant_memory_events_total{event="oom",tenant="acme"} 1.0
elasticd_tenant_memory_events_total{event="oom_kill",tenant="acme"} 0.0
elasticd_tenant_pressure_cpu_waiting_seconds_total{tenant="acme"} 1.0
elasticd_tenant_pressure_cpu_stalled_seconds_total{tenant="acme"} 0.25
elasticd_tenant_pressure_memory_waiting_seconds_total{tenant="acme"} 0.0
elasticd_tenant_pressure_memory_stalled_seconds_total{tenant="acme"} 0.0
elasticd_tenant_pressure_io_waiting_seconds_total{tenant="acme"} 3.0
elasticd_tenant_pressure_io_stalled_seconds_total{tenant="acme"} 2.0
elasticd_tenant_cpu_limit_cores{tenant="acme"} 1.5
elasticd_tenant_memory_limit_bytes{tenant="acme"} 1.073741824e+09
elasticd_tenant_memory_swap_limit_bytes{tenant="acme"} 0.0
elasticd_tenant_pids_limit{tenant="acme"} 512.0
elasticd_tenant_io_weight{tenant="acme"} 200.0
elasticd_tenant_io_read_limit_bytes_per_second{tenant="acme"} 5.24288e+07
elasticd_tenant_io_write_limit_bytes_per_second{tenant="acme"} 2.097152e+07"""

EXPECTED_APP = """\
elasticd_app_cpu_usage_seconds_total{app="shop",tenant="acme"} 1.0
elasticd_app_cpu_user_seconds_total{app="shop",tenant="acme"} 0.6
elasticd_app_cpu_system_seconds_total{app="shop",tenant="acme"} 0.4
elasticd_app_memory_bytes{app="shop",tenant="acme"} 1000.0
elasticd_app_memory_swap_bytes{app="shop",tenant="acme"} 0.0
elasticd_app_pids{app="shop",tenant="acme"} 7.0
elasticd_app_io_read_bytes_total{app="shop",tenant="acme"} 0.0
elasticd_app_io_write_bytes_total{app="shop",tenant="acme"} 0.0
elasticd_app_io_read_operations_total{app="shop",tenant="acme"} 0.0
elasticd_app_io_write_operations_total{app="shop",tenant="acme"} 0.0
elasticd_app_memory_events_total{app="shop",event="low",tenant="acme"} 0.0
elasticd_app_memory_events_total{app="shop",event="high",tenant="acme"} 0.0
elasticd_app_memory_events_total{app="shop",event="max",tenant="acme"} 0.0
elasticd_app_memory_events_total{app="shop",event="oom",tenant="acme"} 0.0
elasticd_app_memory_events_total{app="shop",event="oom_kill",tenant="acme"} 0.0
elasticd_app_pressure_cpu_waiting_seconds_total{app="shop",tenant="acme"} 0.0
elasticd_app_pressure_cpu_stalled_seconds_total{app="shop",tenant="acme"} 0.0
elasticd_app_pressure_memory_waiting_seconds_total{app="shop",tenant="acme"} 0.0
elasticd_app_pressure_memory_stalled_seconds_total{app="shop",tenant="acme"} 0.0
elasticd_app_pressure_io_waiting_seconds_total{app="shop",tenant="acme"} 0.0
elasticd_app_pressure_io_stalled_seconds_total{app="shop",tenant="acme"} 0.0"""


def _lines_with(text: str, needle: str) -> list[str]:
    return [line for line in text.splitlines() if needle in line and not line.startswith("#")]


async def test_tenant_and_app_samples_come_back_exactly(server):
    status, content_type, text = await _get(server)
    assert status == 200
    assert content_type.startswith("text/plain") and "charset=utf-8" in content_type
    assert [line for line in _lines_with(text, 'tenant="acme"') if "elasticd_tenant_" in line] == \
        EXPECTED_TENANT.splitlines()
    assert _lines_with(text, "elasticd_app_") == EXPECTED_APP.splitlines()


async def test_missing_values_are_left_out_not_zero_or_nan(server):
    _, _, text = await _get(server)
    initech = _lines_with(text, 'tenant="initech"')
    assert initech == [
        'elasticd_tenant_cpu_usage_seconds_total{tenant="initech"} 5e-06',
        'elasticd_tenant_cpu_user_seconds_total{tenant="initech"} 0.0',
        'elasticd_tenant_cpu_system_seconds_total{tenant="initech"} 0.0',
        'elasticd_tenant_memory_swap_limit_bytes{tenant="initech"} 0.0',
        'elasticd_tenant_io_weight{tenant="initech"} 100.0',
    ]
    assert "NaN" not in text


async def test_own_process_build_info_and_sampler_metrics(server):
    _, _, text = await _get(server)
    assert f'elasticd_build_info{{version="{__version__}"}} 1.0' in text.splitlines()
    assert "elasticd_sampler_cgroups 3.0" in text.splitlines()
    assert any(line.startswith("elasticd_sampler_duration_seconds ") for line in text.splitlines())
    for family in ("process_cpu_seconds_total", "process_resident_memory_bytes", "python_info"):
        assert f"# TYPE {family} " in text


async def test_extra_collectors_are_served_and_other_paths_404(server):
    from prometheus_client.core import CounterMetricFamily

    class Front:
        def collect(self):
            family = CounterMetricFamily("elasticd_requests_total", "Requests.", labels=["tenant", "app", "code"])
            family.add_metric(["acme", "shop", "200"], 5)
            yield family

    class Broken:
        def collect(self):
            raise RuntimeError("boom")

    server.extra_collectors.extend([Broken(), Front()])
    status, _, text = await _get(server)
    assert status == 200
    assert 'elasticd_requests_total{app="shop",code="200",tenant="acme"} 5.0' in text.splitlines()
    assert (await _get(server, "/nothing"))[0] == 404


async def test_scrape_reads_no_file(server, tree):
    """The page serves the last pass: removing the tree changes nothing until the next tick."""
    for path in tree.values():
        shutil.rmtree(path, ignore_errors=True)
    _, _, text = await _get(server)
    assert 'elasticd_tenant_cpu_usage_seconds_total{tenant="acme"} 2.5' in text.splitlines()


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool not installed (apt-get install prometheus)")
async def test_promtool_check_metrics_finds_nothing(server):
    _, _, text = await _get(server)
    result = subprocess.run(["promtool", "check", "metrics"], input=text, capture_output=True, text=True,
                            timeout=60)
    assert (result.returncode, result.stdout + result.stderr) == (0, "")


def test_fast_exposition_is_byte_for_byte_generate_latest(tree):
    from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, Info, Summary, generate_latest
    from prometheus_client.core import GaugeMetricFamily

    from elasticd.accounting.exposition import expose
    from elasticd.accounting.tenant_metrics import AccountingCollector

    sampler = Sampler(sys_root="/nonexistent")
    sampler.set_targets(tree)
    sampler.sample_once(1.0)
    registry = CollectorRegistry()
    registry.register(AccountingCollector(sampler, lambda: LIMITS))
    # What other collectors may bring: escaping, _created samples, histograms, timestamps, info.
    Counter("odd_requests", 'Help with a \\ backslash\nand a newline.', ["path"], registry=registry).labels(
        'a "quoted" \\ path\nwith ünïcode').inc(3)
    Histogram("odd_latency_seconds", "Latency.", registry=registry).observe(0.2)
    Summary("odd_size_bytes", "Size.", registry=registry).observe(10)
    Gauge("odd_plain", "No labels.", registry=registry).set(1e22)
    Info("odd_build", "Info.", registry=registry).info({"version": "1"})

    class Stamped:
        def collect(self):
            family = GaugeMetricFamily("odd_stamped", "With a timestamp.", labels=["x"])
            family.add_metric(["y"], 1.5, timestamp=1700000000.5)
            yield family

    registry.register(Stamped())
    page = expose(registry.collect())
    assert page == generate_latest(registry)
    assert b"elasticd_tenant_cpu_usage_seconds_total" in page and b"odd_latency_seconds_bucket" in page
    sampler.close()


async def test_a_scrape_holds_the_collectors_full_passes_while_its_series_live(server):
    # Its series set off one full pass after another while they lived (heap.py): held for the scrape, given back after.
    import gc

    seen: list[tuple[int, int, int]] = []

    class Watching:
        def collect(self):
            seen.append(gc.get_threshold())
            return iter(())

    before = gc.get_threshold()
    server.extra_collectors.append(Watching())
    assert (await _get(server))[0] == 200
    assert seen and seen[0][:2] == before[:2] and seen[0][2] >= 1 << 30
    assert gc.get_threshold() == before
