#!/usr/bin/env bash
# Issue 16 on a two-GPU machine (nvidia-h200-x2 or larger), the steps in STEPS, in order:
#   tp2      bf16 tp=2 vs tp=1 on the shipped demo (benchmarks/tp_agreement_demo.py, NCCL, 64 prompts)
#   dettest  tests/gpu/test_train_deterministic.py, then 30 steps of the real batch with and without
#            --deterministic at once (one GPU each): what determinism costs a step
#   dettrain demo/train.py --deterministic with the shipped defaults, the same seed once on each GPU
#            at once: the two files' hashes must be equal; brings back the first run's directory
# Needs the Ray bundle (../shared/tools/device-ray-bundle; carry .devcache) for tp2. The corpus is
# tokenized here from this machine's interpreter; its hash is printed beside the shipped demo's.
# Usage (device machine, repo root): STEPS="tp2 dettest dettrain" bash benchmarks/device_demo_gpu_checks.sh
# $OUT receives: run.log, tp_vs_tp1_trained_demo_cuda.json, det_train_*.json, det_model.tar.part0..
set -uo pipefail
OUT=${OUT:-./bench_out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
exec > >(tee "$OUT/run.log") 2>&1
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
python3 -VV
if [ -f .devcache/raysite.tar.xz ]; then tar -xJf .devcache/raysite.tar.xz -C /tmp && export PYTHONPATH=/tmp/raysite:${PYTHONPATH:-}; fi
python3 -m pip install -q --no-deps --no-build-isolation -e . >/dev/null 2>&1 || echo "pip install failed"
STEPS=${STEPS:-"tp2 dettest dettrain"}
START=$(date +%s)
elapsed() { echo "[$(( $(date +%s) - START ))s] $*"; }
CORPUS=/tmp/corpus
python3 -m hybrid_serve.demo.corpus $CORPUS > /tmp/corpus.log 2>&1 &
CORPUS_PID=$!
for step in $STEPS; do
  case $step in
  tp2)
    elapsed "tp2"
    timeout ${TP_TIMEOUT:-240} python3 benchmarks/tp_agreement_demo.py --device cuda --tps 2 --dtypes bfloat16 \
      2>&1 | grep -v "falling back"
    ;;
  dettest)
    elapsed "dettest"
    timeout 300 python3 -m pytest -q -p no:cacheprovider tests/gpu/test_train_deterministic.py 2>&1 | tail -3
    wait $CORPUS_PID; tail -1 /tmp/corpus.log
    PIDS=()
    for mode in plain deterministic; do
      flag=--no-deterministic; dev=0; [ $mode = deterministic ] && flag=--deterministic && dev=1
      # shellcheck disable=SC2086
      CUDA_VISIBLE_DEVICES=$dev timeout 240 python3 -m hybrid_serve.demo.train --out /tmp/speed_$mode --corpus $CORPUS \
        --steps 30 --warmup 10 --eval-every 0 --eval-windows 4 --log-every 10 $flag > /tmp/speed_$mode.log 2>&1 &
      PIDS+=($!)
    done
    wait "${PIDS[@]}"
    for mode in plain deterministic; do echo "== $mode"; grep -E "step 30|held-out|Error" /tmp/speed_$mode.log; done
    ;;
  dettrain)
    elapsed "dettrain"
    wait $CORPUS_PID; tail -1 /tmp/corpus.log
    python3 -c "import json; print('corpus_sha256', json.load(open('$CORPUS/manifest.json'))['corpus_sha256'])"
    PIDS=()
    for dev in 0 1; do
      CUDA_VISIBLE_DEVICES=$dev timeout ${TRAIN_TIMEOUT:-420} python3 -m hybrid_serve.demo.train --out /tmp/det_$dev \
        --corpus $CORPUS --deterministic ${TRAIN_ARGS:-} > /tmp/det_$dev.log 2>&1 &
      PIDS+=($!)
    done
    wait "${PIDS[@]}"
    for dev in 0 1; do
      echo "== det run on GPU $dev"; grep -E "00/|held-out|Error" /tmp/det_$dev.log
      sha256sum /tmp/det_$dev/model.safetensors
      python3 -c "import json,sys; d=json.load(open(sys.argv[1])); d.pop('log', None); json.dump(d, open(sys.argv[2], 'w'), indent=1)" \
        /tmp/det_$dev/train_log.json "$OUT/det_train_gpu$dev.json"
    done
    (cd /tmp/det_0 && tar -cf /tmp/det_model.tar . && split -b 15M -d -a 1 /tmp/det_model.tar "$OUT/det_model.tar.part")
    ;;
  esac
done
elapsed "done"; ls -la "$OUT"
