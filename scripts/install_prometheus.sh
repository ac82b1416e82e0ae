#!/usr/bin/env bash
# Install `prometheus` and `promtool` (Debian's prometheus package) for the metrics tests.
#
# The tests start their own Prometheus process (loopback, free port, temporary storage);
# they never use the system service. On a machine with systemd the package also starts
# that service on port 9090: `systemctl disable --now prometheus` stops it for good.
# Recommended packages (node exporter) are left out.
#
#   scripts/install_prometheus.sh      (idempotent)
set -euo pipefail

if command -v prometheus >/dev/null && command -v promtool >/dev/null; then
  exit 0
fi
if [ "$(id -u)" != 0 ]; then
  echo "the metrics tests need Prometheus: sudo apt-get install --no-install-recommends prometheus" >&2
  exit 1
fi
apt-get update -qq
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus >/dev/null
promtool --version | head -1
