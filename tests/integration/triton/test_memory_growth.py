"""memory_growth_test.py: a fresh client per request, many times, each answer checked.

The example's default is 1000 repetitions of custom_identity_int32; a smaller count keeps
the suite quick while still opening and dropping a client (and its connection) each time.
"""

from __future__ import annotations

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from tests.integration.server import ServerProcess
from tests.integration.triton.checks import INPUT0, TIMEOUT, grpc_client, http_client

REPETITIONS = 25


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_memory_growth_test(triton_server: ServerProcess, protocol: str) -> None:
    for _ in range(REPETITIONS):
        if protocol == "grpc":
            client = grpc_client(triton_server.grpc_url)
            inputs = [grpcclient.InferInput("INPUT0", [1, 16], "INT32")]
            outputs = [grpcclient.InferRequestedOutput("OUTPUT0")]
            kw = {"client_timeout": TIMEOUT}
        else:
            client = http_client(triton_server.http_url)
            inputs = [httpclient.InferInput("INPUT0", [1, 16], "INT32")]
            outputs = [httpclient.InferRequestedOutput("OUTPUT0")]
            kw = {}
        inputs[0].set_data_from_numpy(INPUT0)
        results = client.infer("custom_identity_int32", inputs, outputs=outputs, **kw)
        output0 = results.as_numpy("OUTPUT0")
        assert output0.dtype == INPUT0.dtype, output0.dtype
        assert output0.shape == INPUT0.shape, output0.shape
        assert np.array_equal(output0, INPUT0), output0
        client.close()
