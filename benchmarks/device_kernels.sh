#!/usr/bin/env bash
# GPU check of the Triton kernels: compiled tests (incl. `gpu`-marked serving shapes), the
# kernel table, the skinny-linear sweep against cuBLAS (weights cold), and transformers'
# baseline for the 2.3B decode benchmark, on one card. Decode figures: device_decode.sh.
# Usage (device machine, repo root): bash benchmarks/device_kernels.sh  [writes to $OUT]
set -uo pipefail
OUT=${OUT:-./bench_out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1 || echo "pip install failed"
python3 -c "import torch, triton, transformers; print('torch', torch.__version__, 'triton', triton.__version__, 'transformers', transformers.__version__)"
timeout 300 python3 -m pytest -q -x tests/kernels -p no:cacheprovider 2>&1 | tee "$OUT/kernel_tests.log" | tail -25
timeout 240 python3 benchmarks/kernels_bench.py 2>&1 | tee "$OUT/kernels_bench.log" | tail -40
timeout 200 python3 benchmarks/linear_sweep.py --quick --json "$OUT/linear_sweep.json" 2>&1 | tee "$OUT/linear_sweep.log" | grep -v "^  "
if [ -f .devcache/hf_baseline.py ]; then timeout 200 python3 .devcache/hf_baseline.py 2>&1 | tee "$OUT/hf_baseline.log" | tail -6; fi
