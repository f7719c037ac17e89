"""Every Prometheus metric of hybrid-serve, in one registry, and the cluster-wide exposition.

Names are `hybrid_serve_*` with unit suffixes; every series carries `model_name` and
`replica` (the Serve replica that recorded it; for router decisions, the replica chosen).
Each Ray process has its own `REGISTRY`. Processes ship `snapshot()` (picklable metric
families) to the ingress, which `render`s all of them as one exposition for `GET /metrics`:

    engine replica ──snapshot()──▶ MetricsHub actor ◀── ingress: render(hub.collect() + own)

Recording goes through the bound helpers (`EngineMetrics`, `IngressMetrics`) so that a
replica's label values are set once. Dashboards (`dashboards/`) query only these names.
"""
from __future__ import annotations

import bisect
from collections import Counter as _Tally
from typing import Iterable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, disable_created_metrics
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.metrics_core import Metric

disable_created_metrics()  # no `_created` series: they double the exposition and confuse merging

PREFIX = "hybrid_serve_"
CONTENT_TYPE = CONTENT_TYPE_LATEST
LABELS = ("model_name", "replica")

# Fine below 100 ms so that a 10 ms TTFT lands between two close bounds.
LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.0075, 0.01, 0.0125, 0.015, 0.02, 0.025, 0.03, 0.04, 0.05, 0.06,
                   0.075, 0.1, 0.125, 0.15, 0.2, 0.25, 0.3, 0.4, 0.5, 0.75, 1.0, 1.5, 2.0, 2.5, 5.0, 7.5, 10.0,
                   20.0, 40.0, 80.0, 160.0, 640.0)
ITL_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.0075, 0.01, 0.0125, 0.015, 0.02, 0.025, 0.03, 0.04, 0.05, 0.075,
               0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 10.0)
E2E_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0,
               60.0, 120.0, 240.0, 480.0, 960.0, 1920.0)

REGISTRY = CollectorRegistry(auto_describe=True)


def _histogram(name: str, doc: str, buckets) -> Histogram:
    return Histogram(name, doc, LABELS, buckets=buckets, registry=REGISTRY)


def _counter(name: str, doc: str, extra: tuple[str, ...] = ()) -> Counter:
    return Counter(name, doc, LABELS + extra, registry=REGISTRY)


def _gauge(name: str, doc: str) -> Gauge:
    return Gauge(name, doc, LABELS, registry=REGISTRY)


def observe_many(histogram, amounts: list[float]) -> None:
    """`histogram.observe(a)` for each of `amounts` (a Histogram with its labels bound), as one
    increment of each bucket hit and one of the sum: a step's inter-token latencies of hundreds
    of streams (a few distinct values) for the price of a few observations, on the engine
    replica's report thread. Falls back to `observe` where prometheus_client's Histogram lacks
    the fields it reads."""
    bounds, buckets, total = (getattr(histogram, n, None) for n in ("_upper_bounds", "_buckets", "_sum"))
    if bounds is None or buckets is None or total is None or len(bounds) != len(buckets):
        for a in amounts:
            histogram.observe(a)
        return
    if not amounts:
        return
    total.inc(sum(amounts))
    for i, n in _Tally(bisect.bisect_left(bounds, a) for a in amounts).items():  # (observe: the first a <= bound)
        buckets[i].inc(n)


# ----- engine replica ---------------------------------------------------------------------
TIME_TO_FIRST_TOKEN = _histogram("hybrid_serve_time_to_first_token_seconds",
                                 "Arrival at the replica to the first output token, per request.", LATENCY_BUCKETS)
INTER_TOKEN_LATENCY = _histogram("hybrid_serve_inter_token_latency_seconds",
                                 "Time between two consecutive output tokens of a sequence.", ITL_BUCKETS)
E2E_REQUEST_LATENCY = _histogram("hybrid_serve_e2e_request_latency_seconds",
                                 "Arrival at the replica to the last output token, per request.", E2E_BUCKETS)
QUEUE_TIME = _histogram("hybrid_serve_queue_time_seconds",
                        "Arrival at the replica to first being scheduled, per sequence.", LATENCY_BUCKETS)
PROMPT_TOKENS = _counter("hybrid_serve_prompt_tokens_total", "Prompt tokens of admitted requests.")
GENERATION_TOKENS = _counter("hybrid_serve_generation_tokens_total", "Output tokens generated.")
REQUESTS_RUNNING = _gauge("hybrid_serve_requests_running", "Sequences in the running batch.")
REQUESTS_WAITING = _gauge("hybrid_serve_requests_waiting", "Sequences waiting to be scheduled.")
REQUEST_SUCCESS = _counter("hybrid_serve_request_success_total",
                           "Finished sequences, by finish reason (stop, length, abort, error).", ("finish_reason",))
KV_CACHE_USAGE = _gauge("hybrid_serve_kv_cache_usage_ratio", "Fraction of KV pages in use (0..1).")
STATE_POOL_USAGE = _gauge("hybrid_serve_state_pool_usage_ratio", "Fraction of recurrent-state slots in use (0..1).")
KV_PREFIX_CACHED = _gauge("hybrid_serve_kv_cache_prefix_cached_ratio",
                          "Fraction of KV pages the prefix cache holds (in use, no request's own; 0..1).")
STATE_PREFIX_CACHED = _gauge("hybrid_serve_state_pool_prefix_cached_ratio",
                             "Fraction of state slots the prefix cache holds as checkpoints (0..1).")
PREFIX_CACHE_QUERIES = _counter("hybrid_serve_prefix_cache_queries_total",
                                "Prompt tokens looked up in the prefix cache.")
PREFIX_CACHE_HIT_TOKENS = _counter(
    "hybrid_serve_prefix_cache_hit_tokens_total",
    "Prompt tokens found in the prefix cache: cache=kv is the longest KV match, cache=checkpoint the part "
    "reused (ending at a state checkpoint).", ("cache",))
PREEMPTIONS = _counter("hybrid_serve_preemptions_total", "Running sequences preempted for lack of cache.")
POOL_INVARIANT_VIOLATIONS = _counter(
    "hybrid_serve_pool_invariant_violations_total",
    "Idle-time checks where the KV pages or state slots in use were not exactly the prefix tree's (a leak).")
SPEC_DRAFTS = _counter("hybrid_serve_spec_decode_num_drafts_total",
                       "Speculative verify rows that carried drafts (one per request per verify step).")
SPEC_DRAFT_TOKENS = _counter("hybrid_serve_spec_decode_num_draft_tokens_total", "Speculative draft tokens verified.")
SPEC_ACCEPTED_TOKENS = _counter("hybrid_serve_spec_decode_num_accepted_tokens_total",
                                "Speculative draft tokens accepted (kept in the output).")
SPEC_ACCEPTED_PER_POS = _counter("hybrid_serve_spec_decode_num_accepted_tokens_per_pos_total",
                                 "Accepted draft tokens by draft position (0 = the first draft).", ("position",))

# ----- ingress / router -------------------------------------------------------------------
ROUTER_DECISIONS = _counter("hybrid_serve_router_decisions_total",
                            "Requests placed on a replica (replica = the one chosen), by routing policy.", ("policy",))
ROUTER_REASONS = _counter(
    "hybrid_serve_router_decision_reasons_total",
    "Placements by the prefix-aware router, by reason (prefix, session, pow2: nothing matched, imbalance: the "
    "best match was overloaded, fallback: the Router actor unreachable); replica = the one chosen.", ("reason",))
ROUTER_DECISION_TIME = _histogram("hybrid_serve_router_decision_seconds",
                                  "Time of one prefix-aware routing decision (in the ingress process).",
                                  (1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2, 2.5e-2, 0.1))
ROUTER_PREDICTED_HIT_TOKENS = _counter(
    "hybrid_serve_router_predicted_hit_tokens_total",
    "Prompt tokens the router predicted the chosen replica reuses (ending at a state checkpoint); compare "
    "with hybrid_serve_prefix_cache_hit_tokens_total{cache=\"checkpoint\"} of the same replica.")
ROUTER_INDEX_BLOCKS = _gauge("hybrid_serve_router_index_blocks",
                             "Blocks in the router's (local copy of the shared) prefix index, over all replicas.")
ROUTER_INDEX_REPLICAS = _gauge("hybrid_serve_router_index_replicas", "Replicas the router's prefix index tracks.")
SUFFIX_PROPOSALS = _counter("hybrid_serve_suffix_proposals_total",
                            "Draft proposals served from the local copy of the cluster-wide suffix index.")
SUFFIX_INDEX_TOKENS = _gauge("hybrid_serve_suffix_index_tokens",
                             "Tokens held by the local copy of the cluster-wide suffix index.")
HTTP_REQUESTS = _counter("hybrid_serve_http_requests_total",
                         "HTTP requests answered by the ingress (replica = the ingress replica).",
                         ("route", "status_code"))

FINISH_REASONS = ("stop", "length", "abort", "error")
# cumulative counters of LLMEngine.stats(), and the prefix of its per-draft-position counts
ENGINE_COUNTERS = ("prefix_query_tokens", "kv_hit_tokens", "checkpoint_hit_tokens", "preemptions",
                   "invariant_violations", "spec_verify_rows", "spec_draft_tokens", "spec_accepted_tokens")
SPEC_POSITION_KEY = "spec_accepted_tokens_pos"


def engine_counters(stats: dict) -> dict[str, int]:
    """The cumulative counters of an engine's `stats()` (0 for any it does not keep), the
    speculative per-position counts (`spec_accepted_tokens_pos<i>`) included."""
    counters = {k: int(stats.get(k, 0)) for k in ENGINE_COUNTERS}
    counters.update({k: int(v) for k, v in stats.items() if k.startswith(SPEC_POSITION_KEY)})
    return counters
PREFIX_CACHE_KINDS = ("kv", "checkpoint")


class EngineMetrics:
    """The metrics of one engine replica, with its label values bound. Every series is
    created at zero on construction, so dashboards show 0 rather than "no data"."""

    def __init__(self, model_name: str, replica: str) -> None:
        lv = (model_name, replica)
        self.ttft = TIME_TO_FIRST_TOKEN.labels(*lv)
        self.itl = INTER_TOKEN_LATENCY.labels(*lv)
        self.e2e = E2E_REQUEST_LATENCY.labels(*lv)
        self.queue_time = QUEUE_TIME.labels(*lv)
        self.prompt_tokens = PROMPT_TOKENS.labels(*lv)
        self.generation_tokens = GENERATION_TOKENS.labels(*lv)
        self.running = REQUESTS_RUNNING.labels(*lv)
        self.waiting = REQUESTS_WAITING.labels(*lv)
        self.success = {r: REQUEST_SUCCESS.labels(*lv, r) for r in FINISH_REASONS}
        self.kv_usage = KV_CACHE_USAGE.labels(*lv)
        self.state_usage = STATE_POOL_USAGE.labels(*lv)
        self.kv_prefix_cached = KV_PREFIX_CACHED.labels(*lv)
        self.state_prefix_cached = STATE_PREFIX_CACHED.labels(*lv)
        self.prefix_queries = PREFIX_CACHE_QUERIES.labels(*lv)
        self.prefix_hits = {k: PREFIX_CACHE_HIT_TOKENS.labels(*lv, k) for k in PREFIX_CACHE_KINDS}
        self.preemptions = PREEMPTIONS.labels(*lv)
        self.invariant_violations = POOL_INVARIANT_VIOLATIONS.labels(*lv)
        self.spec_drafts = SPEC_DRAFTS.labels(*lv)
        self.spec_draft_tokens = SPEC_DRAFT_TOKENS.labels(*lv)
        self.spec_accepted_tokens = SPEC_ACCEPTED_TOKENS.labels(*lv)
        self._lv = lv
        self._spec_per_pos: dict[int, Counter] = {}
        self.spec_accepted_at(0)  # the first draft position's series exists at 0 (other positions on first use)

    def spec_accepted_at(self, position: int) -> Counter:
        """The accepted-tokens counter of draft position `position` (created on first use)."""
        if position not in self._spec_per_pos:
            self._spec_per_pos[position] = SPEC_ACCEPTED_PER_POS.labels(*self._lv, str(position))
        return self._spec_per_pos[position]

    def add_counters(self, grew: dict[str, int]) -> None:
        """Add what the engine's counters (`engine_counters`) grew by since the last call."""
        self.prefix_queries.inc(grew["prefix_query_tokens"])
        self.prefix_hits["kv"].inc(grew["kv_hit_tokens"])
        self.prefix_hits["checkpoint"].inc(grew["checkpoint_hit_tokens"])
        self.preemptions.inc(grew["preemptions"])
        self.invariant_violations.inc(grew["invariant_violations"])
        self.spec_drafts.inc(grew["spec_verify_rows"])
        self.spec_draft_tokens.inc(grew["spec_draft_tokens"])
        self.spec_accepted_tokens.inc(grew["spec_accepted_tokens"])
        for key, n in grew.items():
            if key.startswith(SPEC_POSITION_KEY) and n:
                self.spec_accepted_at(int(key[len(SPEC_POSITION_KEY):])).inc(n)

    def finished(self, finish_reason: str | None) -> None:
        reason = finish_reason if finish_reason in self.success else "error"
        self.success[reason].inc()


ROUTER_REASON_LABELS = ("prefix", "session", "pow2", "imbalance", "fallback")


class RouterMetrics:
    """The prefix-aware router's metrics (deploy/request_router.py) and the suffix drafter's
    (actors/suffix_feed.py), `replica` bound to the process that records them (the ingress
    replica the router runs in; the engine replica for suffix proposals); decisions and
    predicted hits carry the chosen replica. Series exist at zero from construction."""

    def __init__(self, model_name: str, replica: str) -> None:
        lv = (model_name, replica)
        self.model_name = model_name
        self.decision_time = ROUTER_DECISION_TIME.labels(*lv)
        self.index_blocks = ROUTER_INDEX_BLOCKS.labels(*lv)
        self.index_replicas = ROUTER_INDEX_REPLICAS.labels(*lv)
        self.suffix_proposals = SUFFIX_PROPOSALS.labels(*lv)
        self.suffix_tokens = SUFFIX_INDEX_TOKENS.labels(*lv)
        for reason in ROUTER_REASON_LABELS:
            ROUTER_REASONS.labels(*lv, reason)
        ROUTER_PREDICTED_HIT_TOKENS.labels(*lv)

    def decision(self, chosen_replica: str, reason: str, predicted_hit_tokens: int, seconds: float) -> None:
        ROUTER_REASONS.labels(self.model_name, chosen_replica, reason).inc()
        ROUTER_PREDICTED_HIT_TOKENS.labels(self.model_name, chosen_replica).inc(predicted_hit_tokens)
        self.decision_time.observe(seconds)


class IngressMetrics:
    """The ingress's metrics: `replica` is this ingress replica for HTTP counts, and the
    chosen engine replica for router decisions."""

    def __init__(self, model_name: str, replica: str) -> None:
        self.model_name, self.replica = model_name, replica
        for route in ("/v1/completions", "/v1/chat/completions"):
            HTTP_REQUESTS.labels(model_name, replica, route, "200")
        self.router = RouterMetrics(model_name, replica)  # the router runs in this process: its series at 0

    def router_decision(self, chosen_replica: str, policy: str) -> None:
        ROUTER_DECISIONS.labels(self.model_name, chosen_replica, policy).inc()

    def http_request(self, route: str, status_code: int) -> None:
        HTTP_REQUESTS.labels(self.model_name, self.replica, route, str(status_code)).inc()


# ----- exposition -------------------------------------------------------------------------
def snapshot(registry: CollectorRegistry = REGISTRY) -> list[Metric]:
    """This process's hybrid_serve_* families (picklable: ship them through Ray)."""
    return [m for m in registry.collect() if m.name.startswith(PREFIX)]


class _Merged:
    def __init__(self, families: list[Metric]) -> None:
        self.families = families

    def collect(self) -> list[Metric]:
        return self.families


ADDITIVE_TYPES = ("counter", "histogram", "summary")


def merge(snapshots: Iterable[list[Metric]]) -> list[Metric]:
    """One family per name, with the samples of all snapshots. A series (name and labels) that
    several processes report is summed for counters, histograms and summaries (e.g. the
    decisions of each ingress replica's router for the same engine replica: together, the
    cluster's); for a gauge the first process's value is kept."""
    merged: dict[str, Metric] = {}
    index: dict[tuple, int] = {}  # series -> its position in its family's samples
    for families in snapshots:
        for fam in families:
            out = merged.get(fam.name)
            if out is None:
                out = merged[fam.name] = Metric(fam.name, fam.documentation, fam.type, fam.unit)
            elif out.type != fam.type:
                continue  # a process running other code: keep the first definition
            for s in fam.samples:
                key = (s.name, tuple(sorted(s.labels.items())))
                at = index.get(key)
                if at is None:
                    index[key] = len(out.samples)
                    out.samples.append(s)
                elif out.type in ADDITIVE_TYPES and not s.name.endswith("_created"):
                    out.samples[at] = out.samples[at]._replace(value=out.samples[at].value + s.value)
    return [merged[name] for name in sorted(merged)]


def render(snapshots: Iterable[list[Metric]]) -> bytes:
    """Text exposition (format 0.0.4) of all snapshots merged."""
    return generate_latest(_Merged(merge(snapshots)))
