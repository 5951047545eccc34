#!/usr/bin/env bash
# Real-GPU check of the GPU worker pool. Run on a host with an NVIDIA GPU, from the repository
# root: bash bench/gpu_check.sh [--gpu N]. It builds .venv-gpu from requirements-gpu.txt (the CUDA
# build of TensorFlow) unless it exists, then runs bench/gpu_check.py, which takes under 5 minutes.
set -euo pipefail
cd "$(dirname "$0")/.."
venv=${CLOCKQ_GPU_VENV:-.venv-gpu}
if [ ! -x "$venv/bin/python" ]; then
  python3 -m venv "$venv"
  "$venv/bin/pip" install --quiet --upgrade pip
  "$venv/bin/pip" install --quiet -r requirements-gpu.txt
fi
nvidia-smi --query-gpu=index,name,memory.total,driver_version --format=csv 2>/dev/null || true
exec timeout 300 "$venv/bin/python" bench/gpu_check.py "$@"
