"""Scenario 10, accounting (issue #4): a real Prometheus server (Debian's package, on loopback) scrapes elasticd's
/metrics while a tenant with ``cpu: 20%`` burns CPU through the front; ``rate(elasticd_tenant_cpu_usage_seconds_total
[30s])`` shows that tenant at its limit, ``elasticctl high`` ranks it first, and ``promtool check metrics`` finds
nothing to say about a real page.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import threading
import time
import urllib.parse
from pathlib import Path
from typing import Any

from common import (
    BASE,
    check,
    elasticctl,
    elasticctl_json,
    ensure_suite,
    front,
    http_get,
    read,
    read_kv,
    run,
    say,
    systemctl,
    wait_for,
)

METRICS_PORT = 9464  # server.metrics_listen of the suite's config
PROM_PORT = 9090
PROM_DIR = Path("/tmp/it-prometheus")
SCRAPE_INTERVAL = 2  # seconds
BURN_S = 40.0  # how long the tenant burns CPU
WINDOW = "30s"  # the range of the rate() the issue names
TENANT, APP, HOST = "cpu", "burn", "burn.localhost"  # the suite's tenant with cpu: 20%
LIMIT = 0.2  # cores
TOLERANCE = 0.25

RULES = "/usr/share/elasticd/prometheus/elasticd-rules.yml"  # the .deb's rules for the operator's Prometheus
PROM_CONFIG = f"""\
# The suite's Prometheus: elasticd's /metrics on loopback, every {SCRAPE_INTERVAL} s.
global:
  scrape_interval: {SCRAPE_INTERVAL}s
  scrape_timeout: {SCRAPE_INTERVAL}s
  evaluation_interval: {SCRAPE_INTERVAL}s
rule_files: [{RULES}]
scrape_configs:
  - job_name: elasticd
    static_configs:
      - targets: ["127.0.0.1:{METRICS_PORT}"]
"""


def _prom(path: str, **query: str) -> Any:
    """Prometheus' HTTP API: the ``data`` of a successful answer."""
    url = path + ("?" + urllib.parse.urlencode(query) if query else "")
    code, body = http_get(PROM_PORT, url)
    check(code == 200, f"Prometheus {url} answered {code}: {body[:300]!r}")
    answer = json.loads(body)
    check(answer.get("status") == "success", f"Prometheus {url}: {answer}")
    return answer["data"]


def _instant(expr: str, at: float) -> dict[str, float]:
    """An instant query at ``at`` (unix time): {tenant label (or ""): value}."""
    data = _prom("/api/v1/query", query=expr, time=f"{at:.3f}")
    check(data["resultType"] == "vector", f"{expr}: a {data['resultType']}, not a vector")
    return {r["metric"].get("tenant", ""): float(r["value"][1]) for r in data["result"]}


def _start_prometheus() -> tuple[subprocess.Popen, str, float]:
    """Debian's prometheus binary on our config, its own storage in /tmp, on 127.0.0.1 only; (process, its
    version line, seconds until it was ready and had scraped elasticd once)."""
    binary = shutil.which("prometheus")
    check(binary, "no prometheus binary: is the Debian package prometheus in integration/image/packages?")
    # The package enables its own prometheus.service (0.0.0.0:9090, its own config); the image masks it,
    # and if it runs anyway (an image without the mask) it is stopped so the port is ours.
    if systemctl("is-active", "--quiet", "prometheus.service").returncode == 0:
        systemctl("stop", "prometheus.service")
    version = run([binary, "--version"]).stdout.splitlines()[0]
    shutil.rmtree(PROM_DIR, ignore_errors=True)
    (PROM_DIR / "data").mkdir(parents=True)
    (PROM_DIR / "prometheus.yml").write_text(PROM_CONFIG)
    log = open(PROM_DIR / "prometheus.log", "wb")  # noqa: SIM115 - the process holds it; closed at the end
    start = time.monotonic()
    process = subprocess.Popen(
        [binary, f"--config.file={PROM_DIR / 'prometheus.yml'}", f"--storage.tsdb.path={PROM_DIR / 'data'}",
         f"--web.listen-address=127.0.0.1:{PROM_PORT}", "--log.level=warn"],
        stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)
    log.close()

    def ready() -> bool:
        if process.poll() is not None:
            return True  # exited: reported below
        try:
            return http_get(PROM_PORT, "/-/ready", timeout=5)[0] == 200
        except OSError:
            return False

    wait_for(ready, 90, 0.5)
    check(process.poll() is None, f"prometheus exited {process.returncode}: "
          f"{(PROM_DIR / 'prometheus.log').read_text()[-2000:]}")
    check(http_get(PROM_PORT, "/-/ready")[0] == 200, "prometheus was not ready within 90 s")

    def scraped() -> dict[str, Any] | None:
        targets = _prom("/api/v1/targets")["activeTargets"]
        return targets[0] if targets and targets[0]["health"] == "up" else None

    target = wait_for(scraped, 60, 0.5)
    check(target, f"prometheus never scraped elasticd: {_prom('/api/v1/targets')}")
    return process, version, time.monotonic() - start


def _rules_loaded() -> str:
    """The shipped rule groups as Prometheus loaded them: each rule evaluated without error."""
    def evaluated() -> list[dict[str, Any]] | None:
        groups = _prom("/api/v1/rules")["groups"]
        rules = [rule for group in groups for rule in group["rules"]]
        return groups if rules and all(rule.get("lastEvaluation", "").startswith("20") for rule in rules) else None

    groups = wait_for(evaluated, 60, 1) or _prom("/api/v1/rules")["groups"]
    rules = [rule for group in groups for rule in group["rules"]]
    bad = [f"{rule['name']}: {rule.get('health')} {rule.get('lastError', '')}" for rule in rules
           if rule.get("health") != "ok"]
    check({g["name"] for g in groups} == {"elasticd-recording", "elasticd-alerts"} and not bad,
          f"Prometheus' rules: groups {[g['name'] for g in groups]}, unhealthy {bad}")
    alerts = sum(1 for rule in rules if rule["type"] == "alerting")
    return f"{len(rules) - alerts} recording and {alerts} alerting rules, all healthy"


def _stop(process: subprocess.Popen) -> None:
    """By its pid: SIGTERM (it flushes its head block), SIGKILL after 30 s."""
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def _kernel_rate(cgroup: Path, seconds: float) -> float:
    """The cgroup's CPU over the next ``seconds``, in cores, from its cpu.stat."""
    usage0 = read_kv(cgroup / "cpu.stat")["usage_usec"]
    time.sleep(seconds)
    return (read_kv(cgroup / "cpu.stat")["usage_usec"] - usage0) / 1e6 / seconds


def _burn(deadline: float, codes: list[int | None]) -> None:
    """Back-to-back 1 s burns: a request at a time keeps the worker's event loop free between them, so it
    still reports over the channel (a single 40 s request would be a hung worker to the pool)."""
    while time.monotonic() < deadline:
        code, _ = front(HOST, "/cpu?ms=1000", timeout=120)
        codes.append(code)


def _promtool() -> tuple[str, int, int]:
    """`promtool check metrics` on a real page: (its output, the page's sample lines, its families)."""
    code, page = http_get(METRICS_PORT, "/metrics")
    check(code == 200, f"GET /metrics answered {code}")
    result = subprocess.run(["promtool", "check", "metrics"], input=page, capture_output=True, timeout=120)
    output = (result.stdout + result.stderr).decode(errors="replace").strip()
    check(result.returncode == 0 and not output, f"promtool check metrics: exit {result.returncode}:\n{output}")
    lines = page.decode().splitlines()
    samples = sum(1 for line in lines if line and not line.startswith("#"))
    families = sum(1 for line in lines if line.startswith("# TYPE "))
    return output, samples, families


def s_accounting() -> tuple[str, dict[str, Any]]:
    ensure_suite()
    tenant_cg = BASE / "tenants" / TENANT
    check(read(tenant_cg / "cpu.max") == "20000 100000", f"cpu.max of {TENANT} is {read(tenant_cg / 'cpu.max')!r}")
    process, version, ready_s = _start_prometheus()
    try:
        # The burn measures accounting, not a cold start: its app answers first (a restart just before, as the
        # scenarios before this one leave elasticd, can leave a worker of a 20 % tenant still starting under TCG:
        # a CI run's burn began ~10 s late and elasticctl high read every tenant idle).
        warm = wait_for(lambda: front(HOST, "/cpu?ms=1", timeout=60)[0] == 200, 120, 1)
        check(warm, f"{HOST} did not answer 200 within 120 s before the burn")
        say(f"    {version} ready and scraping in {ready_s:.1f}s; burning {TENANT} for {BURN_S:.0f}s")
        codes: list[int | None] = []
        usage0 = read_kv(tenant_cg / "cpu.stat")["usage_usec"]
        began, wall = time.monotonic(), time.time()
        burners = [threading.Thread(target=_burn, args=(began + BURN_S, codes)) for _ in range(2)]
        for t in burners:
            t.start()
        # A third into the burn, once the kernel shows the tenant burning: the operator's view, JSON and table.
        time.sleep(BURN_S / 6)
        burning = wait_for(lambda: _kernel_rate(tenant_cg, 2.0) >= LIMIT / 2, BURN_S / 3, 0)
        check(burning, f"the kernel's cpu.stat does not show {TENANT} burning {BURN_S / 2:.0f}s into the burn")
        high = elasticctl_json("high", "--interval-ms", "2000")
        table = elasticctl("high", "--interval-ms", "2000")
        for t in burners:
            t.join()
        ended = time.monotonic()
        usage1 = read_kv(tenant_cg / "cpu.stat")["usage_usec"]
        kernel_rate = (usage1 - usage0) / 1e6 / (ended - began)
        # The window [8 s, 38 s] of the burn, once Prometheus has scraped past its end.
        at = wall + BURN_S - 2
        time.sleep(max(0.0, wall + BURN_S + SCRAPE_INTERVAL + 1 - time.time()))
        rates = _instant(f"rate(elasticd_tenant_cpu_usage_seconds_total[{WINDOW}])", at)
        limits = _instant("elasticd_tenant_cpu_limit_cores", at)
        scrapes = _instant(f'count_over_time(up{{job="elasticd"}}[{WINDOW}])', at)
        ups = _instant(f'min_over_time(up{{job="elasticd"}}[{WINDOW}])', at)
        _, samples, families = _promtool()
        rules = _rules_loaded()
        recorded = _instant('tenant:elasticd_cpu_usage:ratio_rate2m', wall + BURN_S + SCRAPE_INTERVAL)
    finally:
        _stop(process)
    rules_check = run(["promtool", "check", "rules", RULES])
    check(rules_check.returncode == 0, f"promtool check rules {RULES}: {rules_check.stdout}{rules_check.stderr}")
    # (its 2-minute rate, evaluated every 30 s, spans the idle time before the 40 s burn too: the burning tenant's is
    # the highest, not its limit's whole)
    check(TENANT in recorded and recorded[TENANT] > 0 and recorded[TENANT] == max(recorded.values()),
          f"the shipped recording rule's ratio of each tenant's CPU to its limit: {recorded}")
    check(codes and all(c == 200 for c in codes), f"the burn's requests answered {codes}")
    check(TENANT in rates, f"no rate for tenant {TENANT}: {rates}")
    rate = rates[TENANT]
    ranked = sorted(rates.items(), key=lambda kv: -kv[1])
    runner_up = ranked[1] if len(ranked) > 1 else ("-", 0.0)
    n_scrapes = int(next(iter(scrapes.values()), 0))
    # elasticctl high: JSON (tenants in config order, each with cpu_percent) and the table (widest first).
    by_cpu = sorted(high["tenants"].items(), key=lambda kv: -(kv[1]["cpu_percent"] or 0.0))
    top, top_usage = by_cpu[0]
    rows = [line.split() for line in table.stdout.splitlines()[2:] if line.strip()]
    check(table.returncode == 0 and rows, f"elasticctl high exited {table.returncode}: {table.stderr.strip()}")
    figure = (f"{version.split(' (')[0]} scraped /metrics every {SCRAPE_INTERVAL}s ({n_scrapes} scrapes in the "
              f"window, all up); rate(elasticd_tenant_cpu_usage_seconds_total[{WINDOW}]) over the middle of a "
              f"{BURN_S:.0f}s burn: tenant {TENANT} {rate:.3f} cores = {rate / LIMIT:.0%} of its "
              f"elasticd_tenant_cpu_limit_cores {limits.get(TENANT, float('nan')):g} (kernel's cpu.stat over the "
              f"burn {kernel_rate:.3f}); first of {len(ranked)} tenants (next {runner_up[0]} {runner_up[1]:.3f}); "
              f"elasticctl high --json: {top} first at {top_usage['cpu_percent']:.1f}% / "
              f"{top_usage['cpu_limit_percent']:g}% (table's first row: {rows[0][0]}); promtool check metrics: "
              f"exit 0, no output ({samples} samples, {families} families); the shipped rules loaded "
              f"({rules}), `promtool check rules` {rules_check.stdout.strip().splitlines()[-1].strip()}, "
              f"tenant:elasticd_cpu_usage:ratio_rate2m of {TENANT} {recorded[TENANT]:.2f}")
    details = {"rates": rates, "limits": limits, "scrapes": scrapes, "kernel_rate": kernel_rate, "high": high,
               "high_table": table.stdout, "requests": len(codes), "prometheus_ready_s": ready_s}
    check(abs(rate - LIMIT) <= TOLERANCE * LIMIT, f"rate {rate:.3f} is not {LIMIT} ±{TOLERANCE:.0%}: {figure}")
    check(ranked[0][0] == TENANT, f"Prometheus does not rank {TENANT} first: {ranked}")
    check(abs(limits.get(TENANT, 0) - LIMIT) < 1e-9, f"elasticd_tenant_cpu_limit_cores: {limits}")
    check(ups and min(ups.values()) == 1, f"a scrape of elasticd failed in the window: min(up) {ups}")
    check(top == TENANT, f"elasticctl high --json ranks {top} first by cpu_percent: {by_cpu}")
    check(rows[0][0] == TENANT, f"elasticctl high's first row is {rows[0][0]}:\n{table.stdout}")
    check(top_usage["cpu_limit_percent"] == 20, f"elasticctl high gives the limit {top_usage['cpu_limit_percent']}")
    check(abs(top_usage["cpu_percent"] - 20) <= TOLERANCE * 20, f"elasticctl high measured {top} at "
          f"{top_usage['cpu_percent']}%, not 20% ±{TOLERANCE:.0%}")
    return figure, details
