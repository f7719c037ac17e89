"""Deployment configs, offline: both `ray up` YAMLs pass Ray's own preparation and
validation; the Serve YAMLs pass Ray's schema with no unknown key at any level, and their
args are AppConfig's (engine_args EngineConfig's); build_app builds from serve.yaml."""
import copy
import dataclasses
import importlib
import math
import os
import typing

import pytest
import yaml

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RAY_UP = ["deploy/cluster-local.yaml", "deploy/cluster-gpu-aws.yaml"]
SERVE = ["deploy/serve.yaml", "deploy/serve-gpu.yaml"]


def _yaml(rel):
    with open(os.path.join(REPO, rel)) as f:
        return yaml.safe_load(f)


@pytest.mark.parametrize("rel", RAY_UP)
def test_ray_up_config_validates(rel):
    from ray.autoscaler._private.util import prepare_config, validate_config

    config = _yaml(rel)
    validate_config(prepare_config(copy.deepcopy(config)))
    head = "\n".join(config["head_start_ray_commands"])
    assert "--metrics-export-port" in head and "prometheus --config.file" in head and "serve deploy" in head
    assert all("--metrics-export-port" in c for c in config["worker_start_ray_commands"] if "ray start" in c)
    for path in ("dashboards/prometheus.yml", "deploy/serve"):
        assert path in head
    assert os.path.exists(os.path.join(REPO, head.split("serve deploy ~/hybrid-serve/src/")[1].split()[0]))


def _submodel(annotation):
    """The pydantic model inside Optional[...] / List[...], if any."""
    from pydantic import BaseModel

    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in typing.get_args(annotation):
        found = _submodel(arg)
        if found is not None:
            return found
    return None


def unknown_keys(model, data: dict, path: str = "") -> list[str]:
    fields = {}
    for name, info in model.model_fields.items():
        fields[name] = info
        if info.alias:
            fields[info.alias] = info
    out = []
    for key, value in data.items():
        if key not in fields:
            out.append(f"{path}{key}")
            continue
        sub = _submodel(fields[key].annotation)
        if sub is None or key == "args":
            continue
        if isinstance(value, dict):
            out += unknown_keys(sub, value, f"{path}{key}.")
        elif isinstance(value, list):
            for i, item in enumerate(value):
                if isinstance(item, dict):
                    out += unknown_keys(sub, item, f"{path}{key}[{i}].")
    return out


@pytest.mark.parametrize("rel", SERVE)
def test_serve_config_schema_and_keys(rel):
    from ray.serve.schema import ServeDeploySchema

    from hybrid_serve.deploy.config import AppConfig
    from hybrid_serve.engine.config import EngineConfig

    config = _yaml(rel)
    ServeDeploySchema.model_validate(config)
    assert unknown_keys(ServeDeploySchema, config) == []
    app_fields = {f.name for f in dataclasses.fields(AppConfig)}
    engine_fields = {f.name for f in dataclasses.fields(EngineConfig)}
    for app in config["applications"]:
        module, attr = app["import_path"].split(":")
        assert callable(getattr(importlib.import_module(module), attr))
        args = app["args"]
        assert set(args) <= app_fields, set(args) - app_fields
        assert set(args.get("engine_args", {})) <= engine_fields


def test_unknown_key_check_catches_typos():
    from ray.serve.schema import ServeDeploySchema

    config = _yaml("deploy/serve.yaml")
    config["http_options"]["prot"] = 1
    config["applications"][0]["import_pth"] = "x"
    assert unknown_keys(ServeDeploySchema, config) == ["http_options.prot", "applications[0].import_pth"]


def test_build_app_from_serve_yaml():
    from ray.serve import Application

    from hybrid_serve.deploy.app import build_app

    args = _yaml("deploy/serve.yaml")["applications"][0]["args"]
    assert isinstance(build_app(args), Application)
    assert isinstance(build_app({**args, "tp": 2}), Application)  # the demo's 4 heads split in 2
    with pytest.raises(ValueError, match="tp_size=3 does not divide"):
        build_app({**args, "tp": 3})


# ----- honest YAMLs: a key wherever the API is exposed, autoscaling where promised, torch pinned, quiet logs

def _serve_yaml_of(ray_up: dict) -> str:
    """The Serve YAML a `ray up` config deploys (`serve deploy ~/hybrid-serve/src/<it>`)."""
    head = "\n".join(ray_up["head_start_ray_commands"])
    return head.split("serve deploy ~/hybrid-serve/src/")[1].split()[0]


@pytest.mark.parametrize("rel", SERVE)
def test_exposed_api_has_an_api_key(rel, monkeypatch):
    from hybrid_serve.deploy.config import AppConfig

    config = _yaml(rel)
    if config["http_options"]["host"] not in ("0.0.0.0", "::"):
        return
    for app in config["applications"]:
        key = app["args"].get("api_key")
        assert key, f"{rel} binds {config['http_options']['host']} without an api_key"
        env = key[2:-1] if key.startswith("${") else None
        if env:  # a placeholder read from the environment: every `ray start` that can build the app exports it
            for cluster in RAY_UP:
                ray_up = _yaml(cluster)
                if _serve_yaml_of(ray_up) == rel:
                    starts = [c for c in ray_up["head_start_ray_commands"] + ray_up["worker_start_ray_commands"]
                              if "ray start" in c]
                    assert starts and all(f"export {env}=" in c for c in starts), cluster
            monkeypatch.setenv(env, "s3cret")
            args = {**app["args"], "model": None, "device": "cpu", "dtype": "auto"}
            assert AppConfig.from_args(args).api_key == "s3cret"
            monkeypatch.delenv(env)
            with pytest.raises(ValueError, match=f"\\${env} is not set"):
                AppConfig.from_args(args)


@pytest.mark.parametrize("rel", RAY_UP)
def test_autoscaled_workers_have_serve_autoscaling(rel, monkeypatch):
    """Where the cluster autoscales GPU workers (min < max), the engine deployment autoscales
    over the same range (one GPU replica per worker), and build_app passes it to Serve."""
    from hybrid_serve.deploy.app import build_app

    ray_up = _yaml(rel)
    served = _yaml(_serve_yaml_of(ray_up))
    scaled = [t for t in ray_up.get("available_node_types", {}).values()
              if "min_workers" in t and t.get("max_workers", 0) > t["min_workers"]]
    if not scaled:  # fixed machines: nothing promised
        return
    (workers,) = scaled
    for app in served["applications"]:
        autoscaling = app["args"].get("autoscaling_config")
        assert autoscaling, f"{rel} autoscales workers but {_serve_yaml_of(ray_up)} has fixed replicas"
        assert (autoscaling["min_replicas"], autoscaling["max_replicas"]) == (workers["min_workers"],
                                                                                workers["max_workers"])
        monkeypatch.setenv("HYBRID_SERVE_API_KEY", "k")
        args = {**app["args"], "model": None, "device": "cpu", "dtype": "auto"}
        engine = build_app(args)._bound_deployment.init_args[1]._bound_deployment
        scaling = engine._deployment_config.autoscaling_config
        assert (scaling.min_replicas, scaling.max_replicas) == (autoscaling["min_replicas"],
                                                                autoscaling["max_replicas"])


def test_autoscaling_config_is_validated():
    from hybrid_serve.deploy.config import AppConfig

    with pytest.raises(ValueError, match="not both"):
        AppConfig(replicas=2, autoscaling_config={"min_replicas": 1, "max_replicas": 2})
    with pytest.raises(ValueError, match="max_replicas"):
        AppConfig(autoscaling_config={"min_replicas": 3, "max_replicas": 2})


@pytest.mark.parametrize("rel", RAY_UP)
def test_torch_pinned_as_in_readme(rel):
    import re

    with open(os.path.join(REPO, "README.md")) as f:
        (pin,) = set(re.findall(r"torch==[\w.+]+", f.read()))
    setup = "\n".join(_yaml(rel)["setup_commands"])
    assert re.findall(r"torch(?:[=<>~!]=?[\w.+]+)?(?=\s|$|')", setup) == [pin], setup


@pytest.mark.parametrize("rel", SERVE)
def test_access_logs_off_in_serve_yamls(rel):
    config = _yaml(rel)
    assert config["logging_config"]["enable_access_log"] is False
    assert all(not app["args"].get("enable_log_requests", False) for app in config["applications"])


@pytest.mark.parametrize("enabled", [False, True])
def test_build_app_sets_access_logging_on_both_deployments(enabled):
    from hybrid_serve.deploy.app import build_app

    ingress = build_app({"enable_log_requests": enabled} if enabled else {})._bound_deployment
    engine = ingress.init_args[1]._bound_deployment
    for deployment in (ingress, engine):
        assert deployment._deployment_config.logging_config["enable_access_log"] is enabled


def test_build_app_sizes_both_deployments_from_the_queue_bounds():
    """The engine replicas take max_ongoing_requests calls each and max_queued_requests more
    may wait for them: the ingress refuses past replicas x that + the queue itself; Serve's own
    queue is capped at the ingress's bound (it never binds: it would refuse after tokenizing),
    and Serve's cap on the ingress is above its bound (the proxy never queues ahead of it)."""
    from hybrid_serve.deploy.app import build_app
    from hybrid_serve.deploy.config import AppConfig

    args = {"replicas": 3, "engine_args": {"max_num_seqs": 8}, "max_waiting_requests": 4}
    bounds = AppConfig.from_args(args).queue_bounds()
    assert (bounds["max_ongoing_requests"], bounds["max_queued_requests"]) == (12, 3 * 4 // 2)
    assert bounds["max_ingress_requests"] == 3 * 12 + 6
    ingress = build_app(args)._bound_deployment
    engine = ingress.init_args[1]._bound_deployment
    assert engine._deployment_config.max_ongoing_requests == 12
    assert engine._deployment_config.max_queued_requests == bounds["max_ingress_requests"]
    assert ingress._deployment_config.max_ongoing_requests == bounds["ingress_max_ongoing_requests"] > 40
    scaled = AppConfig(autoscaling_config={"min_replicas": 1, "max_replicas": 5}, engine_args={"max_num_seqs": 8})
    assert scaled.max_replicas == 5 and scaled.queue_bounds()["max_ingress_requests"] == 5 * (8 + 4) + 5 * 4 // 2


def test_ingress_replicas_share_the_ingress_bound():
    """`ingress_replicas` runs that many OpenAIIngress replicas; each refuses past twice its
    even share of what Serve can place or queue (Serve's proxy does not split a burst evenly),
    never past the whole; a bad count is named."""
    from hybrid_serve.deploy.app import build_app
    from hybrid_serve.deploy.config import AppConfig

    args = {"replicas": 3, "engine_args": {"max_num_seqs": 8}, "max_waiting_requests": 4, "ingress_replicas": 4}
    bounds = AppConfig.from_args(args).queue_bounds()
    assert bounds["max_ingress_requests"] == -(-2 * (3 * 12 + 6) // 4) == 21
    ingress = build_app(args)._bound_deployment
    assert ingress._deployment_config.num_replicas == 4
    assert ingress._deployment_config.max_ongoing_requests == 2 * 21 + 32
    assert AppConfig.from_args({**args, "ingress_replicas": 2}).queue_bounds()["max_ingress_requests"] == 42
    assert build_app({})._bound_deployment._deployment_config.num_replicas == 1
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match="ingress_replicas"):
            AppConfig(ingress_replicas=bad)


def test_default_queues_keep_the_wait_within_one_turn_of_the_batch():
    """Defaults: per replica half of max_num_seqs waits at the replica and, for each replica, a
    quarter more at the ingress: an accepted request has fewer than max_num_seqs requests ahead
    of it for a row (a row each, within one request's time in the batch); explicit values win."""
    from hybrid_serve.deploy.config import AppConfig

    for replicas, seqs in ((1, 16), (2, 16), (4, 256), (1, 1), (3, 5)):
        b = AppConfig(replicas=replicas, engine_args={"max_num_seqs": seqs}).queue_bounds()
        ahead = b["max_waiting_requests"] + math.ceil(b["max_queued_requests"] / replicas)
        assert 1 <= b["max_waiting_requests"] and ahead <= max(2, seqs), (replicas, seqs, b)
        assert b["max_ongoing_requests"] == seqs + b["max_waiting_requests"]
    b = AppConfig(engine_args={"max_num_seqs": 16}, max_waiting_requests=20, max_queued_requests=7).queue_bounds()
    assert (b["max_waiting_requests"], b["max_queued_requests"], b["max_ongoing_requests"]) == (20, 7, 36)
