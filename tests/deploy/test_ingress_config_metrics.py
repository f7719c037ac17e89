"""The app config, metrics merged across replicas and ingresses, the suffix index's feed,
routing stats, and the hop log (no Ray)."""
from __future__ import annotations

import asyncio
import json

import pytest

from hybrid_serve import metrics
from hybrid_serve.deploy.config import AppConfig
from hybrid_serve.deploy.server import LLMServerImpl, Started
from hybrid_serve.engine.admission import LoadView
from http_fakes import FakeEngine, make_client, sse_events


def test_app_config():
    with pytest.raises(ValueError, match="unknown hybrid-serve app args"):
        AppConfig.from_args({"replicaz": 2})
    with pytest.raises(ValueError, match="unknown engine_args"):
        AppConfig.from_args({"engine_args": {"max_num_seq": 2}})
    with pytest.raises(ValueError, match="replicas"):
        AppConfig.from_args({"replicas": 0})
    assert AppConfig().model_name == "demo"
    assert AppConfig(served_model_name="m").model_name == "m"


def test_metrics_merge_keeps_one_family_per_name():
    from prometheus_client.parser import text_string_to_metric_families

    a, b = metrics.EngineMetrics("demo", "ra"), metrics.EngineMetrics("demo", "rb")
    a.ttft.observe(0.01)
    b.ttft.observe(0.02)
    snap = metrics.snapshot()
    text = metrics.render([snap, []]).decode()
    assert text.count("# TYPE hybrid_serve_time_to_first_token_seconds histogram") == 1
    fams = {f.name: f for f in text_string_to_metric_families(text)}
    counts = [s for s in fams["hybrid_serve_time_to_first_token_seconds"].samples if s.name.endswith("_count")]
    assert {s.labels["replica"] for s in counts} >= {"ra", "rb"}


def test_metrics_merge_sums_a_series_several_ingresses_report():
    """Two ingress replicas each route to the same engine replica: the decisions and their
    histograms add up (the first process's copy alone undercounted); a gauge keeps one value."""
    from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
    from prometheus_client.parser import text_string_to_metric_families

    snaps = []
    for decisions, blocks in ((3, 10), (4, 99)):
        reg = CollectorRegistry()
        c = Counter("hybrid_serve_router_decisions", "d", ("replica",), registry=reg)
        g = Gauge("hybrid_serve_router_index_blocks", "b", ("replica",), registry=reg)
        h = Histogram("hybrid_serve_router_decision_seconds", "t", ("replica",), buckets=(0.001, 0.01), registry=reg)
        c.labels("engine-1").inc(decisions)
        g.labels("engine-1").set(blocks)
        for _ in range(decisions):
            h.labels("engine-1").observe(0.005)
        snaps.append(metrics.snapshot(reg))
    fams = {f.name: f for f in text_string_to_metric_families(metrics.render(snaps).decode())}
    values = {(s.name, s.labels.get("le")): s.value for f in fams.values() for s in f.samples}
    assert values[("hybrid_serve_router_decisions_total", None)] == 7
    assert values[("hybrid_serve_router_index_blocks", None)] == 10
    assert values[("hybrid_serve_router_decision_seconds_count", None)] == 7
    assert values[("hybrid_serve_router_decision_seconds_bucket", "0.01")] == 7
    assert values[("hybrid_serve_router_decision_seconds_bucket", "0.001")] == 0
    assert abs(values[("hybrid_serve_router_decision_seconds_sum", None)] - 0.035) < 1e-9


class _Hub:
    """The hub actor's `collect.remote`, answering from `answers` in turn: a collection, an
    exception to raise, or "hang" (never answers)."""

    def __init__(self, *answers) -> None:
        self.answers, self.excluded = list(answers), []
        self.collect = self

    def remote(self, exclude=None):
        self.excluded.append(exclude)
        answer = self.answers.pop(0)

        async def reply():
            if answer == "hang":
                await asyncio.sleep(3600)
            if isinstance(answer, Exception):
                raise answer
            return answer
        return reply()


def test_a_scrape_the_hub_cannot_answer_serves_the_last_collection_while_fresh(caplog):
    """An ingress's /metrics when the hub fails or hangs: the last collection (the engine
    replicas' series stay in Prometheus), not this process's metrics alone, and only while
    younger than the ttl; a warning says which."""
    from hybrid_serve.deploy.metrics_hub import HubReader

    first, second = [["engine-a"], ["engine-b"]], [["engine-a2"]]
    hub = _Hub(first, RuntimeError("hub restarting"), "hang", second, RuntimeError("gone"), RuntimeError("gone"))
    reader = HubReader(hub, "ingress:x", timeout_s=0.05, ttl_s=0.5)

    async def scrapes():
        got = [await reader.collect() for _ in range(5)]
        await asyncio.sleep(0.6)  # the last collection is now older than the ttl
        return got + [await reader.collect()]

    with caplog.at_level("WARNING", logger="hybrid_serve.deploy.metrics_hub"):
        got = asyncio.run(scrapes())
    assert got == [first, first, first, second, second, []]
    assert hub.excluded == ["ingress:x"] * 6  # its own snapshot comes from its process, not the hub
    warnings = [r.getMessage() for r in caplog.records]
    assert warnings.count("metrics hub unreachable; serving its last collection") == 3
    assert warnings[-1] == "metrics hub unreachable; serving this process's metrics only"


def test_finished_requests_feed_the_suffix_index(tokenizer):
    """Speculative method "suffix": each finished request's prompt and output ids go to the
    replica's suffix feed (then, batched, to the Router actor's cluster-wide index)."""
    class Feed:
        def __init__(self):
            self.documents = []

        def add_finished(self, prompt_ids, output_ids):
            self.documents.append((list(prompt_ids), list(output_ids)))

    client, engine = make_client(tokenizer)
    feed = Feed()
    client.server.attach_suffix_feed(feed)
    for stream in (False, True):
        assert client.post("/v1/completions", json={"prompt": "hi", "max_tokens": 3, "stream": stream}).status_code == 200
    assert feed.documents == [(engine.requests[0][1], [10, 11, 12]), (engine.requests[1][1], [10, 11, 12])]


def test_routing_stats_count_the_requests_the_reported_load_accounts_for():
    """The router matches its placements to `num_received_requests` and counts the rest
    itself (with the prefill it predicts): the replica reports those its engine has taken,
    plus those it refused, not every arrival (one still on its way to the engine would drop
    out of the router's count before its tokens are in the engine's load)."""
    from hybrid_serve.deploy.errors import GenerateError
    from hybrid_serve.deploy.server import GenerateRequest
    from hybrid_serve.engine.sampling_params import SamplingParams

    class Engine(FakeEngine):
        taken = 0

        def reported_load(self):
            return LoadView(0, self.taken, 7 * self.taken, 8, 8, 8, 8), self.taken

    async def scenario():
        engine = Engine(max_num_seqs=1)
        server = LLMServerImpl(AppConfig(max_waiting_requests=1), "r0", engine_factory=lambda c, r: engine)
        streams = [server.generate(GenerateRequest(f"q{i}", [1] * 9, SamplingParams(max_tokens=2))) for i in range(3)]
        assert isinstance(await streams[0].__anext__(), Started)
        assert isinstance(await streams[1].__anext__(), Started)
        stats = server.routing_stats()
        assert (stats["num_received_requests"], stats["num_waiting"]) == (0, 0)  # received, not yet taken
        assert isinstance(await streams[2].__anext__(), GenerateError)  # refused: in the count at once
        engine.taken = 1
        stats = server.routing_stats()
        assert (stats["num_received_requests"], stats["num_waiting_tokens"]) == (2, 7)
        for stream in streams[:2]:
            await stream.aclose()

    asyncio.run(scenario())
    plain = LLMServerImpl(AppConfig(), "r0", engine_factory=lambda c, r: FakeEngine())
    assert plain.routing_stats()["num_received_requests"] == 0  # an engine client without the count


def test_the_hop_log_marks_each_hop_of_a_request_on_one_clock(tokenizer, tmp_path, monkeypatch):
    # HYBRID_SERVE_HOP_LOG: the ingress and the replica mark a request's arrival, first and last
    # tokens; benchmarks/hop_report.py joins them with the client's marks by the response's id
    import time

    from hybrid_serve.benchmarks.hop_report import report
    from hybrid_serve.deploy import hop_log

    prefix = str(tmp_path / "hops")
    monkeypatch.setenv(hop_log.ENV, prefix)
    hop_log.reset()  # read the environment again
    try:
        client, _ = make_client(tokenizer)
        sent = time.monotonic()
        resp = client.post("/v1/completions", json={"prompt": [5, 6, 7], "max_tokens": 3, "stream": True})
        done = time.monotonic()
        rid = json.loads(sse_events(resp.text)[0])["id"]
        plain = client.post("/v1/completions", json={"prompt": [5, 6], "max_tokens": 2}).json()["id"]
    finally:
        monkeypatch.delenv(hop_log.ENV)
        hop_log.reset()
    with open(f"{prefix}.client", "w") as f:
        f.write(f"{sent:.6f} client send {rid}\n{done:.6f} client first {rid}\n{done:.6f} client last {rid}\n")
    rows = hop_log.read(sorted(tmp_path.glob("hops.*")))
    times = {(hop, event): t for t, hop, event, r in rows if r == rid}
    order = [("client", "send"), ("ingress", "in"), ("replica", "in"), ("ingress", "started"),
             ("replica", "first"), ("ingress", "first"), ("replica", "last"), ("ingress", "last"), ("client", "last")]
    assert set(times) == set(order) | {("client", "first")}
    assert [times[k] for k in order] == sorted(times[k] for k in order)
    assert {(hop, event) for _, hop, event, r in rows if r == plain} == {
        ("ingress", "in"), ("ingress", "started"), ("ingress", "last"),
        ("replica", "in"), ("replica", "first"), ("replica", "last")}
    out = report(rows)  # the streamed request: the only one the client marked
    assert out["requests"] == 1
    assert set(out["segments_ms"]) == {"client send -> ingress in", "ingress in -> replica in",
                                       "replica in -> replica first", "replica first -> ingress first",
                                       "ingress first -> client first", "replica last -> ingress last",
                                       "ingress last -> client last"}
    assert all(s["n"] == 1 and s["p50"] >= 0 for s in out["segments_ms"].values())
    assert out["arrivals_ms"]["client send"]["first"] == 0


def test_observe_many_records_what_observe_does():
    # the engine replica records a step's inter-token latencies at once (metrics.observe_many)
    from prometheus_client import CollectorRegistry, Histogram

    reg = CollectorRegistry()
    one = Histogram("one_seconds", "x", ["r"], buckets=(0.01, 0.1, 1.0), registry=reg).labels("a")
    many = Histogram("many_seconds", "x", ["r"], buckets=(0.01, 0.1, 1.0), registry=reg).labels("a")
    values = [0.0, 0.01, 0.010001, 0.05, 0.1, 0.1, 2.0, 0.5, 0.003]  # bounds themselves go in their bucket
    for v in values:
        one.observe(v)
    metrics.observe_many(many, values)
    metrics.observe_many(many, [])

    def samples(name):
        return {(s.name[len(name):], s.labels.get("le")): s.value for m in reg.collect() if m.name == name
                for s in m.samples}

    assert samples("one_seconds") == samples("many_seconds")
    assert samples("many_seconds")[("_bucket", "0.01")] == 3


def test_a_hop_log_that_cannot_be_opened_is_a_warning(tmp_path, monkeypatch, caplog):
    from hybrid_serve.deploy import hop_log

    monkeypatch.setenv(hop_log.ENV, str(tmp_path / "missing" / "hops"))  # no such directory
    hop_log.reset()
    try:
        with caplog.at_level("WARNING"):
            hop_log.mark("ingress", "in", "cmpl-1")  # no log, no error
            hop_log.mark("ingress", "last", "cmpl-1")
        assert caplog.text.count(hop_log.ENV) == 1  # warned once, not per mark
    finally:
        monkeypatch.delenv(hop_log.ENV)
        hop_log.reset()
