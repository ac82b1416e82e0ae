#!/usr/bin/env bash
# Build the GPU contract virtualenv (make gpu-contract): onnxruntime-gpu, cuda-python and
# nvidia-ml-py at the versions the `gpu` extra resolves to, the project with its `export`
# extra, and TensorRT 10's and 11's Python API each in a directory of its own (both are the
# module `tensorrt`). Then stub C libraries for every CUDA, cuDNN and TensorRT library those
# packages link, generated from the installed binaries (tests/stubs/gen_stubs.py), and the
# NVML stub, so the real packages run on a machine without a GPU up to their first device call.
#
# Usage: scripts/gpu_contract_venv.sh [VENV]   (default .venv-gpu-contract; PYTHON=python3)
set -euo pipefail
cd "$(dirname "$0")/.."

venv=${1:-.venv-gpu-contract}
contract=tests/gpu_contract
for tool in cc readelf nm ldd; do
    command -v "$tool" >/dev/null || { echo "$0: needs $tool (a C compiler and binutils)" >&2; exit 1; }
done

rm -rf "$venv"
"${PYTHON:-python3}" -m venv "$venv"
py="$venv/bin/python"
pip=("$py" -m pip --disable-pip-version-check --quiet)
# --no-compile: byte-compiling every installed module (torch's thousands among them) took
# 50 s of the 2 minutes this script took on 2 cores; the two test passes import a fraction.

"${pip[@]}" install --no-compile -r "$contract/requirements.txt" -e ".[export]"
if "$py" -m pip show onnxruntime >/dev/null 2>&1; then
    echo "$venv: the CPU onnxruntime got in; it would shadow onnxruntime-gpu" >&2
    exit 1
fi
for major in 10 11; do
    "${pip[@]}" install --no-compile --no-deps --target "$venv/tensorrt-$major" \
        -r "$contract/requirements-tensorrt$major.txt"
done

site=$("$py" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
"$py" tests/stubs/gen_stubs.py --out "$venv/stubs" --cuda-bindings "$site/cuda/bindings" \
    --also libcuda.so.1 \
    "$site"/onnxruntime/capi/*.so "$venv"/tensorrt-*/tensorrt_bindings/tensorrt.so
"$py" - "$venv/stubs" <<'PY'
import sys
from pathlib import Path

from tests.stubs.nvml import build_nvml_stub

stubs = Path(sys.argv[1])
build_nvml_stub(stubs)
build_nvml_stub(stubs / "nvml-no-temperature-v", temperature_v=False)
PY
touch "$venv/.stamp"
