#!/usr/bin/env bash
# The peers environment for `python -m bench.run --peers DIR`: DIR/venv with PyTriton
# (Triton's core and its Python backend) and ONNX Runtime. It is kept apart from the
# project's venv because PyTriton pins numpy < 2 and its own protobuf. Idempotent.
#
#   bash bench/peers/setup_env.sh DIR [PYTHON]      (PYTHON defaults to python3.11)
set -euo pipefail
DIR=${1:?usage: setup_env.sh DIR [PYTHON]}
PYTHON=${2:-python3.11}
if [ ! -x "$DIR/venv/bin/python" ]; then
  "$PYTHON" -m venv "$DIR/venv"
  "$DIR/venv/bin/python" -m pip install --quiet --upgrade pip
fi
"$DIR/venv/bin/python" -m pip install --quiet "nvidia-pytriton==0.7.0" onnxruntime numpy
"$DIR/venv/bin/python" -c "import pytriton, onnxruntime; print('peers environment ready')"
