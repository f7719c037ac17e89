"""What every tensor-parallel rank runs: its `Shard` (model slice, pools, request-row
table), the `StepPlan` it receives each step, the `ModelRunner` that applies a plan and
runs the forward, and the decode CUDA graphs."""
from .shard import Shard
from .step_plan import StepPlan

__all__ = ["Shard", "StepPlan"]
