#!/usr/bin/env bash
# The GPU path of the CUDA shim, on one NVIDIA GPU node, in under 5 minutes:
# ECC after N launches -> torch.AcceleratorError(error_code 214) -> Train restart -> resume.
# Needs: this repository, Python 3.10+, an NVIDIA driver, and pip access to ray and a CUDA torch.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m venv .venv-gpu
.venv-gpu/bin/pip install -q -e . "torch"   # a CUDA build of torch
nvidia-smi -L
timeout 300 .venv-gpu/bin/python -m pytest -m "chaos and gpu" suites/test_cuda_gpu.py -s -rA \
    --chaos-hosts plain --chaos-workers 2 --chaos-gpus-per-worker 1 --chaos-reports reports/gpu
