"""Ray cluster on CPU: tp=2 (gloo) equals tp=1 for every family and for a Mamba2 group spread
over both ranks; two tp=2 replicas on a two-node local cluster; a killed ShardWorker fails
only its replica's requests, and the replica comes back; infeasible sizes fail within seconds."""
import threading
import time

import pytest
import ray
import torch

from hf_reference import FAMILIES
from hybrid_serve import LLM, SamplingParams
from hybrid_serve.cluster.local import start_local_cluster

GREEDY = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)


@pytest.fixture(scope="module")
def two_node_cluster():
    cluster = start_local_cluster(num_nodes=2, cpus_per_node=4)
    ray.init(address=cluster.address, include_dashboard=False, log_to_driver=False)
    yield cluster
    ray.shutdown()
    cluster.shutdown()


def _prompts(n, vocab=256, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return [torch.randint(0, vocab, (int(k),), generator=gen).tolist() for k in torch.randint(1, 80, (n,), generator=gen)]


# bf16 on one family per kind of sharded block (CI time: ~16 s a case): GDN + gated attention + MoE
# with a shared expert, Mamba2 + MLP, short conv + MoE, Mamba2 with Falcon-H1's multipliers
BF16_FAMILIES = ("qwen3_next", "nemotron_h", "lfm2_moe", "falcon_h1")


@pytest.mark.slow
@pytest.mark.parametrize("family,dtype", [(f, "float32") for f in FAMILIES] + [(f, "bfloat16") for f in BF16_FAMILIES])
def test_tp2_tokens_equal_tp1(family, dtype, reference_models, two_node_cluster):
    """In bf16 too: the ranks' partial sums are reduced in fp32 and rounded once (as tp=1's
    single GEMM rounds once), so tp=2 differs from tp=1 only by fp32 summation order."""
    model_dir, _ = reference_models(family)
    prompts = _prompts(6)
    want = [o.outputs[0].token_ids for o in LLM(model=model_dir, dtype=dtype).generate(prompts, GREEDY)]
    llm = LLM(model=model_dir, dtype=dtype, tp_size=2, chunked_prefill_size=16)
    try:
        got = llm.generate(prompts, GREEDY)
    finally:
        llm.shutdown()
    assert [o.error for o in got] == [None] * len(prompts)
    assert [o.outputs[0].token_ids for o in got] == want


@pytest.mark.slow
def test_tp2_norm_over_one_mamba_group_spanning_ranks(tmp_path, two_node_cluster):
    """One Mamba2 group (as the released Bamba / Granite-4.0-H / Falcon-H1 have) at tp=2: each
    rank keeps a copy of the group's B and C, and an output norm over the whole group (here
    Falcon-H1's normalise-then-gate; Bamba's family config covers gate-then-normalise) sums its
    squares across ranks."""
    from hf_reference import build_reference

    model_dir = str(tmp_path)
    build_reference("falcon_h1", model_dir, mamba_n_groups=1, mamba_rms_norm=True, mamba_norm_before_gate=True)
    prompts = _prompts(4, seed=4)
    want = [o.outputs[0].token_ids for o in LLM(model=model_dir, dtype="float32").generate(prompts, GREEDY)]
    llm = LLM(model=model_dir, dtype="float32", tp_size=2, chunked_prefill_size=16)
    try:
        got = llm.generate(prompts, GREEDY)
    finally:
        llm.shutdown()
    assert [o.outputs[0].token_ids for o in got] == want


@pytest.mark.slow
def test_killed_shard_fails_only_its_replica_then_recovers(reference_models, two_node_cluster):
    model_dir, _ = reference_models("qwen3_5")
    prompts = _prompts(32, seed=1)
    params = SamplingParams(max_tokens=48, temperature=0.0, ignore_eos=True)
    want = [o.outputs[0].token_ids for o in LLM(model=model_dir, dtype="float32").generate(prompts, params)]
    llm = LLM(model=model_dir, dtype="float32", tp_size=2, num_replicas=2, max_num_seqs=4)
    try:
        first = llm.generate(prompts, params)  # all 32, both replicas healthy
        assert [o.outputs[0].token_ids for o in first] == want
        replica0 = llm.replicas.replicas[0]
        victim = ray.get(replica0.worker_handles.remote())[0]
        result = {}
        runner = threading.Thread(target=lambda: result.update(outs=llm.generate(prompts, params)))
        before = ray.get(replica0.num_steps.remote())
        runner.start()
        deadline = time.monotonic() + 120
        while ray.get(replica0.num_steps.remote()) < before + 10:  # kill it mid-run, not before or after
            assert time.monotonic() < deadline, "replica 0 made no progress"
            time.sleep(0.05)
        ray.kill(victim)
        runner.join(timeout=300)
        outs = result["outs"]
        failed = [i for i, o in enumerate(outs) if o.error is not None]
        assert failed, "killing a shard mid-run should fail that replica's in-flight requests"
        for i in failed:
            assert "replica 0" in outs[i].error and "ShardWorker" in outs[i].error, outs[i].error
            assert outs[i].outputs[0].finish_reason == "error"
        for i, o in enumerate(outs):
            if o.error is None:
                assert o.outputs[0].token_ids == want[i]
        # requests are spread evenly: the healthy replica's half all succeeded
        assert len(failed) <= len(prompts) // 2
        again = llm.generate(prompts, params)  # replica 0 is rebuilt and serves again
        assert [o.error for o in again] == [None] * len(prompts), sorted({o.error for o in again if o.error})
        assert [o.outputs[0].token_ids for o in again] == want
        assert llm.replicas.num_restarts(0) == 1 and llm.replicas.num_restarts(1) == 0
    finally:
        llm.shutdown()


def test_infeasible_sizes_fail_fast(reference_models, two_node_cluster):
    model_dir, _ = reference_models("qwen3_5")  # 4 heads, 2 KV heads
    start = time.monotonic()
    with pytest.raises(ValueError, match="tp_size=3 does not divide the model's num_attention_heads=4"):
        LLM(model=model_dir, dtype="float32", tp_size=3)
    with pytest.raises(ValueError, match="tp_size=5 needs 5 CPUs on one node, but the largest node has 4"):
        _check(5, 1)
    with pytest.raises(ValueError, match="need 12 CPUs, the cluster has 8"):
        _check(2, 6)
    with pytest.raises(ValueError, match="GPU"):
        _check(2, 1, use_gpu=True)
    assert time.monotonic() - start < 30


@ray.remote(num_cpus=0)
class _Starting:
    """A stand-in shard worker whose constructor sleeps, or raises."""

    def __init__(self, sleep_s: float = 0.0, fail: bool = False) -> None:
        time.sleep(sleep_s)
        if fail:
            raise RuntimeError("shard checkpoint missing")

    def ping(self) -> int:
        return 1


def test_a_replica_waits_for_its_workers_to_start_then_for_the_rendezvous(two_node_cluster):
    """Worker start-up is waited for before the rendezvous (whose 60 s only counts the join):
    a slow constructor is waited for, one that fails raises its error at once, one that takes
    longer than the wait names its rank."""
    from hybrid_serve.actors.replica import _wait_started

    _wait_started([_Starting.remote(0.0), _Starting.remote(2.0)], timeout_s=60)
    start = time.monotonic()
    with pytest.raises(ray.exceptions.RayActorError, match="shard checkpoint missing"):
        _wait_started([_Starting.remote(0.0), _Starting.remote(fail=True)], timeout_s=60)
    assert time.monotonic() - start < 30
    started = _Starting.remote(0.0)
    ray.get(started.ping.remote())
    with pytest.raises(TimeoutError, match=r"ranks \[2\] did not start within 1 s"):
        _wait_started([started, _Starting.remote(30.0)], timeout_s=1)


def _check(tp, replicas, use_gpu=False):
    from hybrid_serve.cluster.placement import check_feasible

    check_feasible(tp, replicas, use_gpu)


@pytest.mark.slow
def test_tp4_with_two_kv_heads_replicates_them(reference_models, two_node_cluster):
    model_dir, _ = reference_models("lfm2")  # 4 query heads, 2 KV heads: each rank keeps one KV head
    prompts = _prompts(3, seed=2)
    want = [o.outputs[0].token_ids for o in LLM(model=model_dir, dtype="float32").generate(prompts, GREEDY)]
    llm = LLM(model=model_dir, dtype="float32", tp_size=4)
    try:
        got = llm.generate(prompts, GREEDY)
    finally:
        llm.shutdown()
    assert [o.outputs[0].token_ids for o in got] == want


@pytest.mark.slow
def test_tp4_with_two_gdn_key_heads_replicates_them(two_node_cluster):
    """The trained demo: 2 Gated DeltaNet key heads, 4 value heads, 4 attention heads, 2 KV
    heads. At tp=4 each rank keeps its one value head and a replica of the key head that head
    reads (ranks 0-1: key head 0, ranks 2-3: key head 1): the same greedy tokens as tp=1."""
    from hybrid_serve.demo import DEMO_DIR
    from hybrid_serve.demo.corpus import heldout_prompts
    from hybrid_serve.engine.tokenizer import load_tokenizer

    tok = load_tokenizer(DEMO_DIR)
    prompts = [tok.encode(t, add_special_tokens=False) for t in heldout_prompts(4)]
    want = [o.outputs[0].token_ids for o in LLM(dtype="float32").generate(prompts, GREEDY)]
    llm = LLM(dtype="float32", tp_size=4)
    try:
        got = llm.generate(prompts, GREEDY)
    finally:
        llm.shutdown()
    assert [o.error for o in got] == [None] * len(prompts)
    assert [o.outputs[0].token_ids for o in got] == want


@pytest.mark.slow
def test_tp2_overlapped_scheduling_matches_synchronous(reference_models, two_node_cluster):
    """Overlapped scheduling at tp=2 (rank 0 broadcasts its sampled tokens to rank 1 on the
    stream): the same outputs as synchronous steps, with content stops, seeded sampling,
    logprobs and preemption under a small KV pool."""
    model_dir, _ = reference_models("qwen3_5")
    prompts = _prompts(8, seed=3)
    params = [SamplingParams(max_tokens=10, temperature=0.0, stop_token_ids=list(range(0, 256, 3))),
              SamplingParams(max_tokens=8, temperature=0.9, seed=4, ignore_eos=True),
              SamplingParams(max_tokens=6, temperature=0.0, logprobs=2, ignore_eos=True),
              SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)] * 2
    results = {}
    for overlap in (False, True):
        llm = LLM(model=model_dir, dtype="float32", tp_size=2, max_num_seqs=8, page_size=8, max_model_len=128,
                  num_kv_pages_override=24, chunked_prefill_size=16, async_scheduling=overlap)
        try:
            outs = llm.generate(prompts, params)
        finally:
            llm.shutdown()
        results[overlap] = [(o.error, o.outputs[0].token_ids, o.outputs[0].finish_reason) for o in outs]
    assert [e for e, *_ in results[True]] == [None] * len(prompts)
    assert results[True] == results[False]
    assert any(finish == "stop" for *_, finish in results[True])
