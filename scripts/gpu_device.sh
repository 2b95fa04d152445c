#!/usr/bin/env bash
# On the lent GPU machine (see ../shared/GPU.md): after the wheel parts .gpu/c1..c8 are
# stashed, one command carrying .gpu/c9 runs
#   bash scripts/gpu_device.sh test [PYTEST ARGS]     # the GPU test tier (tests/gpu)
#   bash scripts/gpu_device.sh bench sync,switch [CONFIG]   # python -m shunter.bench gpu, parts as named
#   bash scripts/gpu_device.sh model [CONFIG]         # build the config's model (before parallel benches)
# It installs vLLM 0.26 + Ray once per machine into /tmp/site, makes `shunter` importable
# from this checkout, and writes results under $OUT (when set). Two of these can run at once
# on a two-GPU machine, one per GPU (CUDA_VISIBLE_DEVICES=0 / 1): each starts its own Ray.
set -uo pipefail
mode=${1:-test}
if ! [ -d /tmp/site/vllm ]; then
  bash .gpu/c9/on-device.sh install || { echo "install failed" >&2; exit 3; }
fi
mkdir -p /tmp/pkg && ln -sfn "$PWD" /tmp/pkg/shunter
export PYTHONPATH=/tmp/site:/tmp/pkg VLLM_ALLOW_INSECURE_SERIALIZATION=1 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
export VLLM_WORKER_MULTIPROC_METHOD=spawn  # an engine started in a process that already touched CUDA cannot fork
export PYTHONUNBUFFERED=1
out=${OUT:-/tmp/out}; mkdir -p "$out"
tag=${CUDA_VISIBLE_DEVICES:+_gpu${CUDA_VISIBLE_DEVICES//,/}}
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader > "$out/gpu.txt" 2>&1
case $mode in
  test) python -m pytest -q -p no:cacheprovider -m gpu tests/gpu -rA "${@:2}" 2>&1 | tee "$out/tests$tag.txt" | tail -60 ;;
  bench) python -m shunter.bench gpu --config "${3:-examples/gpu_qwen05b.toml}" --parts "${2:-sync}" \
           --out "$out/gpu_${2//,/_}$tag.json" 2>&1 | tee "$out/bench_${2//,/_}$tag.log" | tail -60 ;;
  model) python -c "import sys; from shunter.engine.config import load_config; from shunter.engine.models.tiny import build_tiny_model as b
m = load_config(sys.argv[1]).model; print(b(m.path, m.build_tiny, sft_steps=m.sft_steps, preset=m.preset))" "${2:-examples/gpu_qwen05b.toml}" ;;
  *) echo "usage: $0 test [PYTEST ARGS] | bench PARTS [CONFIG] | model [CONFIG]" >&2; exit 2 ;;
esac
