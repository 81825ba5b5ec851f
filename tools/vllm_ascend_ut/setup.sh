#!/usr/bin/env bash
# Make a venv for the vLLM-Ascend tests/ut yardstick (tools/vllm_ascend_ut/run.py):
#   bash tools/vllm_ascend_ut/setup.sh VENV
# vllm 0.23.0 and vllm-ascend 0.23.0 are installed without their dependencies (vllm's pull a CUDA
# torch, vllm-ascend's a real torch_npu and CANN); the pure-Python packages vllm imports are
# installed with torch pinned to the CPU build; this checkout's pytest-npugraph is installed editable.
# tests/ut itself comes from a vLLM-Ascend checkout at v0.23.0 (git clone --branch v0.23.0 ...).
set -euo pipefail
VENV=${1:?usage: setup.sh VENV}
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
python -m venv --system-site-packages "$VENV"
PIP="$VENV/bin/python -m pip install -q --disable-pip-version-check"
$PIP --no-deps "vllm==0.23.0" "vllm-ascend==0.23.0" "torchvision==0.28.0"
$PIP -r "$HERE/requirements.txt" "torch==2.13.0" "transformers==5.5.4"    # vllm-ascend 0.23.0 pins 5.5.4
"$VENV/bin/python" "$HERE/cpu_torchvision.py" "$VENV/bin/python"
$PIP -e "$ROOT[test]" "torch==2.13.0"
echo "venv ready: $VENV"
