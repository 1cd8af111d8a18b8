"""The rules shipped for the operator's Prometheus (packaging/prometheus/elasticd-rules.yml): valid to Debian's
promtool, each alert tested to fire and to stay quiet (tests/prometheus/elasticd-rules.test.yml), and every metric
they read one elasticd exports."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
from ruamel.yaml import YAML

ROOT = Path(__file__).resolve().parent.parent
RULES = ROOT / "packaging" / "prometheus" / "elasticd-rules.yml"
TESTS = ROOT / "tests" / "prometheus" / "elasticd-rules.test.yml"

needs_promtool = pytest.mark.skipif(shutil.which("promtool") is None,
                                    reason="promtool is not installed (Debian's prometheus: ./dev setup installs it)")


def _rules() -> list[dict]:
    return [rule for group in YAML(typ="safe").load(RULES.read_text())["groups"] for rule in group["rules"]]


@needs_promtool
def test_promtool_finds_the_rules_valid():
    result = subprocess.run(["promtool", "check", "rules", str(RULES)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(_rules())} rules found" in result.stdout


@needs_promtool
def test_every_alert_fires_on_its_series_and_stays_quiet_on_the_others():
    result = subprocess.run(["promtool", "test", "rules", str(TESTS)], capture_output=True, text=True, cwd=TESTS.parent)
    assert result.returncode == 0, result.stdout + result.stderr


def test_every_alert_and_recording_rule_has_a_test_each_way():
    tests = YAML(typ="safe").load(TESTS.read_text())["tests"]
    alert_cases = [case for test in tests for case in test.get("alert_rule_test", [])]
    recorded = {case["expr"] for test in tests for case in test.get("promql_expr_test", [])}
    for rule in _rules():
        if "alert" in rule:
            cases = [case for case in alert_cases if case["alertname"] == rule["alert"]]
            assert any(case["exp_alerts"] for case in cases), f"{rule['alert']}: no series fire it"
            assert any(not case["exp_alerts"] for case in cases), f"{rule['alert']}: no case where it stays quiet"
            annotations = rule["annotations"]
            assert "{{ $labels." in annotations["summary"] and annotations["description"], rule["alert"]
        else:
            assert rule["record"] in recorded, f"{rule['record']}: no test of its value"


def test_every_metric_the_rules_read_is_one_elasticd_exports():
    source = "\n".join(path.read_text() for path in (ROOT / "elasticd").rglob("*.py"))
    exported = set(re.findall(r'"(elasticd_[a-z_]+)"', source))
    exported |= {f"elasticd_tenant_{suffix}" for suffix in re.findall(r'\("([a-z_]+)", "', source)}  # (by suffix)
    exported |= {f"elasticd_tenant_{suffix}" for suffix in ("cpu_usage_seconds", "memory_bytes", "memory_events")}
    read = set()
    for rule in _rules():
        read |= set(re.findall(r"(?<![:\w])(elasticd_[a-z_]+)\b(?!:)", rule["expr"]))  # (not a recorded name)
    for name in sorted(read):
        assert name in exported or name.removesuffix("_total") in exported, f"{name} is not a metric of elasticd's"
