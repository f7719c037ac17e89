"""Deployment configs, offline: both `ray up` YAMLs pass Ray's own preparation and
validation; the Serve YAMLs pass Ray's schema with no unknown key at any level, and their
args are AppConfig's (engine_args EngineConfig's); build_app builds from serve.yaml."""
import copy
import dataclasses
import importlib
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
