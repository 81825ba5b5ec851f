#!/usr/bin/env bash
# Make vLLM-Ascend 0.23.0's Python sources importable in a venv, for tests/thirdparty/vllm_ascend.
#
# Usage: tools/vllm_ascend/setup.sh VENV_DIR SRC_DIR
#   VENV_DIR  the venv to install into (its bin/python is used; nothing else is touched)
#   SRC_DIR   vLLM-Ascend's source tree at release 0.23.0: a checkout of the v0.23.0 tag of
#             vllm-project/vllm-ascend, or the unpacked sdist (the sdist needs CANN to build, so it is
#             not installed: its sources are put on PYTHONPATH instead)
#
# What it does: installs vllm==0.23.0 with --no-deps (vllm pins a CUDA torch; the venv keeps its own)
# and the pure-Python packages importing vllm and vllm_ascend's layers needs; writes
# SRC_DIR/vllm_ascend/_build_info.py (setup.py generates it at build time) if missing, for an A3
# device; leaves triton out (with it, vLLM-Ascend takes its triton-ascend kernels, which need a real NPU).
# Then prints the PYTHONPATH to export:  export PYTHONPATH=SRC_DIR${PYTHONPATH:+:$PYTHONPATH}
set -euo pipefail
if [ $# -ne 2 ]; then
    sed -n 2,16p "$0" | sed 's/^# \{0,1\}//'
    exit 2
fi
VENV=$1
SRC=$(cd "$2" && pwd)
PY="$VENV/bin/python"
[ -x "$PY" ] || { echo "no python at $PY" >&2; exit 2; }
[ -d "$SRC/vllm_ascend" ] || { echo "$SRC has no vllm_ascend/ package" >&2; exit 2; }

"$PY" -m pip install --quiet --no-deps vllm==0.23.0
# what `import vllm` and vllm_ascend.ops / .attention / .quantization need at import time
"$PY" -m pip install --quiet cbor2 psutil pyzmq gguf aiohttp openai openai-harmony einops pillow pybase64 \
    cachetools msgspec cloudpickle blake3 prometheus_client transformers pyyaml regex requests tqdm \
    py-cpuinfo safetensors scipy decorator uvloop llguidance loguru frozendict
# these pin a torch of their own: installed without their dependencies (the ones they import are above)
"$PY" -m pip install --quiet --no-deps compressed-tensors "xgrammar>=0.2.0,<1.0.0" apache-tvm-ffi numba llvmlite
if "$PY" -c "import triton" 2>/dev/null; then
    echo "note: triton is installed in $VENV; vLLM-Ascend then takes its triton paths (rope, ...), which" \
         "need a real NPU: pip uninstall triton for the emulated runs" >&2
fi
if [ ! -f "$SRC/vllm_ascend/_build_info.py" ]; then
    printf "# Auto-generated file (tools/vllm_ascend/setup.sh)\n__device_type__ = 'A3'\n" \
        > "$SRC/vllm_ascend/_build_info.py"
fi
"$PY" - "$SRC" <<'PYEOF'
import sys
sys.path.insert(0, sys.argv[1])
import vllm
print(f"vllm {vllm.__version__} imports; vllm_ascend sources at {sys.argv[1]}", file=sys.stderr)
PYEOF
echo "export PYTHONPATH=$SRC\${PYTHONPATH:+:\$PYTHONPATH}"
