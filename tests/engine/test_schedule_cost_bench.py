"""benchmarks/schedule_cost.py on a tiny workload (CPU, demo model): the closed loop runs, the
state pool fills so that admissions evict, and evicting a few ahead makes fewer passes over
the checkpoints for as many evicted."""
import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "benchmarks"))


@pytest.mark.xdist_group("cpu_engine")
def test_schedule_cost_runs_and_spare_saves_passes():
    from schedule_cost import run

    from hybrid_serve.mem_cache import CacheManager

    default = CacheManager.EVICT_SPARE_MAX
    one = run(160, 72, 0, 0, input_len=48, output_len=8, concurrency=8)  # ~64 checkpoints held: spare 2
    ahead = run(160, 72, 32, 0, input_len=48, output_len=8, concurrency=8)
    assert CacheManager.EVICT_SPARE_MAX == default  # the class default untouched
    assert one["steps"] > 0 and one["checkpoints_evicted"] > 8
    assert one["evict_state_calls"] >= one["checkpoints_evicted"]  # one pass per slot (or none found)
    assert ahead["evict_state_calls"] < one["evict_state_calls"]
    assert ahead["checkpoints_evicted"] >= one["checkpoints_evicted"] - 2


@pytest.mark.xdist_group("cpu_engine")
def test_schedule_cost_first_wave_cached_runs():
    """--first-wave-cached: the first wave once before the timed loop (loaded_tpot.py's warm-up),
    so the timed loop starts by admitting its prompts as cache hits; the first step is timed."""
    from schedule_cost import run

    cold = run(24, 72, 32, 0, input_len=48, output_len=8, concurrency=8)
    warm = run(24, 72, 32, 0, input_len=48, output_len=8, concurrency=8, first_wave_cached=True)
    assert warm["steps"] > 0 and 0 < warm["first_step_schedule_ms"] <= warm["schedule_max_ms"]
    assert cold["first_step"]["rows"] == warm["first_step"]["rows"] == 8  # the whole first wave admitted
    assert cold["first_step"]["cached_tokens"] == 0 < warm["first_step"]["cached_tokens"]
    assert warm["first_step"]["tokens"] < cold["first_step"]["tokens"]


@pytest.mark.xdist_group("cpu_engine")
def test_schedule_cost_full_batch_runs():
    """--full-batch: a sweep fills the tree, then one batch decodes with the state pool full;
    its replies ask for dominated-only evictions at page boundaries, and the decode steps'
    scheduling is timed."""
    from schedule_cost import full_batch

    row = full_batch(48, 4, 0, num_prompts=32, input_len=64, output_len=24)
    assert row["decode_steps"] > 10
    assert 0 < row["decode_schedule_cpu_median_ms"] <= row["decode_schedule_median_ms"] * 1.5 + 0.5
    assert row["dominated_only_evictions_asked"] > 0 and row["checkpoints_held"] > 0
