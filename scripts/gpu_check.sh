#!/usr/bin/env bash
# `make gpu-check`: every GPU-marked test and the GPU benchmark, in one command, on a machine
# with an NVIDIA GPU and no network -> bench/GPU_RESULTS.md.
#
#   [WHEELHOUSE=DIR] [GPU_CHECK_PYTHON=python3] bash scripts/gpu_check.sh [ARGS...]
#   GPU_CHECK_CPU=1 bash scripts/gpu_check.sh      (or --cpu / --dry-run: the CPU dry run)
#
# 1. preflight: Python 3.11 or 3.12 and a GPU that NVIDIA's driver sees, else stop here,
#    naming what is missing (exit 1);
# 2. a virtual environment (GPU_CHECK_VENV, default build/gpu-check/venv) that sees the
#    machine's own packages (CUDA PyTorch, CuPy, onnxruntime, cuda-bindings, nvidia-ml-py);
# 3. the project and its client installed from this checkout with --no-deps, then whatever of
#    their dependencies the machine lacks, from WHEELHOUSE only (scripts/gpu_wheelhouse.sh
#    builds one): pip never reaches an index (PIP_NO_INDEX=1);
# 4. from the wheelhouse's extras, NVIDIA's client where this Python lacks it, and its
#    perf_analyzer on the PATH;
# 5. python -m bench.gpu ARGS: discovery, the time budget, the tests, the benchmark, the report.
#
# The dry run (GPU_CHECK_CPU=1) skips the GPU preflight and runs the same harness on the CPU
# runtimes with a tiny grid, writing build/gpu-check/GPU_RESULTS.md; it uses .venv, the
# development environment, when that exists and GPU_CHECK_VENV is not set.
set -euo pipefail
cd "$(dirname "$0")/.."

export PIP_NO_INDEX=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PYTHONUNBUFFERED=1
CPU=${GPU_CHECK_CPU:-0}
ARGS=()
for arg in "$@"; do
  case "$arg" in
    --cpu|--dry-run) CPU=1 ;;
    *) ARGS+=("$arg") ;;
  esac
done
BASE=${GPU_CHECK_PYTHON:-python3}
say() { echo "gpu-check: $*"; }

if ! command -v "$BASE" >/dev/null; then
  say "no Python interpreter '$BASE' (set GPU_CHECK_PYTHON)" >&2
  exit 1
fi
if [ "$CPU" = 1 ]; then
  say "CPU dry run: the harness on the CPU runtimes, no GPU needed"
  ARGS=(--cpu "${ARGS[@]}")
  [ -x .venv/bin/python ] && VENV=${GPU_CHECK_VENV:-.venv}
else
  "$BASE" -m bench.gpu.preflight
fi
VENV=${VENV:-${GPU_CHECK_VENV:-build/gpu-check/venv}}
PY=$VENV/bin/python

if [ ! -x "$PY" ]; then
  say "creating $VENV from $("$BASE" -c 'import sys; print(sys.executable)') (system site packages)"
  "$BASE" -m bench.gpu.venv "$VENV"
fi

# Build isolation takes setuptools and wheel from the wheelhouse; without one, the
# environment's own setuptools builds the editable install.
FIND=(--no-build-isolation)
if [ -n "${WHEELHOUSE:-}" ]; then
  [ -d "$WHEELHOUSE" ] || { say "WHEELHOUSE=$WHEELHOUSE is not a directory" >&2; exit 1; }
  FIND=(--find-links "$WHEELHOUSE")
fi
ours='import sys, batchserve, batchserve_client; sys.exit(not batchserve.__file__.startswith(sys.argv[1]))'
if ! "$PY" -c "$ours" "$PWD/server/" 2>/dev/null; then
  say "installing this checkout (batchserve, batchserve_client) with --no-deps"
  "$PY" -m pip install --quiet --no-deps "${FIND[@]}" -e . -e clients/python
fi

unmet=$("$PY" -m bench.gpu.requirements --unmet)
if [ -n "$unmet" ]; then
  say "dependencies this Python lacks:"
  sed 's/^/  /' <<<"$unmet"
  if [ -z "${WHEELHOUSE:-}" ]; then
    say "set WHEELHOUSE=DIR to install them offline (scripts/gpu_wheelhouse.sh builds DIR)" >&2
    exit 1
  fi
  listed=$("$PY" -m bench.gpu.requirements)
  mapfile -t wanted <<<"$listed"
  say "installing them from $WHEELHOUSE (no index; what is already here is kept)"
  "$PY" -m pip install --quiet "${FIND[@]}" "${wanted[@]}"
fi

# The wheelhouse's extras (scripts/gpu_wheelhouse.sh): NVIDIA's client for the GPU tests,
# only the wheels this Python lacks and without resolving, so that nothing the machine has is
# replaced (a client that does not install fails only the tests that import it); and
# perf_analyzer, which then drives the served points.
if [ -n "${WHEELHOUSE:-}" ] && [ -d "$WHEELHOUSE/clients" ]; then
  mapfile -t missing < <("$PY" -m bench.gpu.requirements --missing-wheels "$WHEELHOUSE/clients")
  if [ -n "${missing[*]}" ]; then
    say "installing the GPU tests' clients: ${#missing[@]} wheels, without resolving"
    "$PY" -m pip install --quiet --no-deps "${missing[@]}" ||
      say "the clients did not install: the tests that import them will say so"
  fi
fi
if [ -n "${WHEELHOUSE:-}" ] && [ -x "$WHEELHOUSE/perf_analyzer/bin/perf_analyzer" ]; then
  PATH="$(cd "$WHEELHOUSE/perf_analyzer/bin" && pwd):$PATH"
  export PATH
fi

exec "$PY" -m bench.gpu "${ARGS[@]}"
