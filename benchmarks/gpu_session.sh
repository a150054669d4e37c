#!/usr/bin/env bash
# The GPU machine's measurements, one stage per device call, logs under $OUT.
#
# Run on the GPU machine from the project's root, after TensorFlow's GPU build
# was unpacked there (`/tmp/tfgpu/env.sh` exists; see docs/how-to/gpu.md):
#
#   bash benchmarks/gpu_session.sh timings   # gpu_cost.py --explain: ms/step, ratios, bits across rounds
#   bash benchmarks/gpu_session.sh bits      # cuDNN RNN repeatability, pytest -m gpu, tfdet check --device gpu
#   bash benchmarks/gpu_session.sh cpu16     # the built-in CNN on the host CPU's cores, GPU hidden
#   bash benchmarks/gpu_session.sh zoo16     # the kernels' bits on the host CPU (digests, tests), then
#                                            # tfdet cost over the zoo at its cores (GPU hidden, no XLA)
#   bash benchmarks/gpu_session.sh cost      # tfdet cost --device gpu on the CNN and two zoo models;
#                                            # then the zoo's encoder on the host's cores (GPU hidden)
#   bash benchmarks/gpu_session.sh noenable  # first steps' times without tfdet; check --no-enable
#                                            # (XLA_ONLY=1: only the first steps with XLA off / not autotuned)
#
# Device time is scarce (minutes per session), so each stage bounds every
# command with `timeout` and writes its log as it goes: a stage cut short
# still returns what it measured. `bits` runs its jobs side by side (they
# compare bits, not time); `timings` and `cpu16` run alone.
set -uo pipefail
cd "$(dirname "$0")/.."
# shellcheck disable=SC1091
source /tmp/tfgpu/env.sh
out=${OUT:-/tmp/tfdet-gpu-out}
mkdir -p "$out"
export PYTHONUNBUFFERED=1
budget=${BUDGET_S:-300}

case ${1:?stage: timings, bits, cpu16, cost, zoo16 or noenable} in
timings)
  { date -u; nvidia-smi; lscpu | head -20; python3 -m tfdet env; } >"$out/device.txt" 2>&1
  timeout "$budget" python3 benchmarks/gpu_cost.py --explain --rounds 3 --blocks 2 \
    --targets rnn,attention,conv,builtin:cnn \
    --steps 10 --warmup 3 --json "$out/gpu_cost.json" 2>&1 | tee "$out/gpu_cost.log"
  ;;
bits)
  for flavor in keras3 tf_keras; do
    timeout "$budget" python3 benchmarks/cudnn_rnn_repeatability.py --processes 5 \
      --parallel 5 --flavors "$flavor" --modes op_determinism,tfdet \
      >"$out/cudnn_rnn_$flavor.log" 2>&1 &
  done
  timeout "$budget" python3 -m pytest -m gpu -p no:cacheprovider -n 3 -v \
    tests/test_gpu.py >"$out/pytest_gpu.log" 2>&1 &
  {
    timeout "$budget" python3 -m tfdet check builtin:cnn --device gpu
    echo "exit $?"
    timeout "$budget" python3 -m tfdet check builtin:cnn --device gpu --perturb threads
    echo "exit $?"
  } >"$out/check_gpu.log" 2>&1 &
  wait
  tail -n 25 "$out"/*.log
  ;;
cost)
  { date -u; nvidia-smi --query-gpu=name,driver_version --format=csv; } >"$out/device.txt" 2>&1
  for target in builtin:cnn benchmarks/zoo.py:encoder benchmarks/zoo.py:resnet50; do
    name=${target##*:}
    timeout "$budget" python3 -m tfdet cost "$target" --device gpu --blocks 4 --steps 5 \
      --json "$out/cost_gpu_$name.json" >"$out/cost_gpu_$name.log" 2>&1
    echo "$target exit $?" >>"$out/cost_gpu_exits.log"
  done
  CUDA_VISIBLE_DEVICES="" timeout "$budget" python3 -m tfdet cost benchmarks/zoo.py:encoder \
    --blocks 4 --steps 3 --json "$out/cost_cpu16_encoder.json" >"$out/cost_cpu16_encoder.log" 2>&1
  tail -n 20 "$out"/cost_*.log
  ;;
cpu16)
  CUDA_VISIBLE_DEVICES="" timeout "$budget" python3 benchmarks/cost_of_determinism.py \
    --rounds 2 --blocks 3 --json "$out/cpu16.json" 2>&1 | tee "$out/cpu16.log"
  ;;
zoo16)
  # tensorflow-cpu's pack does (../shared/gpu/prepare.sh cpu): no GPU is
  # needed. tfdet's kernels come from the cache carried along
  # (TFDET_KERNEL_CACHE, built for the same TensorFlow elsewhere): the pack
  # has no C++ headers to build them here.
  export CUDA_VISIBLE_DEVICES=""
  end=$(( $(date +%s) + budget ))
  {
    date -u; lscpu; python3 -m tfdet env
    python3 -c "from tfdet._kernels import fixed_order as k; print('vector path:', k.vector_path())"
  } >"$out/device.txt" 2>&1
  {
    timeout 60 python3 benchmarks/fixed_order_digests.py; echo "exit $?"
    timeout 120 python3 -m pytest -p no:cacheprovider -n 8 -q \
      tests/test_fixed_order_kernels.py tests/test_patch_fixed_order_products.py; echo "exit $?"
  } >"$out/bits.log" 2>&1
  mkdir -p /tmp/zoo16
  for target in benchmarks/zoo.py:encoder benchmarks/zoo.py:resnet50 builtin:cnn \
      benchmarks/zoo.py:mobilenet_v2 benchmarks/zoo.py:lstm_text; do
    name=${target##*:}
    left=$(( end - $(date +%s) ))
    [ "$left" -gt 30 ] || { echo "$target: not timed, the budget is spent" >>"$out/zoo16.log"; continue; }
    case $name in resnet50|mobilenet_v2) schedule=(--steps 2 --warmup 1) ;; *) schedule=(--steps 3) ;; esac
    echo "== $target (${left} s left)" >>"$out/zoo16.log"
    timeout "$left" python3 -m tfdet cost "$target" --device cpu --no-xla --blocks 4 \
      "${schedule[@]}" --json "/tmp/zoo16/$name.json" >>"$out/zoo16.log" 2>&1
    echo "$target exit $?" >>"$out/zoo16.log"
    # One file back for all models (at most 8 files come back).
    python3 -c 'import json, pathlib, sys
reports = {p.stem: json.loads(p.read_text()) for p in sorted(pathlib.Path("/tmp/zoo16").glob("*.json"))}
pathlib.Path(sys.argv[1]).write_text(json.dumps(reports, indent=1))' "$out/zoo16.json"
  done
  tail -n 4 "$out/bits.log"; grep -E "^==|exit|^(plain TensorFlow|enable)" "$out/zoo16.log"
  ;;
noenable)
  # Where a check without tfdet spends its time on the GPU: plain TF's first
  # steps in fresh processes (defaults twice: the second process reuses the
  # CUDA cache; then op determinism), then the check itself, its
  # progress lines stamped with the seconds since it started.
  { date -u; nvidia-smi --query-gpu=name,driver_version --format=csv; } >"$out/device.txt" 2>&1
  [ -n "${XLA_ONLY:-}" ] || for mode in defaults defaults deterministic; do
    echo "== $mode"
    if [ "$mode" = deterministic ]; then export TF_DETERMINISTIC_OPS=1; else unset TF_DETERMINISTIC_OPS; fi
    timeout 100 python3 benchmarks/gpu_first_steps.py --steps 3 --dump 45 2>&1 | grep -v "^ *$"
    echo "exit ${PIPESTATUS[0]}"
  done >"$out/first_steps.log" 2>&1
  unset TF_DETERMINISTIC_OPS
  {
    echo "== defaults, XLA off (jit_compile=False)"
    timeout 100 python3 benchmarks/gpu_first_steps.py --steps 3 --dump 45 --no-xla 2>&1 | grep -v "^ *$"
    echo "exit ${PIPESTATUS[0]}"
    echo "== defaults, XLA without autotuning (--xla_gpu_autotune_level=0)"
    XLA_FLAGS=--xla_gpu_autotune_level=0 timeout 100 python3 benchmarks/gpu_first_steps.py \
      --steps 3 --dump 45 2>&1 | grep -v "^ *$"
    echo "exit ${PIPESTATUS[0]}"
  } >"$out/first_steps_xla.log" 2>&1
  [ -n "${XLA_ONLY:-}" ] && { tail -n 30 "$out"/first_steps_xla.log; exit 0; }
  start=$(date +%s)
  timeout "$budget" python3 -m tfdet check builtin:cnn --device gpu --no-enable --steps 3 \
    --no-attribute 2>&1 | while IFS= read -r line; do echo "$(( $(date +%s) - start )) s  $line"; done \
    >"$out/check_no_enable.log"
  tail -n 40 "$out"/first_steps.log "$out"/check_no_enable.log
  ;;
*)
  echo "unknown stage $1: timings, bits, cpu16, cost, zoo16 or noenable" >&2
  exit 2
  ;;
esac
