"""batchserve_client's generated messages: up to date with the server's protocol, and
importable next to tritonclient's (and the server's) ``inference`` messages."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
import tritonclient.grpc as triton_grpc
from batchserve_client import Client
from google.protobuf import descriptor_pool

from tests.integration.server import REPO_ROOT, ServerProcess

SCRIPT = REPO_ROOT / "clients/python/scripts/gen_protos.py"


def test_regenerating_the_messages_gives_the_committed_files() -> None:
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--check"], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr


@pytest.mark.parametrize(
    "imports",
    [
        "import tritonclient.grpc; import batchserve_client._proto.v2_pb2",
        "import batchserve_client._proto.v2_pb2; import tritonclient.grpc",
        "import batchserve.proto.grpc_service_pb2; import batchserve_client._proto.v2_pb2",
    ],
)
def test_the_messages_load_next_to_other_inference_protos(imports: str) -> None:
    """Two registrations of one proto file name fail at import ("duplicate file name")."""
    done = subprocess.run(
        [sys.executable, "-c", imports], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr


def test_tritonclient_and_batchserve_client_call_one_server_from_one_process(
    server: ServerProcess,
) -> None:
    images = np.zeros((2, 1, 8, 8), np.float32)
    triton = triton_grpc.InferenceServerClient(server.grpc_url)
    try:
        request = triton_grpc.InferInput("image", list(images.shape), "FP32")
        request.set_data_from_numpy(images)
        expected = triton.infer("digits_cnn", [request]).as_numpy("logits")
    finally:
        triton.close()
    with Client(f"grpc://{server.grpc_url}") as client:
        result = client.infer("digits_cnn", {"image": images}, outputs=["logits"])
    np.testing.assert_array_equal(result["logits"], expected)
    pool = descriptor_pool.Default()
    for name in ("inference.ModelInferRequest", "batchserve_client.v2.ModelInferRequest"):
        assert pool.FindMessageTypeByName(name).fields_by_name["raw_input_contents"].number == 7
