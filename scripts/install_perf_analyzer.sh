#!/usr/bin/env bash
# Install NVIDIA's perf_analyzer into a virtualenv as <venv>/bin/perf_analyzer.
#
# The PyPI package `perf-analyzer` is an empty placeholder. The C++ binary ships inside
# the tritonclient 2.50.0 manylinux wheel, the last one that both bundles it and runs on
# glibc 2.36 (Debian 12). It links libb64 (Debian: libb64-0d) and libcudart.so.12 even
# for CPU-only use; the latter comes from the small nvidia-cuda-runtime-cu12 wheel.
#
#   scripts/install_perf_analyzer.sh [VENV]      (default .venv; idempotent)
set -euo pipefail
VENV=${1:-.venv}
PY="$VENV/bin/python"
DEST="$VENV/lib/perf_analyzer"
WRAPPER="$VENV/bin/perf_analyzer"

if [ -x "$WRAPPER" ] && "$WRAPPER" --version >/dev/null 2>&1; then
  exit 0
fi

if ! ldconfig -p | grep -q 'libb64.so.0d'; then
  if [ "$(id -u)" = 0 ]; then
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq libb64-0d >/dev/null
  else
    echo "perf_analyzer needs libb64: sudo apt-get install libb64-0d" >&2
    exit 1
  fi
fi

"$PY" -m pip install --quiet "nvidia-cuda-runtime-cu12>=12.0,<13"
mkdir -p "$DEST"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"$PY" -m pip download --quiet --no-deps --only-binary=:all: --platform manylinux1_x86_64 \
  --python-version 3.11 tritonclient==2.50.0 -d "$tmp"
"$PY" -m zipfile -e "$tmp"/tritonclient-2.50.0-*.whl "$tmp/x" >/dev/null
cp "$tmp/x/tritonclient-2.50.0.data/data/bin/perf_analyzer" "$DEST/perf_analyzer"
chmod +x "$DEST/perf_analyzer"

cudart=$("$PY" -c 'import nvidia.cuda_runtime as m, os; print(os.path.join(list(m.__path__)[0], "lib"))')
cat > "$WRAPPER" <<WRAP
#!/usr/bin/env bash
export LD_LIBRARY_PATH="$cudart\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}"
exec "$(cd "$DEST" && pwd)/perf_analyzer" "\$@"
WRAP
chmod +x "$WRAPPER"
"$WRAPPER" --version
