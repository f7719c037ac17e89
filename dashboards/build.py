"""Grafana dashboards, generated from the panel lists below (committed as JSON beside this file).

    python -m hybrid_serve.dashboards.build        # rewrite dashboards/*.json
    python -m hybrid_serve.dashboards.build --check   # exit 1 if a committed file is stale

Queries use only `hybrid_serve_*` metrics (metrics.py), the `$datasource`, `$model_name`
and `$replica` variables and `$__rate_interval`.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import dataclass, field

HERE = os.path.dirname(os.path.abspath(__file__))
SEL = 'model_name=~"$model_name",replica=~"$replica"'
MODEL = 'model_name=~"$model_name"'
RATE = "$__rate_interval"


@dataclass
class Panel:
    title: str
    targets: list[tuple[str, str]]  # (expr, legend)
    unit: str = "short"
    description: str = ""
    width: int = 12
    kind: str = "timeseries"
    max: float | None = None


@dataclass
class Row:
    title: str
    panels: list[Panel] = field(default_factory=list)


def _quantiles(metric: str, by: str = "", qs=(0.5, 0.9, 0.99)) -> list[tuple[str, str]]:
    group = f"le, {by}" if by else "le"
    suffix = f" {{{{{by}}}}}" if by else ""
    return [(f"histogram_quantile({q}, sum by ({group}) (rate({metric}_bucket{{{SEL}}}[{RATE}])))",
             f"p{round(q * 100)}{suffix}") for q in qs]


def _ratio(num: str, den: str, by: str = "") -> str:
    grp = f" by ({by})" if by else ""
    return f"sum{grp} (rate({num}[{RATE}])) / clamp_min(sum{grp} (rate({den}[{RATE}])), 1e-9)"


PREFIX_HITS = "hybrid_serve_prefix_cache_hit_tokens_total"
PREFIX_QUERIES = f"hybrid_serve_prefix_cache_queries_total{{{SEL}}}"
ROUTER_REASONS = "hybrid_serve_router_decision_reasons_total"

OVERVIEW = [
    Row("Latency", [
        Panel("Time to first token", _quantiles("hybrid_serve_time_to_first_token_seconds"), "s",
              "Arrival at the replica to the first output token.", width=8),
        Panel("Inter-token latency", _quantiles("hybrid_serve_inter_token_latency_seconds"), "s", width=8),
        Panel("End-to-end request latency", _quantiles("hybrid_serve_e2e_request_latency_seconds"), "s", width=8),
        Panel("Queue time", _quantiles("hybrid_serve_queue_time_seconds", qs=(0.5, 0.99)), "s", width=8),
    ]),
    Row("Throughput and load", [
        Panel("Tokens/s in and out", [
            (f"sum(rate(hybrid_serve_prompt_tokens_total{{{SEL}}}[{RATE}]))", "prompt (in)"),
            (f"sum(rate(hybrid_serve_generation_tokens_total{{{SEL}}}[{RATE}]))", "generated (out)")], "short",
              width=8),
        Panel("Requests running and waiting", [
            (f"sum(hybrid_serve_requests_running{{{SEL}}})", "running"),
            (f"sum(hybrid_serve_requests_waiting{{{SEL}}})", "waiting")], "short", width=8),
        Panel("Finished requests/s by reason", [
            (f"sum by (finish_reason) (rate(hybrid_serve_request_success_total{{{SEL}}}[{RATE}]))",
             "{{finish_reason}}")], "reqps", width=8),
        Panel("HTTP responses/s by status", [
            (f"sum by (route, status_code) (rate(hybrid_serve_http_requests_total{{{MODEL}}}[{RATE}]))",
             "{{route}} {{status_code}}")], "reqps", width=8),
    ]),
    Row("Cache", [
        Panel("KV and state pool usage", [
            (f"max(hybrid_serve_kv_cache_usage_ratio{{{SEL}}})", "KV pages (max over replicas)"),
            (f"max(hybrid_serve_state_pool_usage_ratio{{{SEL}}})", "state slots (max over replicas)")],
              "percentunit", max=1.0, width=8),
        Panel("Prefix cache hit ratio", [
            (_ratio(f'{PREFIX_HITS}{{{SEL},cache="checkpoint"}}', PREFIX_QUERIES), "reused (checkpoint)"),
            (_ratio(f'{PREFIX_HITS}{{{SEL},cache="kv"}}', PREFIX_QUERIES), "KV match")],
              "percentunit", "Hit tokens / queried prompt tokens.", max=1.0, width=8),
        Panel("Preemptions and pool leaks", [
            (f"sum(rate(hybrid_serve_preemptions_total{{{SEL}}}[{RATE}]))", "preemptions/s"),
            (f"sum(increase(hybrid_serve_pool_invariant_violations_total{{{SEL}}}[{RATE}]))",
             "idle checks failed (must stay 0)")], "short",
              "A failed idle check means pages or slots in use that no request or cached prefix holds.", width=8),
    ]),
    Row("Speculative decoding", [
        Panel("Draft acceptance rate", [
            (_ratio(f"hybrid_serve_spec_decode_num_accepted_tokens_total{{{SEL}}}",
                    f"hybrid_serve_spec_decode_num_draft_tokens_total{{{SEL}}}"), "accepted / drafted")],
              "percentunit", "Draft tokens kept / draft tokens verified.", max=1.0, width=8),
        Panel("Mean accepted length", [
            (f"1 + {_ratio(f'hybrid_serve_spec_decode_num_accepted_tokens_total{{{SEL}}}', f'hybrid_serve_spec_decode_num_drafts_total{{{SEL}}}')}",
             "tokens per verify row")], "short", "Tokens a verify row yields: accepted drafts + the target's own.",
              width=8),
        Panel("Accepted drafts/s by position", [
            (f"sum by (position) (rate(hybrid_serve_spec_decode_num_accepted_tokens_per_pos_total{{{SEL}}}[{RATE}]))",
             "draft {{position}}"),
            (f"sum(rate(hybrid_serve_spec_decode_num_draft_tokens_total{{{SEL}}}[{RATE}]))", "drafted")], "short",
              width=8),
    ]),
    Row("Routing", [
        Panel("Router decisions/s by replica", [
            (f"sum by (replica, policy) (rate(hybrid_serve_router_decisions_total{{{SEL}}}[{RATE}]))",
             "{{replica}} ({{policy}})")], "reqps", width=12),
        Panel("Prefix-aware placements/s by reason", [
            (f"sum by (reason) (rate({ROUTER_REASONS}{{{SEL}}}[{RATE}]))", "{{reason}}")], "reqps",
              "prefix / session: placed by cached prefix or session; pow2: nothing matched; imbalance: the best "
              "match was overloaded; fallback: the Router actor unreachable (power of two).", width=12),
        Panel("Prefix-hit tokens per request: predicted vs realized", [
            (_ratio(f"hybrid_serve_router_predicted_hit_tokens_total{{{SEL}}}", f"{ROUTER_REASONS}{{{SEL}}}"),
             "predicted by the router"),
            (_ratio(f'{PREFIX_HITS}{{{SEL},cache="checkpoint"}}', f"hybrid_serve_request_success_total{{{SEL}}}"),
             "realized (reused up to a checkpoint)")], "short",
              "A router that over-promises on hybrid models shows predicted above realized.", width=8),
        Panel("Routing decision time (mean)", [
            (_ratio(f"hybrid_serve_router_decision_seconds_sum{{{SEL}}}",
                    f"hybrid_serve_router_decision_seconds_count{{{SEL}}}"), "per decision")], "s",
              "In the ingress process, from the local copy of the shared index (no Ray call).", width=8),
        Panel("Prefix index size and suffix drafts", [
            (f"max(hybrid_serve_router_index_blocks{{{SEL}}})", "prefix index blocks (max over routers)"),
            (f"max(hybrid_serve_router_index_replicas{{{SEL}}})", "replicas indexed"),
            (f"sum(rate(hybrid_serve_suffix_proposals_total{{{SEL}}}[{RATE}]))", "suffix drafts served/s"),
            (f"max(hybrid_serve_suffix_index_tokens{{{SEL}}})", "suffix index tokens (max copy)")], "short",
              width=8),
    ]),
]

PER_REPLICA = [
    Row("Per replica", [
        Panel("TTFT p50 by replica", _quantiles("hybrid_serve_time_to_first_token_seconds", "replica", (0.5,)), "s"),
        Panel("ITL p50 by replica", _quantiles("hybrid_serve_inter_token_latency_seconds", "replica", (0.5,)), "s"),
        Panel("Output tokens/s by replica", [
            (f"sum by (replica) (rate(hybrid_serve_generation_tokens_total{{{SEL}}}[{RATE}]))", "{{replica}}")]),
        Panel("Running and waiting by replica", [
            (f"sum by (replica) (hybrid_serve_requests_running{{{SEL}}})", "running {{replica}}"),
            (f"sum by (replica) (hybrid_serve_requests_waiting{{{SEL}}})", "waiting {{replica}}")]),
        Panel("KV pool usage by replica", [
            (f"hybrid_serve_kv_cache_usage_ratio{{{SEL}}}", "{{replica}}"),
            (f"hybrid_serve_kv_cache_prefix_cached_ratio{{{SEL}}}", "prefix cache {{replica}}")],
              "percentunit", max=1.0),
        Panel("State pool usage by replica", [
            (f"hybrid_serve_state_pool_usage_ratio{{{SEL}}}", "{{replica}}"),
            (f"hybrid_serve_state_pool_prefix_cached_ratio{{{SEL}}}", "prefix cache {{replica}}")],
              "percentunit", max=1.0),
        Panel("Prefix hit ratio by replica", [
            (_ratio(f'{PREFIX_HITS}{{{SEL},cache="checkpoint"}}', PREFIX_QUERIES, "replica"), "{{replica}}")],
              "percentunit", max=1.0),
        Panel("Preemptions/s by replica", [
            (f"sum by (replica) (rate(hybrid_serve_preemptions_total{{{SEL}}}[{RATE}]))", "{{replica}}")]),
    ]),
]

DASHBOARDS = {
    "hybrid-serve-overview.json": ("hybrid-serve: overview", "hybrid-serve-overview", OVERVIEW),
    "hybrid-serve-replicas.json": ("hybrid-serve: per replica", "hybrid-serve-replicas", PER_REPLICA),
}


def _templating() -> dict:
    ds = {"type": "prometheus", "uid": "${datasource}"}

    def query_var(name: str, query: str) -> dict:
        return {"name": name, "label": name, "type": "query", "datasource": ds, "query": query,
                "definition": query, "refresh": 2, "includeAll": True, "multi": True, "allValue": ".*",
                "current": {"selected": True, "text": "All", "value": "$__all"}, "sort": 1}

    return {"list": [
        {"name": "datasource", "label": "Prometheus", "type": "datasource", "query": "prometheus",
         "current": {}, "hide": 0},
        query_var("model_name", "label_values(hybrid_serve_requests_running, model_name)"),
        query_var("replica", f"label_values(hybrid_serve_requests_running{{{MODEL}}}, replica)"),
    ]}


def _panel(panel: Panel, panel_id: int, x: int, y: int) -> dict:
    defaults: dict = {"unit": panel.unit, "min": 0}
    if panel.max is not None:
        defaults["max"] = panel.max
    return {
        "id": panel_id, "type": panel.kind, "title": panel.title, "description": panel.description,
        "datasource": {"type": "prometheus", "uid": "${datasource}"},
        "gridPos": {"h": 8, "w": panel.width, "x": x, "y": y},
        "fieldConfig": {"defaults": defaults, "overrides": []},
        "options": {"legend": {"displayMode": "list", "placement": "bottom", "showLegend": True},
                    "tooltip": {"mode": "multi", "sort": "desc"}},
        "targets": [{"refId": chr(ord("A") + i), "expr": expr, "legendFormat": legend, "range": True,
                     "datasource": {"type": "prometheus", "uid": "${datasource}"}}
                    for i, (expr, legend) in enumerate(panel.targets)],
    }


def dashboard(title: str, uid: str, rows: list[Row]) -> dict:
    panels, next_id, y = [], 1, 0
    for row in rows:
        panels.append({"id": next_id, "type": "row", "title": row.title, "collapsed": False,
                       "gridPos": {"h": 1, "w": 24, "x": 0, "y": y}, "panels": []})
        next_id, y, x = next_id + 1, y + 1, 0
        for panel in row.panels:
            if x + panel.width > 24:
                x, y = 0, y + 8
            panels.append(_panel(panel, next_id, x, y))
            next_id, x = next_id + 1, x + panel.width
        y += 8
    return {"title": title, "uid": uid, "tags": ["hybrid-serve"], "timezone": "browser", "editable": True,
            "schemaVersion": 39, "version": 1, "refresh": "10s", "time": {"from": "now-1h", "to": "now"},
            "annotations": {"list": []}, "templating": _templating(), "panels": panels}


def render_all() -> dict[str, str]:
    return {name: json.dumps(dashboard(*spec), indent=2) + "\n" for name, spec in DASHBOARDS.items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="fail if a committed dashboard differs")
    args = parser.parse_args(argv)
    stale = []
    for name, text in render_all().items():
        path = os.path.join(HERE, name)
        current = open(path).read() if os.path.exists(path) else None
        if current != text:
            stale.append(name)
            if not args.check:
                with open(path, "w") as f:
                    f.write(text)
    if args.check and stale:
        print(f"stale dashboards: {stale}; run python -m hybrid_serve.dashboards.build", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
