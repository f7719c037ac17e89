"""Every skinny-linear launch a model's decode row makes, compiled for a GPU on a CPU-only machine
(issue 12): which variants of `kernels/linear`'s `_skinny_linear_kernel` the engine launches
(under its defaults, or a setting of environment variables read at launch), whether they
compile, and what ptxas gives them (registers a thread, spills, shared memory, programs an SM,
weight loads issued before the PDL wait), before any device time is spent on them.

    python benchmarks/skinny_compile_check.py [--models qwen3_next_80b_12l,qwen3_5_2p3b]
        [--settings "default;NAME=VALUE NAME2=VALUE2"] [--arch 90] [--json OUT.json]

Session 46 used it for the two experiment variables of the skinny kernel (a pipelined K loop,
weight tiles before the PDL wait) before session 47 measured and removed them. How: the
model's config (benchmarks/model_configs.py) with one layer of each kind, every other size
real; dummy bf16 weights; one decode token through the Triton path under Triton's interpreter, in a
subprocess, recording each `skinny_linear` call; those calls replayed under every setting with
the kernel launch recorded instead of run (the engine's own tile and prefetch choices); then
each distinct launch compiled here for the target (sm_90 by default; Triton's own ptxas) with
Triton's specialization of its arguments (16-byte pointers, integers divisible by 16 or equal
to 1). Programs an SM = min(by registers, by warps, by shared memory), for 132 SMs.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(__file__))

CAPTURE = r"""
import json, os, sys
import torch
torch.set_num_threads(2)
sys.path.insert(0, sys.argv[3])
from skinny_compile_check import record_launch
import hybrid_serve.kernels.linear as klinear
from hybrid_serve.mem_cache import KVPool, RequestRowTable, StatePool, StateSpec
from hybrid_serve.models import load_model
from hybrid_serve.models.forward_batch import ForwardBatch

model_dir, settings = sys.argv[1], json.loads(sys.argv[2])
model = load_model(model_dir, dtype="bfloat16", device="cpu", load_format="dummy", progress=False)[0]
calls = []
real_skinny = klinear.skinny_linear
def record_call(*args, **kwargs):
    calls.append((args, kwargs))
    return real_skinny(*args, **kwargs)
klinear.skinny_linear = record_call
kv = model.kv_spec()
spec = model.state_spec(torch.bfloat16) or StateSpec(1, 1, None, torch.bfloat16)
kv_pool = None
if kv is not None and model.layer_ids.num_attn_layers:
    kv_pool = KVPool(4, 16, model.layer_ids.num_attn_layers, kv.num_kv_heads, kv.head_dim, kv.v_head_dim,
                     torch.bfloat16, "cpu")
state_pool = StatePool(2, max(model.layer_ids.num_state_layers, 1), spec, "cpu")
table = RequestRowTable(1, 16, "cpu")
table.set_state_slot(1, 1)
table.set_kv_slots(1, 0, torch.arange(16, 32))
with torch.no_grad():
    fb = ForwardBatch.from_plan([1], [0], [1], table, kv_pool, state_pool)
    hidden = model(torch.tensor([7]), fb.positions, fb)
    model.compute_logits(hidden[fb.logits_indices])
klinear.skinny_linear = real_skinny
launches = {}
for name, env in settings.items():
    for key in {k for e in settings.values() for k in e}:
        os.environ.pop(key, None)  # the other settings' variables: back to their defaults
    os.environ.update(env)
    launches[name] = [record_launch(args, kwargs) for args, kwargs in calls]
print("LAUNCHES " + json.dumps(launches))
"""


def describe(value) -> list:
    """A launch argument as JSON: ["tensor", dtype] or ["value", the value (a Triton dtype by name)]."""
    import torch

    if torch.is_tensor(value):
        return ["tensor", str(value.dtype).replace("torch.", "")]
    if value is None or isinstance(value, (bool, int, float, str)):
        return ["value", value]
    return ["value", repr(value)]


def record_launch(args: tuple, kwargs: dict) -> dict:
    """`skinny_linear(*args, **kwargs)` with its kernel launch recorded instead of run: {"call":
    "NxK+fused inputs", "grid": programs, "args": [...], "kwargs": {...}}. Nothing runs, so an
    in-place epilogue leaves its inputs as they were."""
    import torch

    from hybrid_serve.kernels.linear import triton_linear

    weight = args[1] if len(args) > 1 else kwargs["weight"]
    fused = [k for k, v in kwargs.items() if k.startswith(("x_", "topk", "decode")) and v is not None and v is not False]
    rec = {"call": f"{weight.shape[0]}x{weight.shape[1]}" + ("+" + "+".join(fused) if fused else "")}

    class Record:
        def __getitem__(self, grid):
            def launch(*launch_args, **launch_kwargs):
                rec.update(grid=grid[0], args=[describe(a) for a in launch_args],
                           kwargs={k: describe(v) for k, v in launch_kwargs.items()})
            return launch

    real_kernel = triton_linear._skinny_linear_kernel
    triton_linear._skinny_linear_kernel = Record()
    try:
        with torch.no_grad():
            triton_linear.skinny_linear(*args, **kwargs)
    finally:
        triton_linear._skinny_linear_kernel = real_kernel
    return rec


SMS = 132  # H100 / H200 SXM
DTYPES = {"bfloat16": "*bf16", "float32": "*fp32", "float16": "*fp16", "int32": "*i32", "int64": "*i64"}


def capture(model: str, settings: dict[str, dict]) -> dict:
    from model_configs import CONFIGS

    cfg = CONFIGS[model]()
    kinds = list(dict.fromkeys(getattr(cfg, "layer_types", None) or getattr(cfg, "layers_block_type", None) or []))
    with tempfile.TemporaryDirectory() as tmp:
        if hasattr(cfg, "layer_types") and kinds:
            cfg.layer_types = kinds
            cfg.num_hidden_layers = len(kinds)
        elif hasattr(cfg, "hybrid_override_pattern"):  # Nemotron-H: one of each block kind
            pattern = "".join(dict.fromkeys(cfg.hybrid_override_pattern))
            cfg.hybrid_override_pattern, cfg.num_hidden_layers = pattern, len(pattern)
        cfg.save_pretrained(tmp)
        env = dict(os.environ, TRITON_INTERPRET="1", HYBRID_SERVE_KERNELS="triton")
        proc = subprocess.run([sys.executable, "-c", CAPTURE, tmp, json.dumps(settings),
                               os.path.dirname(os.path.abspath(__file__))],
                              capture_output=True, text=True, env=env, timeout=3600)
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("LAUNCHES ")), None)
    if line is None:
        raise RuntimeError(f"capture failed for {model}:\n{proc.stderr[-3000:]}")
    return json.loads(line[len("LAUNCHES "):])


def compile_launch(rec: dict, arch: int) -> dict:
    """Compile one recorded launch for sm_{arch}: ptxas's registers and spills, shared memory,
    programs an SM, weight loads before the PDL wait (SASS)."""
    import triton
    import triton.language as tl
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from hybrid_serve.kernels.linear.triton_linear import _skinny_linear_kernel

    fn = _skinny_linear_kernel.fn if hasattr(_skinny_linear_kernel, "fn") else _skinny_linear_kernel
    names = fn.arg_names
    params = {p.name: p for p in fn.params}
    bound = dict(zip(names, rec["args"]))
    opts = {}
    for k, v in rec["kwargs"].items():
        if k in ("num_warps", "num_stages"):
            opts[k] = v[1]
        else:
            bound[k] = v
    bound["PDL"] = ["value", True]  # launched with PDL on Hopper (kernels/_launch.py)
    sig, constexprs, attrs = {}, {}, {}
    for i, name in enumerate(names):
        kind, value = bound.get(name, ["default", params[name].default])
        if kind == "tensor":
            sig[name] = DTYPES[value]
            attrs[(i,)] = [["tt.divisibility", 16]]
        elif params[name].is_constexpr or value is None:
            sig[name] = "constexpr"
            constexprs[name] = getattr(tl, value.split(".")[-1]) if isinstance(value, str) and "triton" in value \
                else value
        elif isinstance(value, bool):
            sig[name] = "i1"
        elif isinstance(value, float):
            sig[name] = "fp32"
        elif value == 1:  # Triton specializes an integer 1 as a constant
            sig[name], constexprs[name] = "constexpr", 1
        else:
            sig[name] = "i32" if -2**31 <= value < 2**31 else "i64"
            if value % 16 == 0:
                attrs[(i,)] = [["tt.divisibility", 16]]
    kernel = triton.compile(ASTSource(fn=fn, signature=sig, constexprs=constexprs, attrs=attrs),
                            target=GPUTarget("cuda", arch, 32), options=opts)
    bin_dir = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")
    with tempfile.TemporaryDirectory() as tmp:
        ptx, cubin = os.path.join(tmp, "k.ptx"), os.path.join(tmp, "k.cubin")
        with open(ptx, "w") as f:
            f.write(kernel.asm["ptx"])
        suffix = "a" if arch >= 90 else ""
        out = subprocess.run([os.path.join(bin_dir, "ptxas"), f"-arch=sm_{arch}{suffix}", "-v", ptx, "-o", cubin],
                             capture_output=True, text=True)
        if out.returncode:
            return {"error": out.stderr[-500:]}
        sass = subprocess.run([os.path.join(bin_dir, "cuobjdump"), "-sass", cubin], capture_output=True,
                              text=True).stdout
    regs = int(re.findall(r"Used (\d+) registers", out.stderr)[0])
    spill = int(re.findall(r"(\d+) bytes spill stores", out.stderr)[0])
    warps = opts.get("num_warps", 4)
    smem = kernel.metadata.shared
    per_sm = min(65536 // (regs * 32 * warps), 64 // warps, (228 * 1024) // smem if smem else 32)
    lines = [ln for ln in sass.splitlines() if "/*" in ln]
    wait = next((i for i, ln in enumerate(lines) if "ACQBULK" in ln), len(lines))
    return {"regs": regs, "spill_bytes": spill, "smem_bytes": smem, "programs_per_sm": per_sm,
            "resident_fraction": min(1.0, per_sm * SMS / rec["grid"]),
            "loads_before_wait": sum("LDG" in ln for ln in lines[:wait]),
            "cp_async": kernel.asm["ptx"].count("cp.async.")}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default="qwen3_next_80b_12l,qwen3_5_2p3b")
    ap.add_argument("--settings", default="default",
                    help="'default' or NAME=VALUE pairs (space-separated) of variables read at launch, ';' between "
                         "settings")
    ap.add_argument("--arch", type=int, default=90)
    ap.add_argument("--json")
    args = ap.parse_args()
    settings = {}
    for item in args.settings.split(";"):
        pairs = [] if item.strip() == "default" else item.split()
        if not all("=" in pair for pair in pairs):
            raise SystemExit(f"--settings: {item!r} is not 'default' or NAME=VALUE pairs")
        settings[item] = dict(pair.split("=", 1) for pair in pairs)
    import datetime

    import triton
    from provenance import cpu_device, git_commit

    result = {"metric": "skinny_compile_check", "date": datetime.date.today().isoformat(), "commit": git_commit(),
              "device": f"{cpu_device()} (compiled for sm_{args.arch}, no GPU)", "triton": triton.__version__,
              "arch": args.arch, "settings": settings, "models": {}}
    for model in args.models.split(","):
        launches = capture(model, settings)
        rows = []
        print(f"\n{model}: {len(next(iter(launches.values())))} skinny launches a decode row")
        print(f"{'launch (N x K + fused)':52s} {'programs':>8s} " + " ".join(f"{s:>24s}" for s in settings))
        for i, rec in enumerate(launches[next(iter(settings))]):
            row = {"call": rec["call"], "programs": rec["grid"], "settings": {}}
            cells = []
            for s in settings:
                got = compile_launch(launches[s][i], args.arch)
                row["settings"][s] = got
                kw = launches[s][i]["kwargs"]
                tiles = f"BK{kw['BLOCK_K'][1]} W{kw['num_warps'][1]}"
                cells.append("ERROR" if "error" in got else
                             f"{tiles} {got['regs']}r {got['programs_per_sm']}/SM{'!' if got['spill_bytes'] else ''}")
            rows.append(row)
            print(f"{rec['call'][:52]:52s} {rec['grid']:>8d} " + " ".join(f"{c:>24s}" for c in cells), flush=True)
        result["models"][model] = rows
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
