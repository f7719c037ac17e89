"""Metrics end to end: the exposition at GET /metrics covers every replica and passes
`promtool check metrics`; a real Prometheus with the committed scrape config scrapes it
under load; TTFT p50 per replica and every dashboard panel's query return data.

Needs the Debian package `prometheus` (binaries `prometheus`, `promtool`); skipped without."""
from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor

import httpx2 as httpx
import pytest
import yaml
from e2e_helpers import free_port, wait_http

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DASHBOARDS = os.path.join(REPO, "dashboards")
REQUIRED = [
    "hybrid_serve_time_to_first_token_seconds", "hybrid_serve_inter_token_latency_seconds",
    "hybrid_serve_e2e_request_latency_seconds", "hybrid_serve_queue_time_seconds",
    "hybrid_serve_prompt_tokens_total", "hybrid_serve_generation_tokens_total", "hybrid_serve_requests_running",
    "hybrid_serve_requests_waiting", "hybrid_serve_request_success_total", "hybrid_serve_kv_cache_usage_ratio",
    "hybrid_serve_state_pool_usage_ratio", "hybrid_serve_kv_cache_prefix_cached_ratio",
    "hybrid_serve_state_pool_prefix_cached_ratio", "hybrid_serve_prefix_cache_queries_total",
    "hybrid_serve_prefix_cache_hit_tokens_total", "hybrid_serve_preemptions_total",
    "hybrid_serve_router_decisions_total",
]
NEEDS_PROMETHEUS = pytest.mark.skipif(
    not (shutil.which("prometheus") and shutil.which("promtool")),
    reason="Prometheus is not installed: apt-get install -y --no-install-recommends prometheus")


def _families(text: str) -> dict[str, set[str]]:
    from prometheus_client.parser import text_string_to_metric_families

    out: dict[str, set[str]] = {}
    for fam in text_string_to_metric_families(text):
        out[fam.name] = {s.labels.get("replica", "") for s in fam.samples}
    return out


def _engine_replicas(served) -> set[str]:
    return _families(httpx.get(f"{served.base_url}/metrics").text)["hybrid_serve_requests_running"]


def _drive_load(served, rounds: int = 3) -> None:
    """Concurrent completions and chat streams until every replica served some."""
    def one(i: int) -> int:
        if i % 3 == 2:
            body = {"messages": [{"role": "user", "content": f"hi {i}"}], "max_tokens": 6, "stream": True}
            path = "/v1/chat/completions"
        else:
            body = {"prompt": f"load {i} " * (1 + i % 5), "max_tokens": 6, "temperature": 0.7, "seed": i}
            path = "/v1/completions"
        return httpx.post(f"{served.base_url}{path}", json=body, headers=served.headers, timeout=120).status_code

    replicas = _engine_replicas(served)
    for _ in range(rounds):
        with ThreadPoolExecutor(6) as pool:
            assert set(pool.map(one, range(18))) == {200}
        time.sleep(1.0)  # replicas push every 0.5 s
        text = httpx.get(f"{served.base_url}/metrics").text
        served_by = {line.split('replica="')[1].split('"')[0] for line in text.splitlines()
                     if line.startswith("hybrid_serve_router_decisions_total{") and float(line.split()[-1]) > 0}
        if replicas <= served_by:
            return
    pytest.fail(f"load did not reach every replica: {replicas} vs {served_by}")


def test_exposition_covers_every_replica(served):
    _drive_load(served, rounds=1)
    families = _families(httpx.get(f"{served.base_url}/metrics").text)
    names = {n if n in families else n.removesuffix("_total") for n in REQUIRED}
    missing = [n for n in names if n not in families]
    assert not missing
    replicas = families["hybrid_serve_requests_running"]
    assert len(replicas) == 2
    for name in names - {"hybrid_serve_router_decisions"}:
        assert replicas <= families[name], name


def _generation_counts(text: str) -> tuple[float, dict[str, float]]:
    """(router decisions over all engine replicas, HTTP 200s of generation routes by ingress replica)."""
    from prometheus_client.parser import text_string_to_metric_families

    decisions, ok = 0.0, {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name == "hybrid_serve_router_decisions_total":
                decisions += s.value
            elif (s.name == "hybrid_serve_http_requests_total" and s.labels["status_code"] == "200"
                  and s.labels["route"] != "/v1/models"):
                ok[s.labels["replica"]] = ok.get(s.labels["replica"], 0.0) + s.value
    return decisions, ok


def _settled_generation_counts(served, timeout_s: float = 20.0) -> tuple[float, dict[str, float]]:
    """`_generation_counts` once two reads a push interval and more apart agree: every process
    has pushed what it counted (a push delayed on a loaded machine would show one ingress's
    decisions without the answers it gave after)."""
    deadline = time.monotonic() + timeout_s
    last = _generation_counts(httpx.get(f"{served.base_url}/metrics").text)
    while True:
        time.sleep(1.0)  # every process pushes every 0.5 s
        now = _generation_counts(httpx.get(f"{served.base_url}/metrics").text)
        if now == last or time.monotonic() > deadline:
            return now
        last = now


def test_every_ingress_replica_is_counted(served):
    """The app runs 2 ingress replicas, each routing with its own router: every request is one
    decision in the exposition (the series both report for an engine replica are summed, not
    one of them dropped) and each ingress's HTTP answers are there under its own name."""
    assert served.ingress_replicas == 2
    before_decisions, before_ok = _settled_generation_counts(served)
    sent = 0
    for _ in range(4):
        _drive_load(served, rounds=1)
        sent += 18
        decisions, ok = _settled_generation_counts(served)
        per_ingress = {r: n - before_ok.get(r, 0.0) for r, n in ok.items()}
        if sum(1 for n in per_ingress.values() if n > 0) == 2:
            break
    assert sum(1 for n in per_ingress.values() if n > 0) == 2, per_ingress  # the proxy used both
    assert decisions - before_decisions == sum(per_ingress.values()) >= sent


@NEEDS_PROMETHEUS
def test_promtool_check_metrics(served):
    text = httpx.get(f"{served.base_url}/metrics").text
    result = subprocess.run(["promtool", "check", "metrics"], input=text, capture_output=True, text=True)
    assert result.returncode == 0 and not result.stdout.strip() and not result.stderr.strip(), \
        result.stdout + result.stderr


@pytest.fixture(scope="module")
def prometheus(served, tmp_path_factory):
    """A Prometheus with the committed scrape config, pointed at this app's port, 1 s scrapes."""
    tmp = tmp_path_factory.mktemp("prometheus")
    with open(os.path.join(DASHBOARDS, "prometheus.yml")) as f:
        config = yaml.safe_load(f)
    config["global"]["scrape_interval"] = "1s"
    for job in config["scrape_configs"]:
        if job["job_name"] == "hybrid-serve":
            job["static_configs"] = [{"targets": [f"127.0.0.1:{served.port}"]}]
        for sd in job.get("file_sd_configs", []):
            sd["files"] = [str(tmp / "ray_targets.json")]
    (tmp / "prometheus.yml").write_text(yaml.safe_dump(config))
    port = free_port()
    log = open(tmp / "prometheus.log", "w")
    proc = subprocess.Popen(["prometheus", f"--config.file={tmp / 'prometheus.yml'}",
                             f"--storage.tsdb.path={tmp / 'data'}", f"--web.listen-address=127.0.0.1:{port}",
                             "--log.level=warn"], stdout=log, stderr=subprocess.STDOUT)
    try:
        url = f"http://127.0.0.1:{port}"
        wait_http(f"{url}/-/ready", 60)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()


def _query(url: str, expr: str) -> list[dict]:
    body = httpx.get(f"{url}/api/v1/query", params={"query": expr}, timeout=30).json()
    assert body["status"] == "success", (expr, body)
    return body["data"]["result"]


def _wait_for(url: str, expr: str, want: int, timeout_s: float = 30.0) -> list[dict]:
    deadline = time.monotonic() + timeout_s
    while True:
        result = [r for r in _query(url, expr) if math.isfinite(float(r["value"][1]))]
        if len(result) >= want or time.monotonic() > deadline:
            return result
        time.sleep(0.5)


def _panel_queries() -> list[tuple[str, str, str]]:
    out = []
    for name in sorted(os.listdir(DASHBOARDS)):
        if name.endswith(".json"):
            with open(os.path.join(DASHBOARDS, name)) as f:
                for panel in json.load(f)["panels"]:
                    for target in panel.get("targets", []):
                        out.append((name, panel["title"], target["expr"]))
    return out


def grafana_to_promql(expr: str) -> str:
    return expr.replace("$__rate_interval", "1m").replace("$model_name", ".*").replace("$replica", ".*")


@NEEDS_PROMETHEUS
def test_prometheus_ttft_per_replica_and_dashboards(served, prometheus):
    replicas = _engine_replicas(served)
    assert len(replicas) == 2, replicas
    assert _wait_for(prometheus, 'up{job="hybrid-serve"} == 1', 1), "Prometheus never scraped the app"
    time.sleep(1.5)  # a scrape before the load, so rates see it
    _drive_load(served)
    p50 = "histogram_quantile(0.5, sum by (le, replica) (rate(hybrid_serve_time_to_first_token_seconds_bucket[1m])))"
    result = _wait_for(prometheus, p50, len(replicas))
    assert {r["metric"]["replica"] for r in result} == replicas
    assert all(0 < float(r["value"][1]) < 60 for r in result)
    # Each panel's query until it has returned data once. On a loaded 2-core machine a scrape
    # can outlast the 1 s scrape timeout: Prometheus then ends every series of the target
    # until its next scrape, and a gauge queried in between has no value (rates keep theirs).
    empty = _panel_queries()
    deadline = time.monotonic() + 30
    while empty and time.monotonic() < deadline:
        empty = [(dashboard, title, expr) for dashboard, title, expr in empty if not any(
            math.isfinite(float(r["value"][1])) for r in _query(prometheus, grafana_to_promql(expr)))]
        if empty:
            time.sleep(0.5)
    scrapes = _query(prometheus, 'count_over_time(up{job="hybrid-serve"}[10m])')
    ok = _query(prometheus, 'sum_over_time(up{job="hybrid-serve"}[10m])')
    assert not empty, (f"panels without data ({ok[0]['value'][1]} of {scrapes[0]['value'][1]} scrapes answered "
                       "in time):\n" + "\n".join(f"{d} / {t}: {e}" for d, t, e in empty))
