"""build_app: the Serve application of hybrid-serve (OpenAI-compatible HTTP).

Python::

    import ray
    from ray import serve
    from hybrid_serve.deploy.app import build_app

    ray.init()
    serve.start(http_options={"host": "127.0.0.1", "port": 8000})
    serve.run(build_app({"model": "/models/Qwen3.5-0.8B", "replicas": 2}), name="hybrid-serve")
    # POST http://127.0.0.1:8000/v1/chat/completions ... ; GET /metrics

YAML (`serve run deploy/serve.yaml`, or `serve deploy` to a running cluster)::

    applications:
      - name: hybrid-serve
        route_prefix: /
        import_path: hybrid_serve.deploy.app:build_app
        args:
          model: null        # the built-in demo model
          replicas: 2
          ingress_replicas: 1  # HTTP front ends (more spread a burst's arrival over cores)
          engine_args: {max_num_seqs: 32}

`args` are the fields of `AppConfig` (deploy/config.py); unknown keys are rejected.
`autoscaling_config` (Serve's: min_replicas, max_replicas, target_ongoing_requests, ...)
scales the engine replicas instead of a fixed `replicas`. Serve's access log (a line per
request per hop) is off unless `enable_log_requests`; for the HTTP proxy's own lines pass
`access_logging(...)` to `serve.start(logging_config=...)`, or set the YAML's top-level
`logging_config: {enable_access_log: false}`.
"""
from __future__ import annotations

from typing import Any

from ray.serve import Application
from ray.serve.schema import LoggingConfig

from .config import AppConfig
from .engine_client import EngineFactory, check_supported
from .ingress import OpenAIIngress
from .server import LLMServer


def access_logging(enabled: bool) -> LoggingConfig:
    """Serve's logging config with its per-request access log on or off (nothing else changed)."""
    return LoggingConfig(enable_access_log=enabled)


def build_app(args: dict[str, Any] | None = None, engine_factory: EngineFactory | None = None) -> Application:
    """An Application: `OpenAIIngress` (tokenize, validate, stream, /metrics) over
    `LLMServer` x `replicas` (one engine each, built by `engine_factory(config, replica)`:
    default `engine_client.make_engine_client`)."""
    config = AppConfig.from_args(args)
    check_supported(config)
    rank0 = {"num_cpus": config.num_cpus_per_replica}
    if config.gpus_per_shard:
        rank0["num_gpus"] = config.gpus_per_shard
    options = {}
    if config.tp > 1:  # one bundle per TP rank, packed on one node: rank 0 is the replica itself
        shard = {"CPU": 1.0, **({"GPU": config.gpus_per_shard} if config.gpus_per_shard else {})}
        first = {"CPU": config.num_cpus_per_replica, **({"GPU": config.gpus_per_shard} if config.gpus_per_shard else {})}
        options = {"placement_group_bundles": [first] + [shard] * (config.tp - 1),
                   "placement_group_strategy": "STRICT_PACK"}
    if config.router == "prefix":
        from ray.serve.config import RequestRouterConfig

        from .request_router import HybridRequestRouter

        engine = config.engine_config()
        options["request_router_config"] = RequestRouterConfig(
            request_router_class=HybridRequestRouter, request_routing_stats_period_s=config.router_stats_period_s,
            request_router_kwargs={"page_size": engine.page_size,
                                   "checkpoint_interval": engine.state_checkpoint_interval,
                                   "model_name": config.model_name})
    bounds = config.queue_bounds()  # past them: 503 + Retry-After (the ingress's, or the replica's)
    if config.autoscaling_config is not None:
        options["autoscaling_config"] = config.autoscaling_config
    else:
        options["num_replicas"] = config.replicas
    logging = access_logging(config.enable_log_requests)
    server = LLMServer.options(ray_actor_options=rank0, max_ongoing_requests=bounds["max_ongoing_requests"],
                               max_queued_requests=bounds["serve_max_queued_requests"], logging_config=logging,
                               **options)
    # the ingress answers 503 itself past max_ingress_requests generation requests in flight;
    # Serve's cap on its calls is above that, so that the proxy never queues ahead of it
    ingress = OpenAIIngress.options(logging_config=logging, num_replicas=config.ingress_replicas,
                                    max_ongoing_requests=bounds["ingress_max_ongoing_requests"])
    return ingress.bind(config, server.bind(config, engine_factory))
