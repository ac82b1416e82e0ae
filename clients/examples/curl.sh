#!/usr/bin/env bash
# The REST API with curl: health, model metadata, and a JSON inference on digits_cnn.
#
#   bash clients/examples/curl.sh [HOST:PORT]      # default: $BATCHSERVE_HTTP or localhost:8000
set -euo pipefail
server="http://${1:-${BATCHSERVE_HTTP:-localhost:8000}}"
# --fail-with-body: exit non-zero on an HTTP error, still printing the server's {"error": ...}
get() { curl -sS --fail-with-body "$@"; echo; }

echo "# live and ready"
get "$server/v2/health/live"
get "$server/v2/health/ready"

echo "# the model's inputs and outputs"
get "$server/v2/models/digits_cnn"

echo "# classify one 8x8 image of a handwritten 0 (pixel values 0-16, row by row)"
get -X POST "$server/v2/models/digits_cnn/infer" -H 'Content-Type: application/json' -d '{
  "id": "curl-example",
  "inputs": [{"name": "image", "datatype": "FP32", "shape": [1, 1, 8, 8],
              "data": [0, 0, 5, 13, 9, 1, 0, 0,   0, 0, 13, 15, 10, 15, 5, 0,
                       0, 3, 15, 2, 0, 11, 8, 0,  0, 4, 12, 0, 0, 8, 8, 0,
                       0, 5, 8, 0, 0, 9, 8, 0,    0, 4, 11, 0, 1, 12, 7, 0,
                       0, 2, 14, 5, 10, 12, 0, 0, 0, 0, 6, 13, 10, 0, 0, 0]}],
  "outputs": [{"name": "probabilities"}]
}'
