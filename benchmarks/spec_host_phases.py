"""Host time of a speculative verify step on a GPU, by phase (2.3B Qwen3.5 layout, peaked dummy
bf16 weights as in spec_decode.py, batch 1, synthetic drafter at 0.8 per token, K = 4, verify
graphs): each phase's wall time per verify-graph step (prefill and plain steps left out), and
the device's idle gap it leaves: from the moment the host has step N's tokens (the read-back's
wait returns) to the launch of step N+1's verify graph. While drafts depend on step N's tokens
nothing else fills that gap.

    python benchmarks/spec_host_phases.py [--tokens 128] [--prompts 4]
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import statistics
import sys
import tempfile
import time

import torch

sys.path.insert(0, os.path.dirname(__file__))
from model_configs import write_model_dir  # noqa: E402
from spec_decode import peak_weights  # noqa: E402

from hybrid_serve import LLM, SamplingParams  # noqa: E402
from hybrid_serve import device_io  # noqa: E402
from hybrid_serve.engine import engine as engine_mod  # noqa: E402
from hybrid_serve.engine.runner import model_runner  # noqa: E402
from hybrid_serve.mem_cache import state_pool as state_pool_mod  # noqa: E402


class PhaseClock:
    """Wraps callables to add their wall time to a phase; `marks` keeps (event, time) pairs."""

    def __init__(self) -> None:
        self.total = collections.defaultdict(float)  # over the kept steps (`end_step`)
        self.step = collections.defaultdict(float)  # the engine step now running
        self.marks: list[tuple[str, float]] = []

    def end_step(self, keep: bool) -> None:
        """Add the step's phases to the totals if `keep` (a verify-graph step), else drop them
        (prefill and plain steps would inflate per-verify-step figures)."""
        if keep:
            for phase, seconds in self.step.items():
                self.total[phase] += seconds
        self.step.clear()

    def wrap(self, owner, name: str, phase: str, mark: str | None = None) -> None:
        real = getattr(owner, name)

        def timed(*args, **kwargs):
            t = time.perf_counter()
            if mark:
                self.marks.append((mark + "_start", t))
            out = real(*args, **kwargs)
            end = time.perf_counter()
            if mark:
                self.marks.append((mark + "_end", end))
            self.step[phase] += end - t
            return out

        setattr(owner, name, timed)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="qwen3_5_2p3b")
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    args = ap.parse_args()
    model_dir = write_model_dir(args.model, tempfile.mkdtemp())
    eng = dict(model=model_dir, load_format="dummy", dtype="bfloat16", device="cuda", max_num_seqs=64,
               enable_prefix_caching=False, gpu_memory_utilization=0.6)
    gen = torch.Generator().manual_seed(0)
    prompts = [torch.randint(10, 30000, (256,), generator=gen).tolist() for _ in range(args.prompts)]
    params = SamplingParams(max_tokens=args.tokens, temperature=0.0, ignore_eos=True)
    plain = LLM(**eng)
    peak_weights(plain.engine.model)
    truth = {tuple(p): plain.generate([p], params)[0].outputs[0].token_ids for p in prompts}
    del plain
    torch.cuda.empty_cache()
    llm = LLM(**eng, enable_verify_graphs=True, speculative_config=dict(
        method="synthetic", num_speculative_tokens=4, acceptance_rate=0.8, continuations=truth))
    peak_weights(llm.engine.model)
    llm.generate([prompts[0]], SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True))  # warm
    e = llm.engine
    clock = PhaseClock()
    clock.wrap(e, "step", "step (all)")
    timed_step, verify_steps = e.step, 0

    def step():  # phases count for verify-graph steps only
        nonlocal verify_steps
        before = e.runner.num_verify_graph_steps
        out = timed_step()
        keep = e.runner.num_verify_graph_steps > before
        verify_steps += keep
        clock.end_step(keep)
        return out

    e.step = step
    clock.wrap(e, "_spec_depths", "adaptive depth")
    clock.wrap(e.spec, "propose", "drafter.propose")
    clock.wrap(e.spec, "pad", "pad drafts")
    clock.wrap(e.scheduler, "schedule", "scheduler.schedule")
    clock.wrap(e.scheduler, "after_step", "scheduler.after_step")
    clock.wrap(e, "_plan", "plan")
    clock.wrap(e.shard, "execute", "shard.execute (host)")
    clock.wrap(engine_mod, "complete_verify", "complete_verify")
    clock.wrap(engine_mod, "sample", "sample (launch)")
    clock.wrap(engine_mod, "adjust_logits", "adjust_logits")
    clock.wrap(engine_mod, "PendingHostCopy", "read-back launch")
    clock.wrap(model_runner, "apply_cache_ops", "apply_cache_ops (commit launch)")
    clock.wrap(e.runner.verify_graphs, "run", "verify graph run (inputs + replay)", mark="graph")
    clock.wrap(e.runner.state_pool, "commit_verified", "  commit_verified")
    clock.wrap(state_pool_mod, "copy_to_device", "    commit rows to the device")
    clock.wrap(e.runner.req_table, "set_kv_slots", "  KV table writes (one)")
    clock.wrap(e.runner.req_table, "set_kv_slots_many", "  KV table writes (many)")
    clock.wrap(e.runner.req_table, "set_state_slot", "  state-slot table writes")
    clock.wrap(device_io.PendingHostCopy, "wait", "read-back wait", mark="wait")
    for p in prompts:
        llm.generate([p], params)
    gaps, last_wait_end = [], None
    for name, t in clock.marks:
        if name == "wait_end":
            last_wait_end = t
        elif name == "graph_start" and last_wait_end is not None:
            gaps.append((t - last_wait_end) * 1e6)
            last_wait_end = None
    waits = clock.total.pop("read-back wait")
    phases = {k: round(v / verify_steps * 1e6, 1) for k, v in sorted(clock.total.items(), key=lambda kv: -kv[1])}
    result = dict(verify_steps=verify_steps, us_per_verify_step=phases,
                  wait_us_per_step=round(waits / verify_steps * 1e6, 1),
                  gap_wait_end_to_graph_launch_us=dict(median=round(statistics.median(gaps), 1),
                                                        p10=round(sorted(gaps)[len(gaps) // 10], 1),
                                                        p90=round(sorted(gaps)[9 * len(gaps) // 10], 1)),
                  device=torch.cuda.get_device_name(), tree=os.environ.get("TREE", ""))
    for k, v in phases.items():
        print(f"{k:40s} {v:8.1f} us / verify step")
    print(json.dumps(result))
    os.makedirs(os.path.join(args.out, "results"), exist_ok=True)
    with open(os.path.join(args.out, "results", "spec_host_phases_bs1.json"), "w") as f:
        json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
