#!/usr/bin/env bash
# Build the wheel directory `make gpu-check` installs from on a GPU machine with no network.
#
#   scripts/gpu_wheelhouse.sh [--python 3.12] [--out DIR] [--full]
#
# Run it on a machine that reaches PyPI. It downloads, as manylinux x86_64 wheels for the
# given CPython (3.11 or 3.12), the server's and the client's dependencies (pyproject.toml),
# what the GPU tests and benchmark add (bench/gpu/requirements.py) and the build backend
# (setuptools, wheel), each with everything it needs in turn, and prints the size.
#
# The GPU machine's own stack is never downloaded: PyTorch, onnxruntime(-gpu), TensorRT,
# cuda-python, CuPy and NVIDIA's libraries are neither dependencies here nor wanted from
# here (an onnxruntime wheel would hide onnxruntime-gpu). numpy and onnx (with ml_dtypes,
# which only onnx needs here) are left out too unless --full is given: 24 MiB together, and
# a Python that exports PyTorch models to ONNX has them.
# Then copy DIR to the GPU machine and run `WHEELHOUSE=DIR make gpu-check` there.
set -euo pipefail
cd "$(dirname "$0")/.."

PYVER=3.12
OUT=""
FULL=0
while [ $# -gt 0 ]; do
  case "$1" in
    --python) PYVER=$2; shift 2 ;;
    --out) OUT=$2; shift 2 ;;
    --full) FULL=1; shift ;;
    -h|--help) sed -n '2,16p' "$0"; exit 0 ;;
    *) echo "gpu_wheelhouse: unknown argument $1" >&2; exit 2 ;;
  esac
done
case "$PYVER" in
  3.11|3.12) ;;
  *) echo "gpu_wheelhouse: --python must be 3.11 or 3.12, not $PYVER" >&2; exit 2 ;;
esac
TAG=cp${PYVER/./}
OUT=${OUT:-build/wheelhouse-$TAG}
PY=${PYTHON:-python3}

mkdir -p "$OUT"
mapfile -t wanted < <("$PY" -m bench.gpu.requirements; "$PY" -m bench.gpu.requirements --build)
echo "downloading for CPython $PYVER (manylinux x86_64) into $OUT:"
printf '  %s\n' "${wanted[@]}"

# pip resolves the whole tree for the target interpreter and platform; only wheels qualify.
"$PY" -m pip download --quiet --disable-pip-version-check --only-binary=:all: \
  --python-version "$PYVER" --implementation cp --abi "$TAG" \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux2014_x86_64 \
  -d "$OUT" "${wanted[@]}"

if [ "$FULL" = 0 ]; then
  for name in numpy onnx ml_dtypes; do
    rm -f "$OUT"/"$name"-[0-9]*.whl
  done
  echo "left out numpy, onnx and ml_dtypes (the GPU machine's own are used; --full keeps them)"
fi

count=$(find "$OUT" -maxdepth 1 -name '*.whl' | wc -l)
bytes=$(find "$OUT" -maxdepth 1 -name '*.whl' -printf '%s\n' | awk '{s += $1} END {print s + 0}')
echo "wheelhouse $OUT: $count wheels, $(awk -v b="$bytes" 'BEGIN {printf "%.1f MiB", b / 1048576}')"
find "$OUT" -maxdepth 1 -name '*.whl' -printf '%s %f\n' | sort -rn | head -5 |
  awk '{printf "  largest: %s (%.1f MiB)\n", $2, $1 / 1048576}'
