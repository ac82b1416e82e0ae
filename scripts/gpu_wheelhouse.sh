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
# Beside them it fills DIR/clients with NVIDIA's Python client and what it needs (for the
# GPU tests' CUDA shared-memory examples) and DIR/perf_analyzer with NVIDIA's perf_analyzer
# binary (tritonclient 2.50.0 wheel) and the two libraries it links, libb64 (Debian's
# libb64-0d, fetched with apt-get download) and libcudart.so.12: the check installs or uses
# each where it finds it, and a part that cannot be fetched here is left out with a word why.
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
    -h|--help) sed -n '2,22p' "$0"; exit 0 ;;
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

# NVIDIA's client: only what the main wheels and the GPU machine's own stack do not bring.
CLIENTS="$OUT/clients"
mkdir -p "$CLIENTS"
mapfile -t clients < <("$PY" -m bench.gpu.requirements --clients)
if "$PY" -m pip download --quiet --disable-pip-version-check --only-binary=:all: \
    --python-version "$PYVER" --implementation cp --abi "$TAG" \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 --platform manylinux_2_24_x86_64 \
    --platform manylinux_2_5_x86_64 --platform manylinux1_x86_64 \
    -d "$CLIENTS" "${clients[@]}"; then
  for wheel in "$CLIENTS"/*.whl; do
    name=$(basename "$wheel" | cut -d- -f1)
    case "$name" in numpy|ml_dtypes) rm -f "$wheel"; continue ;; esac
    if compgen -G "$OUT/$name-[0-9]*.whl" >/dev/null; then rm -f "$wheel"; fi
  done
else
  echo "left out the clients: pip could not download ${clients[*]}" >&2
  rm -rf "$CLIENTS"
fi

bundle_perf_analyzer() {
  local dest=$1 tmp
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' RETURN
  "$PY" -m pip download --quiet --disable-pip-version-check --no-deps --only-binary=:all: \
    --platform manylinux1_x86_64 --python-version 3.11 tritonclient==2.50.0 -d "$tmp" &&
  "$PY" -m pip download --quiet --disable-pip-version-check --no-deps --only-binary=:all: \
    --platform manylinux2014_x86_64 --python-version "$PYVER" \
    'nvidia-cuda-runtime-cu12>=12.0,<13' -d "$tmp" &&
  (cd "$tmp" && apt-get download libb64-0d >/dev/null) || return 1
  mkdir -p "$dest/bin"
  "$PY" -m zipfile -e "$tmp"/tritonclient-2.50.0-*.whl "$tmp/client" >/dev/null
  "$PY" -m zipfile -e "$tmp"/nvidia_cuda_runtime_cu12-*.whl "$tmp/cudart" >/dev/null
  dpkg-deb -x "$tmp"/libb64-0d_*.deb "$tmp/b64"
  cp "$tmp/client/tritonclient-2.50.0.data/data/bin/perf_analyzer" "$dest/"
  cp "$tmp"/cudart/nvidia/cuda_runtime/lib/libcudart.so.12 "$dest/"
  cp "$(find "$tmp/b64" -name 'libb64.so.0d*' | head -1)" "$dest/libb64.so.0d"
  chmod +x "$dest/perf_analyzer"
  if command -v strip >/dev/null; then strip "$dest/perf_analyzer"; fi
  cat > "$dest/bin/perf_analyzer" <<'WRAP'
#!/usr/bin/env bash
here=$(cd "$(dirname "$0")/.." && pwd)
export LD_LIBRARY_PATH="$here${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
exec "$here/perf_analyzer" "$@"
WRAP
  chmod +x "$dest/bin/perf_analyzer"
  "$dest/bin/perf_analyzer" --version >/dev/null 2>&1  # the bundle runs on its own
}
rm -rf "$OUT/perf_analyzer"
if ! bundle_perf_analyzer "$OUT/perf_analyzer"; then
  echo "left out perf_analyzer: its wheel, libcudart or libb64-0d could not be fetched" >&2
  rm -rf "$OUT/perf_analyzer"
fi

count=$(find "$OUT" -maxdepth 1 -name '*.whl' | wc -l)
bytes=$(find "$OUT" -maxdepth 1 -name '*.whl' -printf '%s\n' | awk '{s += $1} END {print s + 0}')
echo "wheelhouse $OUT: $count wheels, $(awk -v b="$bytes" 'BEGIN {printf "%.1f MiB", b / 1048576}')"
echo "  with clients/ and perf_analyzer/: $(du -sh "$OUT" | cut -f1) in all"
find "$OUT" -maxdepth 1 -name '*.whl' -printf '%s %f\n' | sort -rn | head -5 |
  awk '{printf "  largest: %s (%.1f MiB)\n", $2, $1 / 1048576}'
