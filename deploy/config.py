"""AppConfig: the Serve application's arguments (`build_app(args)`, the YAML's `args:`).

Frozen and validated in `__post_init__`; `from_args` rejects unknown keys, so a typo in a
YAML fails at deploy time with the list of known keys. `model` and `tokenizer` are local
directories or Hugging Face Hub ids (`engine/model_files.py`): checked at construction
(config and tokenizer files only), the weights fetched where a replica builds its engine.
`api_key: ${NAME}` reads the key from the environment variable NAME.
"""
from __future__ import annotations

import dataclasses
import os
import re
from dataclasses import dataclass, field
from typing import Any

from ..engine.model_files import resolve_model_path
from ..engine.tokenizer import load_chat_template

API_KEY_ENV = "HYBRID_SERVE_API_KEY"
DEMO_MODEL_NAME = "demo"


@dataclass(frozen=True)
class AppConfig:
    model: str | None = None  # a Hugging Face model directory or Hub id; None: the built-in demo model
    served_model_name: str | None = None  # default: the directory's name, the Hub id, or "demo"
    tokenizer: str | None = None  # a directory or Hub id; default: the model's
    revision: str | None = None  # Hub branch, tag or commit of `model` (default: main)
    chat_template: str | None = None  # a file or inline Jinja replacing the model's; held as text once built
    tp: int = 1  # tensor-parallel shards per replica
    replicas: int = 1  # engine replicas (data parallel)
    # OpenAIIngress replicas (HTTP parsing, validation, tokenizing, streaming), as vLLM's
    # --api-server-count: each costs Ray Serve's per-request work (a call to an engine replica,
    # its streamed replies) on one event loop; more spread a burst's arrival over more cores.
    ingress_replicas: int = 1
    device: str = "cpu"  # cpu | cuda
    dtype: str = "auto"
    load_format: str | None = None  # default: "auto" (the demo model ships trained weights)
    seed: int | None = None  # dummy weights / unseeded sampling; default: the demo's seed or 0
    engine_args: dict[str, Any] = field(default_factory=dict)  # more EngineConfig fields
    num_cpus_per_replica: float = 1.0
    num_gpus_per_shard: float | None = None  # default: 1 on cuda, 0 on cpu
    torch_num_threads: int | None = None  # default: num_cpus_per_replica (at least 1)
    # Admission (engine/admission.py): beyond these bounds a request gets 503 + Retry-After at once
    # instead of waiting without limit. The defaults (None) keep an accepted request's wait for a
    # batch row within one turn of the batch (its rows each free within one request's prefill +
    # max_tokens steps): per replica 3/4 of max_num_seqs may wait, so under overload more is
    # refused at once and what is accepted starts soon; larger values admit more of a burst
    # and make it wait longer (throughput is the same once the rows stay full):
    max_waiting_requests: int | None = None  # per replica, requests without a first token beyond the rows
    #                                          answered requests leave free; max_num_seqs // 2
    max_waiting_tokens: int | None = None  # per replica, prompt tokens without a first token; 8 x batched tokens
    max_ongoing_requests: int | None = None  # Serve's per-replica calls; max_num_seqs + max_waiting_requests
    max_queued_requests: int | None = None  # at the ingress, for all replicas busy; max_replicas x
    #                                         max_waiting_requests // 2
    # (the ingress refuses past max_replicas x max_ongoing_requests + max_queued_requests in flight)
    api_key: str | None = None  # also read from $HYBRID_SERVE_API_KEY; "${NAME}": from $NAME
    max_body_bytes: int = 8 * 1024 * 1024  # larger bodies get 413
    metrics_push_interval_s: float = 1.0
    # placement across replicas: "pow2" (Serve's power of two choices) or "prefix" (routing/'s
    # prefix- and checkpoint-aware policy, deploy/request_router.py)
    router: str = "pow2"
    router_stats_period_s: float = 1.0  # how often replicas report load and cache events to routers
    enable_log_requests: bool = False  # Ray Serve's access log lines (one per request per hop); prompts never
    autoscaling_config: dict[str, Any] | None = None  # Serve autoscaling of the engine replicas, instead of `replicas`
    # Streaming. A request's first token and its end go out at once; in between, its replica
    # sends its new tokens as one message (one SSE chunk of one event per engine step) when
    # there are at least `stream_interval` of them (SGLang's --stream-interval; 1: each token)
    # and at least (the replica's streams / stream_max_messages_per_s) seconds have passed since
    # the stream's last message: under load, each message of Serve's path (replica -> ingress
    # -> HTTP proxy, each ~0.5 ms of a core) carries several tokens instead of one; alone (1
    # stream: 1 ms) every token goes out as it is made. 0: no budget (a message per token).
    stream_interval: int = 1
    stream_max_messages_per_s: float = 1000.0
    # Tokens from a replica to an ingress: True, by delta channel (deploy/delta_channel.py: one
    # connection per ingress and replica, one frame per pass of the replica's loop for all its
    # streams); False, as items of each request's Serve call (a Ray message per item).
    delta_channels: bool = True
    # Where a replica's engine runs: True, an engine process of its own (engine/core_process.py:
    # its steps never wait for the GIL behind the replica's event loop, Serve and Ray); False, a
    # thread of the replica process; None: a process on CUDA, a thread on CPU (where a replica
    # has one or two cores for everything).
    engine_process: bool | None = None

    def __post_init__(self) -> None:
        for name in ("tp", "replicas", "ingress_replicas", "max_body_bytes", "stream_interval", *_QUEUE_BOUNDS):
            value = getattr(self, name)
            if value is None and name in _QUEUE_BOUNDS:
                continue
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
        if not self.num_cpus_per_replica >= 0:
            raise ValueError(f"num_cpus_per_replica must be >= 0, got {self.num_cpus_per_replica!r}")
        if self.router not in ("pow2", "prefix"):
            raise ValueError(f"router must be 'pow2' or 'prefix', got {self.router!r}")
        if not self.router_stats_period_s > 0:
            raise ValueError(f"router_stats_period_s must be > 0, got {self.router_stats_period_s!r}")
        if not (isinstance(self.stream_max_messages_per_s, (int, float)) and not isinstance(
                self.stream_max_messages_per_s, bool) and self.stream_max_messages_per_s >= 0):
            raise ValueError(f"stream_max_messages_per_s must be a number >= 0, got {self.stream_max_messages_per_s!r}")
        if not self.metrics_push_interval_s > 0:
            raise ValueError(f"metrics_push_interval_s must be > 0, got {self.metrics_push_interval_s!r}")
        if self.device.split(":")[0] not in ("cpu", "cuda"):
            raise ValueError(f"device must be cpu or cuda, got {self.device!r}")
        self._check_sources()
        if self.engine_process not in (None, True, False):
            raise ValueError(f"engine_process must be true, false or null, got {self.engine_process!r}")
        for name in ("enable_log_requests", "delta_channels"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be true or false, got {getattr(self, name)!r}")
        if self.autoscaling_config is not None:
            _check_autoscaling(self.autoscaling_config, self.replicas)
        known = {f.name for f in dataclasses.fields(_engine_config_cls())}
        owned = {"model", "tokenizer", "revision", "device", "dtype", "load_format", "seed"}
        unknown = sorted(set(self.engine_args) - (known - owned))
        if unknown:
            raise ValueError(f"unknown engine_args {unknown}; known: {sorted(known - owned)}")

    def _check_sources(self) -> None:
        """Model and tokenizer exist (a directory, or a Hub id whose config files resolve, fetched
        if need be); the chat template file is read into text and `${NAME}` keys from the environment,
        so the replicas and the ingress get values that need nothing of the machine that built this."""
        if self.model is not None:
            resolve_model_path(self.model, self.revision, weights=False)
        if self.tokenizer is not None:
            resolve_model_path(self.tokenizer, weights=False)
        object.__setattr__(self, "chat_template", load_chat_template(self.chat_template))
        object.__setattr__(self, "api_key", _expand_env(self.api_key))

    @classmethod
    def from_args(cls, args: dict[str, Any] | None) -> "AppConfig":
        args = dict(args or {})
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(args) - known)
        if unknown:
            raise ValueError(f"unknown hybrid-serve app args {unknown}; known: {sorted(known)}")
        if args.get("api_key") is None and os.environ.get(API_KEY_ENV):
            args["api_key"] = os.environ[API_KEY_ENV]
        return cls(**args)

    @property
    def model_name(self) -> str:
        if self.served_model_name:
            return self.served_model_name
        if self.model is None:
            return DEMO_MODEL_NAME
        if not os.path.isdir(self.model):
            return self.model  # a Hub id, as vLLM names it
        return os.path.basename(os.path.normpath(self.model))

    @property
    def gpus_per_shard(self) -> float:
        if self.num_gpus_per_shard is not None:
            return self.num_gpus_per_shard
        return 1.0 if self.device.startswith("cuda") else 0.0

    def uses_engine_process(self) -> bool:
        """Whether a replica's engine runs in an engine process of its own (`engine_process`)."""
        return self.device.startswith("cuda") if self.engine_process is None else self.engine_process

    def engine_config(self, weights: bool = True):
        """The EngineConfig of one replica's engine. A Hub model is fetched here, into this
        node's HF cache: its config and tokenizer files, and its weights if `weights` (and
        load_format is not dummy)."""
        from ..demo import DEMO_DIR, DEMO_SEED

        demo = self.model is None
        load_format = self.load_format or "auto"
        if demo:
            model = DEMO_DIR
        else:
            model = resolve_model_path(self.model, self.revision, weights=weights and load_format != "dummy")
        return _engine_config_cls()(
            model=model,
            tokenizer=None if self.tokenizer is None else resolve_model_path(self.tokenizer, weights=False),
            revision=self.revision,
            device=self.device,
            dtype=self.dtype,
            load_format=load_format,
            seed=self.seed if self.seed is not None else (DEMO_SEED if demo else 0),
            **self.engine_args,
        )

    @property
    def max_replicas(self) -> int:
        """Engine replicas at most: `replicas`, or the autoscaling config's max_replicas."""
        if self.autoscaling_config is not None:
            return int(self.autoscaling_config.get("max_replicas", 1))
        return self.replicas

    def queue_bounds(self) -> dict[str, int]:
        """The admission bounds with their defaults resolved from the engine's max_num_seqs and
        max_num_batched_tokens (the device's defaults when not set), and the ingress's bound
        derived from them: `max_ingress_requests` generation requests in flight at one ingress
        (max_replicas x max_ongoing_requests + max_queued_requests: all Serve can place or
        queue; with several `ingress_replicas` each takes up to twice its even share of it, as
        Serve's proxy does not split a burst evenly: 8 ingresses with even shares refused 8 of
        a 256-request burst that the replicas had room for; past it 503 before any work), and
        the ingress deployment's own Serve
        max_ongoing_requests (twice that + 32, room for the 503s being answered and for
        /health, /metrics, /v1/models: Serve's proxy never queues ahead of the ingress).

        `serve_max_queued_requests`, the cap given to Serve's own queue of the engine
        deployment, is the ingress's bound, so that it never binds: Serve counts a request as
        queued until a replica has accepted it (a round trip) and a replica counts one as
        ongoing until its handler has returned, both after the ingress has seen the request
        before it end; at the bound a request let in by the ingress would find Serve's queue
        still full and get a 503 after being parsed and tokenized. Its queue cannot hold more
        than the ingress has in flight, and the ingress is the one bound."""
        engine = self.engine_config(weights=False)
        waiting = self.max_waiting_requests or max(1, engine.max_num_seqs // 2)
        ongoing = self.max_ongoing_requests or engine.max_num_seqs + waiting
        queued = self.max_queued_requests or max(1, self.max_replicas * waiting // 2)
        total = self.max_replicas * ongoing + queued
        ingress = min(total, -(-2 * total // self.ingress_replicas))  # each ingress's share, with headroom
        return {"max_waiting_requests": waiting,
                "max_waiting_tokens": self.max_waiting_tokens or 8 * engine.max_num_batched_tokens,
                "max_ongoing_requests": ongoing,
                "max_queued_requests": queued,
                "max_ingress_requests": ingress,
                "serve_max_queued_requests": ingress,
                "ingress_max_ongoing_requests": 2 * ingress + 32}

    def tokenizer_path(self) -> str:
        """The local directory of the tokenizer (its files fetched from the Hub if need be)."""
        from ..demo import DEMO_DIR

        if self.tokenizer is not None:
            return resolve_model_path(self.tokenizer, weights=False)
        return DEMO_DIR if self.model is None else resolve_model_path(self.model, self.revision, weights=False)


_ENV_REF = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")


def _expand_env(value: str | None) -> str | None:
    """`${NAME}` -> $NAME (a YAML placeholder that keeps the secret out of the file)."""
    if value is None:
        return None
    match = _ENV_REF.fullmatch(value.strip())
    if match is None:
        return value
    name = match.group(1)
    if not os.environ.get(name):
        raise ValueError(f"api_key is {value!r} but ${name} is not set in the environment of the process that "
                         f"builds the application (for `serve deploy`: the cluster's `ray start`)")
    return os.environ[name]


def _check_autoscaling(autoscaling: dict[str, Any], replicas: int) -> None:
    """Serve's own validation of `autoscaling_config`, as a ValueError naming the problem."""
    if replicas != 1:
        raise ValueError(f"set replicas ({replicas}) or autoscaling_config (min_replicas/max_replicas), not both")
    if not isinstance(autoscaling, dict):
        raise ValueError(f"autoscaling_config must be a mapping of Serve's AutoscalingConfig, got {autoscaling!r}")
    from ray.serve.config import AutoscalingConfig

    try:
        AutoscalingConfig(**autoscaling)
    except Exception as exc:  # noqa: BLE001 - pydantic's ValidationError, TypeError
        raise ValueError(f"autoscaling_config {autoscaling!r} is not Serve's AutoscalingConfig: {exc}") from exc


_QUEUE_BOUNDS = ("max_waiting_requests", "max_waiting_tokens", "max_ongoing_requests", "max_queued_requests")


def _engine_config_cls():  # EngineConfig, imported when needed
    from ..engine.config import EngineConfig

    return EngineConfig
