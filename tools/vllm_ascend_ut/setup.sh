#!/usr/bin/env bash
# Make a venv for the vLLM-Ascend tests/ut yardstick (tools/vllm_ascend_ut/run.py):
#   bash tools/vllm_ascend_ut/setup.sh VENV SRC
# SRC is a vLLM-Ascend checkout at v0.23.0 (its vllm_ascend/ sources and tests/ut; run.py runs from
# it, so the sources are imported from there).  tools/vllm_ascend/setup.sh installs vllm 0.23.0
# without dependencies and what importing vllm_ascend needs; this adds what tests/ut imports besides
# (requirements.txt, transformers 5.5.4 as vLLM-Ascend pins it, torchvision), with torch pinned to
# the CPU build, and this checkout's pytest-npugraph editable.  PyPI's torchvision wheel is a CUDA
# build: cpu_torchvision.py makes it importable next to the CPU torch.
set -euo pipefail
VENV=${1:?usage: setup.sh VENV SRC}
SRC=${2:?usage: setup.sh VENV SRC}
HERE=$(cd "$(dirname "$0")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
python -m venv --system-site-packages "$VENV"
bash "$ROOT/tools/vllm_ascend/setup.sh" "$VENV" "$SRC" >/dev/null
PIP="$VENV/bin/python -m pip install -q --disable-pip-version-check"
$PIP -r "$HERE/requirements.txt" "torch==2.13.0" "transformers==5.5.4"
$PIP --no-deps "torchvision==0.28.0"
"$VENV/bin/python" "$HERE/cpu_torchvision.py" "$VENV/bin/python"
$PIP --no-deps -e "$ROOT"
# vLLM finds its platform and general plugins through vllm_ascend's entry points (setup.py of v0.23.0);
# the sources are imported from the checkout, so only its metadata is installed: without it vLLM's
# current_platform is UnspecifiedPlatform ("Failed to infer device type", manual_seed_all raising)
SITE=$("$VENV/bin/python" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
DIST="$SITE/vllm_ascend-0.23.0.dist-info"
mkdir -p "$DIST"
printf 'Metadata-Version: 2.1\nName: vllm_ascend\nVersion: 0.23.0\n' > "$DIST/METADATA"
printf '%s\n' '[vllm.platform_plugins]' 'ascend = vllm_ascend:register' '' '[vllm.general_plugins]' \
    'ascend_kv_connector = vllm_ascend:register_connector' 'ascend_model_loader = vllm_ascend:register_model_loader' \
    'ascend_service_profiling = vllm_ascend:register_service_profiling' 'ascend_model = vllm_ascend:register_model' \
    > "$DIST/entry_points.txt"
: > "$DIST/RECORD"
echo "venv ready: $VENV (run: python tools/vllm_ascend_ut/run.py --venv $VENV --src $SRC)"
