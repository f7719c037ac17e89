"""The engine-client interface: all that a replica (`LLMServer`) needs from its engine.

The implementation is `AsyncLLMEngine`: the engine (TP rank 0) in an engine process of its own
or on a thread of the replica process (`AppConfig.engine_process`); with tp > 1 it drives
the replica's `ShardWorker` actors (one per other rank, in the replica's placement group),
which `ReplicaEngine` starts from the replica process. `LLMServer` and the ingress do not
depend on tp.
"""
from __future__ import annotations

from typing import AsyncIterator, Callable, Protocol

from ..engine.admission import LoadView
from ..engine.async_engine import ModelInfo, RequestDelta
from ..engine.sampling_params import SamplingParams
from .config import AppConfig


class EngineClient(Protocol):
    def model_info(self) -> ModelInfo: ...

    def generate(self, prompt_token_ids: list[int], params: SamplingParams, request_id: str,
                 validated: bool = False) -> AsyncIterator[RequestDelta]:
        """Deltas until every sequence finished; closing the iterator aborts the request.
        Validates the prompt first unless the caller did (`validated`). A client whose
        `paces_streams` is true also takes `pace` (engine/request_stream.StreamPace): the least
        time and tokens between two deltas after the first, the deltas in between merged."""

    async def abort(self, request_id: str) -> None: ...

    def load(self) -> LoadView:
        """The engine's load as of its last step (what admission decides from). A client may
        also have `reported_load() -> (LoadView, requests taken)` (engine/async_engine.py),
        which the router is then given; without it, the router reads `load`."""

    def take_cache_events(self) -> list:
        """The prefix cache's events (mem_cache.CacheEvent) since the last call, for the router."""

    def check_health(self) -> None:
        """Raises if the engine can no longer serve."""

    def shutdown(self) -> None: ...


EngineFactory = Callable[[AppConfig, str], EngineClient]


def check_supported(config: AppConfig) -> None:
    """Raises ValueError for a config no engine here can run (checked at deploy time, in
    seconds): a tp that does not divide the model's heads."""
    from ..models import check_tp_size

    check_tp_size(config.engine_config().model, config.tp)


def make_engine_client(config: AppConfig, replica: str) -> EngineClient:
    """The engine client of one replica, labelled `replica` in metrics. The engine runs in an
    engine process of its own (`config.uses_engine_process()`: the default on CUDA) or on a
    thread of this process. With tp > 1 the engine is rank 0 and the other ranks are
    ShardWorker actors in the replica's placement group (the bundles `build_app` asks Serve
    for), started from this process either way."""
    import torch

    from ..actors.replica import ReplicaEngine
    from ..engine.async_engine import AsyncLLMEngine
    from ..engine.tokenizer import load_tokenizer

    threads = config.torch_num_threads or max(1, int(config.num_cpus_per_replica))
    torch.set_num_threads(threads)
    engine_config = config.engine_config()
    if config.uses_engine_process():
        replica_engine = ReplicaEngine(engine_config, tp_size=config.tp, rank0_here=False)
        try:
            client = AsyncLLMEngine.from_config(
                engine_config, model_name=config.model_name, replica=replica, engine_process=True,
                tp_setup=replica_engine.rank0_setup, torch_num_threads=threads,
                on_shard_loaded=replica_engine.start_workers if config.tp > 1 else None)
        except BaseException:
            replica_engine.shutdown()
            raise
    else:
        replica_engine = ReplicaEngine(engine_config, load_tokenizer(engine_config.tokenizer or engine_config.model),
                                       tp_size=config.tp)
        client = AsyncLLMEngine(replica_engine.engine, model_name=config.model_name, replica=replica)
    client.on_shutdown = replica_engine.shutdown
    return client
