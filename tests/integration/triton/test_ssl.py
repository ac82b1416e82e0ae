"""The examples' ``--ssl`` modes: simple_{http,grpc}_infer_client.py and their aio twins
with a CA file (``--ca-certs`` / ``--root-certificates``), against a TLS server on the
suite's repository. The certificates are made for this run."""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Iterator
from pathlib import Path

import pytest
import tritonclient.grpc as grpcclient
import tritonclient.grpc.aio as aiogrpcclient
import tritonclient.http as httpclient
import tritonclient.http.aio as aiohttpclient

from tests.integration.server import ServerProcess, start_server
from tests.integration.triton.checks import INPUT0, MINUS_ONES, ONES, TIMEOUT, assert_add_sub
from tests.tls_certs import Pki, make_pki


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("triton_pki"))


@pytest.fixture(scope="module")
def tls_server(triton_repo: Path, pki: Pki, handling: list[str]) -> Iterator[ServerProcess]:
    """TLS on HTTP and gRPC, only ``simple`` loaded: what the --ssl runs of the examples use."""
    args = ["--model-control-mode", "explicit", "--load-model", "simple", *handling]
    args += [
        "--tls-cert-file",
        str(pki.server.cert_file),
        "--tls-key-file",
        str(pki.server.key_file),
    ]
    server = start_server(triton_repo, args)
    yield server
    assert server.stop() == 0


def _http_request(module: object) -> tuple[list[object], list[object]]:
    inputs = [module.InferInput(f"INPUT{i}", [1, 16], "INT32") for i in (0, 1)]  # type: ignore[attr-defined]
    inputs[0].set_data_from_numpy(INPUT0, binary_data=False)
    inputs[1].set_data_from_numpy(MINUS_ONES, binary_data=True)
    outputs = [
        module.InferRequestedOutput("OUTPUT0", binary_data=True),  # type: ignore[attr-defined]
        module.InferRequestedOutput("OUTPUT1", binary_data=False),  # type: ignore[attr-defined]
    ]
    return inputs, outputs


def test_simple_http_infer_client_ssl(tls_server: ServerProcess, pki: Pki) -> None:
    """``-s --ca-certs ca.crt``: ssl_options as the example builds them."""
    client = httpclient.InferenceServerClient(
        url=tls_server.http_url,
        ssl=True,
        ssl_options={"ca_certs": str(pki.ca.cert_file)},
        connection_timeout=TIMEOUT,
        network_timeout=TIMEOUT,
    )
    inputs, outputs = _http_request(httpclient)
    results = client.infer("simple", inputs, outputs=outputs, query_params={"test_1": 1})
    assert_add_sub(INPUT0, MINUS_ONES, results.as_numpy("OUTPUT0"), results.as_numpy("OUTPUT1"))
    client.close()


def test_simple_http_aio_infer_client_ssl(tls_server: ServerProcess, pki: Pki) -> None:
    """``-s --ca-certs ca.crt``: an ssl.SSLContext with the CA loaded, as the aio example does."""

    async def main() -> None:
        context = ssl.create_default_context()
        context.load_verify_locations(cafile=str(pki.ca.cert_file))
        client = aiohttpclient.InferenceServerClient(
            url=tls_server.http_url, ssl=True, ssl_context=context, conn_timeout=TIMEOUT
        )
        try:
            inputs, outputs = _http_request(aiohttpclient)
            results = await asyncio.wait_for(
                client.infer("simple", inputs, outputs=outputs), TIMEOUT
            )
            assert_add_sub(
                INPUT0, MINUS_ONES, results.as_numpy("OUTPUT0"), results.as_numpy("OUTPUT1")
            )
        finally:
            await client.close()

    asyncio.run(main())


def _grpc_request(module: object) -> tuple[list[object], list[object]]:
    inputs = [module.InferInput(f"INPUT{i}", [1, 16], "INT32") for i in (0, 1)]  # type: ignore[attr-defined]
    inputs[0].set_data_from_numpy(INPUT0)
    inputs[1].set_data_from_numpy(ONES)
    return inputs, [module.InferRequestedOutput(f"OUTPUT{i}") for i in (0, 1)]  # type: ignore[attr-defined]


def test_simple_grpc_infer_client_ssl(tls_server: ServerProcess, pki: Pki) -> None:
    """``--ssl --root-certificates ca.crt``."""
    client = grpcclient.InferenceServerClient(
        url=tls_server.grpc_url, ssl=True, root_certificates=str(pki.ca.cert_file)
    )
    inputs, outputs = _grpc_request(grpcclient)
    results = client.infer(
        "simple", inputs, outputs=outputs, client_timeout=TIMEOUT, headers={"test": "1"}
    )
    assert_add_sub(INPUT0, ONES, results.as_numpy("OUTPUT0"), results.as_numpy("OUTPUT1"))
    client.close()


def test_simple_grpc_aio_infer_client_ssl(tls_server: ServerProcess, pki: Pki) -> None:
    """The aio example's ``--ssl --root-certificates ca.crt``."""

    async def main() -> None:
        client = aiogrpcclient.InferenceServerClient(
            url=tls_server.grpc_url, ssl=True, root_certificates=str(pki.ca.cert_file)
        )
        try:
            inputs, outputs = _grpc_request(aiogrpcclient)
            results = await client.infer("simple", inputs, outputs=outputs, client_timeout=TIMEOUT)
            assert_add_sub(INPUT0, ONES, results.as_numpy("OUTPUT0"), results.as_numpy("OUTPUT1"))
        finally:
            await client.close()

    asyncio.run(main())
