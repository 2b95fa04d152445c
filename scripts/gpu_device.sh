#!/usr/bin/env bash
# On the lent GPU machine (see ../shared/GPU.md): after the wheel parts .gpu/c1..c8 are
# stashed, one command carrying .gpu/c9 runs
#   bash scripts/gpu_device.sh test                 # the GPU test tier (tests/gpu)
#   bash scripts/gpu_device.sh bench sync,switch    # python -m shunter.bench gpu, parts as named
# It installs vLLM 0.26 + Ray once per machine into /tmp/site, makes `shunter` importable
# from this checkout, and writes results under $OUT (when set).
set -uo pipefail
mode=${1:-test}
if ! [ -d /tmp/site/vllm ]; then
  bash .gpu/c9/on-device.sh install || { echo "install failed" >&2; exit 3; }
fi
mkdir -p /tmp/pkg && ln -sfn "$PWD" /tmp/pkg/shunter
export PYTHONPATH=/tmp/site:/tmp/pkg VLLM_ALLOW_INSECURE_SERIALIZATION=1 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
export VLLM_WORKER_MULTIPROC_METHOD=spawn  # an engine started in a process that already touched CUDA cannot fork
out=${OUT:-/tmp/out}; mkdir -p "$out"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader > "$out/gpu.txt" 2>&1
case $mode in
  test) python -m pytest -q -p no:cacheprovider -m gpu tests/gpu -x -rA 2>&1 | tail -80 | tee "$out/tests.txt" ;;
  bench) python -m shunter.bench gpu --config "${3:-examples/gpu_qwen05b.toml}" --parts "${2:-sync}" \
           --out "$out/gpu_${2//,/_}.json" 2>&1 | tail -120 ;;
  *) echo "usage: $0 test | bench PARTS [CONFIG]" >&2; exit 2 ;;
esac
