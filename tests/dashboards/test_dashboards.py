"""Dashboards and the scrape config, offline: valid JSON, unique panel ids, committed JSON
equals the generator's output, every query parses (promql-parser) and names only metrics
that metrics.py exports. (tests/e2e/test_prometheus.py runs every query on live data.)"""
import json
import os
import re
import shutil
import subprocess

import pytest
import yaml

from hybrid_serve import metrics
from hybrid_serve.dashboards import build

DIR = os.path.dirname(build.__file__)
DASHBOARD_FILES = sorted(f for f in os.listdir(DIR) if f.endswith(".json"))


def _load(name):
    with open(os.path.join(DIR, name)) as f:
        return json.load(f)


def exported_series_names() -> set[str]:
    names = set()
    for fam in metrics.REGISTRY.collect():
        if fam.type == "histogram":
            names |= {f"{fam.name}_bucket", f"{fam.name}_sum", f"{fam.name}_count"}
        elif fam.type == "counter":
            names.add(f"{fam.name}_total")
        else:
            names.add(fam.name)
    return names


def grafana_to_promql(expr: str) -> str:
    return expr.replace("$__rate_interval", "1m").replace("$model_name", ".*").replace("$replica", ".*")


def test_every_generated_dashboard_is_committed():
    assert DASHBOARD_FILES == sorted(build.DASHBOARDS)
    assert build.main(["--check"]) == 0, "run: python -m hybrid_serve.dashboards.build"


@pytest.mark.parametrize("name", DASHBOARD_FILES)
def test_dashboard_structure(name):
    dash = _load(name)
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids))
    assert dash["uid"] and dash["title"] and dash["schemaVersion"] >= 36
    for panel in dash["panels"]:
        assert 0 <= panel["gridPos"]["x"] and panel["gridPos"]["x"] + panel["gridPos"]["w"] <= 24
        refs = [t["refId"] for t in panel.get("targets", [])]
        assert len(refs) == len(set(refs))
        assert panel["type"] == "row" or refs, f"panel {panel['title']!r} has no query"
    names = {v["name"] for v in dash["templating"]["list"]}
    assert {"datasource", "model_name", "replica"} <= names


@pytest.mark.parametrize("name", DASHBOARD_FILES)
def test_queries_parse_and_use_exported_metrics(name):
    promql_parser = pytest.importorskip("promql_parser")
    exported = exported_series_names()
    for panel in _load(name)["panels"]:
        for target in panel.get("targets", []):
            promql = grafana_to_promql(target["expr"])
            promql_parser.parse(promql)  # raises on a syntax error
            used = set(re.findall(r"\bhybrid_serve_[a-z0-9_]+", promql))
            assert used and used <= exported, (panel["title"], used - exported)
    for var in _load(name)["templating"]["list"]:
        used = set(re.findall(r"\bhybrid_serve_[a-z0-9_]+", var.get("query", "")))
        assert used <= exported


def test_dashboards_cover_the_issue_metrics():
    text = "".join(json.dumps(_load(n)) for n in DASHBOARD_FILES)
    for metric in ["time_to_first_token_seconds", "inter_token_latency_seconds", "e2e_request_latency_seconds",
                   "prompt_tokens_total", "generation_tokens_total", "requests_running", "requests_waiting",
                   "kv_cache_usage_ratio", "state_pool_usage_ratio", "prefix_cache_hit_tokens_total",
                   "preemptions_total", "router_decisions_total"]:
        assert f"hybrid_serve_{metric}" in text, metric
    assert "histogram_quantile(0.99" in text and "by (le, replica)" in text


def test_prometheus_scrape_config():
    path = os.path.join(DIR, "prometheus.yml")
    with open(path) as f:
        config = yaml.safe_load(f)
    jobs = {j["job_name"]: j for j in config["scrape_configs"]}
    assert jobs["hybrid-serve"]["metrics_path"] == "/metrics"
    assert jobs["hybrid-serve"]["static_configs"][0]["targets"] == ["127.0.0.1:8000"]
    assert "prom_metrics_service_discovery.json" in jobs["ray"]["file_sd_configs"][0]["files"][0]
    if shutil.which("promtool"):
        result = subprocess.run(["promtool", "check", "config", path], capture_output=True, text=True)
        assert result.returncode == 0, result.stdout + result.stderr
