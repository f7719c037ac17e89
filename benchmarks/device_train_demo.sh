#!/usr/bin/env bash
# Issue 16 in one call on one GPU: train the demo model (demo/train.py, TIME_BUDGET seconds of
# training on the tokenized corpus in .corpus/, carried: python -m hybrid_serve.demo.corpus .corpus),
# then bf16 vs fp32 on the saved model (benchmarks/bf16_agreement_trained_demo.py).
# Transformers runs its torch GDN here: fla 0.6.0 refuses the gated chunk backward on Hopper
# with Triton < 3.7.1 (a Triton miscompile, fla #640), and the image has Triton 3.6.
# Usage (device machine, repo root): bash benchmarks/device_train_demo.sh [TIME_BUDGET] [BATCH]
# $OUT receives: run.log, config.json, train_log.json, training_manifest.json, loss_curve.png,
# model.safetensors.part0..1 (12 MiB pieces: cat them), bf16_agreement_trained_demo.json.
set -uo pipefail
OUT=${OUT:-./bench_out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
exec > >(tee "$OUT/run.log") 2>&1
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
python3 -VV
python3 -c "import sysconfig, torch, transformers; print(sysconfig.get_paths()['stdlib'], torch.__version__, transformers.__version__)"
python3 -c "import matplotlib; print('matplotlib', matplotlib.__version__)"
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1 || echo "pip install failed"
MODEL=/tmp/demo_trained
START=$(date +%s)
timeout ${TRAIN_TIMEOUT:-420} python3 -m hybrid_serve.demo.train --out $MODEL --corpus .corpus \
  --time-budget ${1:-270} --batch-size ${2:-128} 2>&1 | grep -v "falling back"
echo "train wall $(( $(date +%s) - START ))s"
cp $MODEL/config.json $MODEL/train_log.json $MODEL/training_manifest.json "$OUT"/
cp $MODEL/loss_curve.png "$OUT"/ 2>/dev/null
sha256sum $MODEL/model.safetensors
split -b 12M -d -a 1 $MODEL/model.safetensors "$OUT/model.safetensors.part"
timeout ${BENCH_TIMEOUT:-240} python3 benchmarks/bf16_agreement_trained_demo.py --model $MODEL 2>&1 \
  | grep -v "Loading weights\|falling back"
echo "total wall $(( $(date +%s) - START ))s"
