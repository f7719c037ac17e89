#!/usr/bin/env bash
# Issue 18's runs on a multi-GPU machine (device tool, nvidia-h100-x4 / nvidia-h200-x4), one call:
#   copy   the card's device-to-device copy rate (the roofline's bandwidth), GPU 0
#   80b    Qwen3-Next-80B-A3B, dummy bf16 weights, tp=4, served over HTTP with default engine
#          settings: start-up to /health (the engine's own breakdown is in serve.log), then
#          benchmarks/serve_bench.py with SGLang PR 10233's workload (1000 in / 1000 out,
#          range ratio 1, c=1 x 5 prompts and c=4 x 20 prompts, one warm-up request each)
#   agree  the trained demo at tp=2 and tp=4 vs tp=1, bf16 (benchmarks/tp_agreement_demo.py)
# Needs .devcache/raysite.tar.xz (../shared/tools/device-ray-bundle) carried.
#   probe  80b, with py-spy samples of the serving replica while it streams (.whl/py-spy carried)
# Usage (device machine, repo root): bash benchmarks/device_multi_gpu.sh [all|80b|agree|probe]   [writes to $OUT]
set -uo pipefail
OUT=${OUT:-./bench_out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
[ -d /tmp/raysite ] || tar -xJf .devcache/raysite.tar.xz -C /tmp
export PYTHONPATH=/tmp/raysite:${PYTHONPATH:-}
[ "${SKIP_INSTALL:-0}" = "1" ] || python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1 \
  || echo "pip install failed"
MODE=${1:-all}
TP=${TP:-4}
python3 - <<'EOF' 2>&1 | tee "$OUT/copy_rate.txt"
import torch
x = torch.randn(1 << 30, device="cuda")  # 4 GiB
y = torch.empty_like(x)
for _ in range(3):
    y.copy_(x)
torch.cuda.synchronize()
s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
s.record()
for _ in range(20):
    y.copy_(x)
e.record(); torch.cuda.synchronize()
ms = s.elapsed_time(e) / 20
print(f"copy_rate_TBps {2 * x.numel() * 4 / ms / 1e9:.3f} ({torch.cuda.get_device_name(0)})")
EOF
if ls .whl/*.whl >/dev/null 2>&1; then  # py-spy for the probe
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl \
    && export PATH=/tmp/site/bin:$PATH
fi
probe() {  # where the replica's threads spend time while it streams (py-spy: all threads, then GIL holders)
  until python3 -c "import urllib.request as u; u.urlopen('http://127.0.0.1:8000/health', timeout=2)" 2>/dev/null; do
    sleep 2
  done
  sleep ${PROBE_DELAY:-15}  # past the warm-up request, inside the c=1 run
  local pid; pid=$(pgrep -f "ServeReplica:hybrid-serve:LLMServer" | head -1)
  [ -z "$pid" ] && { echo "probe: no LLMServer process"; return; }
  py-spy dump --pid "$pid" > "$OUT/pyspy_dump.txt" 2>&1
  py-spy record --pid "$pid" --duration 8 --rate 250 --threads --format raw -o "$OUT/pyspy_all.txt" >/dev/null 2>&1
  py-spy record --pid "$pid" --duration 8 --rate 250 --threads --gil --format raw -o "$OUT/pyspy_gil.txt" >/dev/null 2>&1
  echo "probe: done (pid $pid)"
}
if [ "$MODE" = "all" ] || [ "$MODE" = "80b" ] || [ "$MODE" = "probe" ]; then
  python3 benchmarks/model_configs.py /tmp/models >/dev/null
  # a tokenizer that decodes every one of the model's ids (the demo's 4,096 would leave most
  # generated tokens without text, hence without a streamed chunk: benchmarks/synthetic_tokenizer.py)
  TOK=$(python3 benchmarks/synthetic_tokenizer.py /tmp/synth_tok 151936)
  # A Ray started as a user would (`ray start`), without the dashboard: the device's slim Ray
  # bundle has no dashboard build, and a local ray.init waits ~60 s for it to fail.
  python3 -c "from ray.scripts.scripts import main; main()" start --head --include-dashboard=false --disable-usage-stats \
    >/dev/null 2>&1 || echo "ray start failed"
  SERVE="python3 -m hybrid_serve.cli serve --model /tmp/models/${MODEL:-qwen3_next_80b_a3b} --load-format dummy --dtype bfloat16 \
    --device cuda -tp $TP --tokenizer $TOK --served-model-name qwen3-next-80b-a3b --port 8000 --address auto ${SERVE_ARGS:-}"
  [ "$MODE" = "probe" ] && probe &
  timeout ${HEADLINE_TIMEOUT:-420} python3 benchmarks/serve_bench.py --start-server "$SERVE > $OUT/serve.log 2>&1" \
    --startup-timeout ${STARTUP_TIMEOUT:-300} --input-len 1000 --output-len 1000 --range-ratio 1.0 --vocab 151936 \
    --concurrency ${CONCURRENCY:-1,4} --num-prompts ${NUM_PROMPTS:-5,20} --label "qwen3-next-80b-a3b tp=$TP dummy bf16" \
    --json "$OUT/qwen3_next_80b_tp${TP}_http.json"
  echo "serve_bench exit: $?"
  grep -a "engine ready\|Error\|error\|Traceback" "$OUT/serve.log" | grep -v "^$" | head -20
  wait
  pkill -INT -f "hybrid_serve.cli serve" 2>/dev/null; sleep 3
  python3 -c "from ray.scripts.scripts import main; main()" stop --force >/dev/null 2>&1
fi
if [ "$MODE" = "all" ] || [ "$MODE" = "agree" ]; then
  timeout ${AGREE_TIMEOUT:-240} python3 benchmarks/tp_agreement_demo.py --device cuda --tps ${AGREE_TPS:-2,4} \
    --dtypes ${AGREE_DTYPES:-bfloat16} 2>&1 | grep -v "Loading\|Warm-up\|it/s\]\|^(" | tail -12
fi
ls -la "$OUT"
