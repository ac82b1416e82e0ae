"""TLS and mutual TLS on a real server, checked with real clients: tritonclient, httpx,
grpcio and batchserve_client, each with certificates made for this run.

Two servers for the module (each start loads a model): one with TLS, one with mutual TLS
started from the README's own command line.
"""

from __future__ import annotations

import asyncio
import http.client
import re
import socket
import ssl
import time
from collections.abc import Iterator

import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from batchserve_client import (
    NO_RETRY,
    AsyncClient,
    Client,
    ConnectionLost,
    TlsConfig,
    Unavailable,
)
from tritonclient.utils import InferenceServerException

from tests.integration.server import MODEL_REPO, REPO_ROOT, ServerProcess, start_server
from tests.tls_certs import Issued, Pki, make_pki

DIGITS = "digits_cnn"
ONLY_DIGITS = ("--model-control-mode", "explicit", "--load-model", DIGITS)
IMAGES = np.random.default_rng(0).integers(0, 17, size=(3, 1, 8, 8)).astype(np.float32)


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


def _server_files(pki: Pki) -> list[str]:
    """The flags that make a server serve TLS with this run's certificate."""
    return [
        "--tls-cert-file",
        str(pki.server.cert_file),
        "--tls-key-file",
        str(pki.server.key_file),
    ]


def _readme_mutual_tls_args(pki: Pki) -> list[str]:
    """The README's mutual-TLS command line, on this run's files (the repository comes
    from start_server)."""
    readme = (REPO_ROOT / "README.md").read_text()
    (command,) = re.findall(r"^batchserve serve .*--tls-ca-file .*$", readme, re.MULTILINE)
    files = {
        "server.crt": pki.server.cert_file,
        "server.key": pki.server.key_file,
        "client-ca.crt": pki.ca.cert_file,
    }
    args = command.split()[2:]
    at = args.index("--model-repository")
    del args[at : at + 2]
    assert set(files) <= set(args), "the README's example names other files"
    return [str(files.get(arg, arg)) for arg in args]


@pytest.fixture(scope="module", params=["1", "2"], ids=["one-process", "two-workers"])
def tls_server(pki: Pki, request: pytest.FixtureRequest) -> Iterator[ServerProcess]:
    """TLS served by one process, and by two workers sharing the ports (``--workers``)."""
    files = [*_server_files(pki), "--workers", request.param]
    server = start_server(MODEL_REPO, [*ONLY_DIGITS, *files])
    yield server
    assert server.stop() == 0


@pytest.fixture(scope="module")
def mtls_server(pki: Pki) -> Iterator[ServerProcess]:
    server = start_server(MODEL_REPO, [*ONLY_DIGITS, *_readme_mutual_tls_args(pki)])
    yield server
    assert server.stop() == 0


def _listening(server: ServerProcess) -> dict[str, object]:
    (record,) = [r for r in server.logs if r.get("message") == "listening"]
    return record


def _context(pki: Pki, client: Issued | None) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=pki.ca.cert_file)
    if client is not None:
        context.load_cert_chain(client.cert_file, client.key_file)
    return context


def _check_probabilities(probabilities: np.ndarray | None) -> None:
    assert probabilities is not None
    assert probabilities.shape == (3, 10)
    np.testing.assert_allclose(probabilities.sum(axis=1), 1.0, rtol=1e-5)


def _triton_http_infer(server: ServerProcess, pki: Pki, client: Issued | None) -> None:
    options = {"ca_certs": str(pki.ca.cert_file)}
    if client is not None:
        options |= {"certfile": str(client.cert_file), "keyfile": str(client.key_file)}
    triton = httpclient.InferenceServerClient(server.http_url, ssl=True, ssl_options=options)
    try:
        image = httpclient.InferInput("image", list(IMAGES.shape), "FP32")
        image.set_data_from_numpy(IMAGES)
        _check_probabilities(triton.infer(DIGITS, [image]).as_numpy("probabilities"))
    finally:
        triton.close()


def _triton_grpc(
    server: ServerProcess, pki: Pki, client: Issued | None
) -> grpcclient.InferenceServerClient:
    return grpcclient.InferenceServerClient(
        server.grpc_url,
        ssl=True,
        root_certificates=str(pki.ca.cert_file),
        private_key=None if client is None else str(client.key_file),
        certificate_chain=None if client is None else str(client.cert_file),
    )


def _triton_grpc_infer(server: ServerProcess, pki: Pki, client: Issued | None) -> None:
    with _triton_grpc(server, pki, client) as triton:
        image = grpcclient.InferInput("image", list(IMAGES.shape), "FP32")
        image.set_data_from_numpy(IMAGES)
        _check_probabilities(
            triton.infer(DIGITS, [image], client_timeout=30).as_numpy("probabilities")
        )


# --- TLS -------------------------------------------------------------------------------


def test_tls_server_logs_tls_on_http_and_grpc_only(tls_server: ServerProcess) -> None:
    record = _listening(tls_server)
    assert (record["http_tls"], record["grpc_tls"], record["metrics_tls"]) == ("tls", "tls", "off")


def test_tritonclient_http_infers_over_tls(tls_server: ServerProcess, pki: Pki) -> None:
    _triton_http_infer(tls_server, pki, None)


def test_tritonclient_grpc_infers_over_tls(tls_server: ServerProcess, pki: Pki) -> None:
    _triton_grpc_infer(tls_server, pki, None)


def test_plain_http_to_the_tls_port_fails(tls_server: ServerProcess) -> None:
    with pytest.raises(httpx.TransportError):
        httpx.get(f"http://{tls_server.http_url}/v2/health/ready", timeout=10)


def test_the_server_certificate_is_checked_against_the_clients_roots(
    tls_server: ServerProcess,
) -> None:
    """A client that does not trust the test CA refuses the server: certificates are real."""
    with pytest.raises(httpx.ConnectError, match="CERTIFICATE_VERIFY_FAILED"):
        httpx.get(
            f"https://{tls_server.http_url}/v2/health/ready",
            verify=ssl.create_default_context(),
            timeout=10,
        )


def test_an_insecure_grpc_channel_fails(tls_server: ServerProcess) -> None:
    with (
        grpcclient.InferenceServerClient(tls_server.grpc_url) as triton,
        pytest.raises(InferenceServerException, match="UNAVAILABLE"),
    ):
        triton.is_server_live(client_timeout=10)


def test_metrics_stay_plain_http(tls_server: ServerProcess) -> None:
    response = httpx.get(f"http://127.0.0.1:{tls_server.metrics_port}/metrics", timeout=10)
    assert response.status_code == 200
    assert "batchserve_requests_total" in response.text


# --- mutual TLS ------------------------------------------------------------------------


def test_mutual_tls_server_logs_mutual_on_http_and_grpc(mtls_server: ServerProcess) -> None:
    record = _listening(mtls_server)
    assert (record["http_tls"], record["grpc_tls"], record["metrics_tls"]) == (
        "mutual",
        "mutual",
        "off",
    )


def test_a_client_with_the_right_certificate_infers_over_http(
    mtls_server: ServerProcess, pki: Pki
) -> None:
    _triton_http_infer(mtls_server, pki, pki.client)


def test_a_client_with_the_right_certificate_infers_over_grpc(
    mtls_server: ServerProcess, pki: Pki
) -> None:
    _triton_grpc_infer(mtls_server, pki, pki.client)


@pytest.mark.parametrize("who", ["no certificate", "another CA's certificate"])
def test_other_clients_are_refused_over_http(
    mtls_server: ServerProcess, pki: Pki, who: str
) -> None:
    client = None if who == "no certificate" else pki.stranger
    with pytest.raises(httpx.TransportError):
        httpx.get(
            f"https://{mtls_server.http_url}/v2/health/ready",
            verify=_context(pki, client),
            timeout=10,
        )
    # TLS 1.3 ends the handshake before the server checks the client: the refusal comes as
    # a closed connection rather than a handshake error.
    with pytest.raises((http.client.HTTPException, OSError)):
        _triton_http_infer(mtls_server, pki, client)


@pytest.mark.parametrize("who", ["no certificate", "another CA's certificate"])
def test_other_clients_are_refused_over_grpc(
    mtls_server: ServerProcess, pki: Pki, who: str
) -> None:
    client = None if who == "no certificate" else pki.stranger
    with (
        _triton_grpc(mtls_server, pki, client) as triton,
        pytest.raises(InferenceServerException, match="UNAVAILABLE"),
    ):
        triton.is_server_live(client_timeout=10)


def test_the_server_still_serves_after_refusing_clients(
    mtls_server: ServerProcess, pki: Pki
) -> None:
    for client in (None, pki.stranger):
        with pytest.raises(httpx.TransportError):
            httpx.get(
                f"https://{mtls_server.http_url}/v2/health/ready",
                verify=_context(pki, client),
                timeout=10,
            )
    response = httpx.get(
        f"https://{mtls_server.http_url}/v2/health/ready",
        verify=_context(pki, pki.client),
        timeout=10,
    )
    assert response.status_code == 200


# --- batchserve_client -----------------------------------------------------------------


def _tls(pki: Pki, client: Issued | None) -> TlsConfig:
    if client is None:
        return TlsConfig(ca_file=pki.ca.cert_file)
    return TlsConfig(ca_file=pki.ca.cert_file, cert_file=client.cert_file, key_file=client.key_file)


def _urls(server: ServerProcess) -> list[str]:
    return [f"https://{server.http_url}", f"grpcs://{server.grpc_url}"]


def test_batchserve_client_infers_over_tls(tls_server: ServerProcess, pki: Pki) -> None:
    for url in _urls(tls_server):
        with Client(url, tls=_tls(pki, None), timeout=30) as client:
            _check_probabilities(client.infer(DIGITS, {"image": IMAGES})["probabilities"])


def test_batchserve_client_infers_over_mutual_tls(mtls_server: ServerProcess, pki: Pki) -> None:
    async def infer(url: str) -> np.ndarray:
        async with AsyncClient(url, tls=_tls(pki, pki.client), timeout=30) as client:
            return (await client.infer(DIGITS, {"image": IMAGES}))["probabilities"]

    for url in _urls(mtls_server):
        with Client(url, tls=_tls(pki, pki.client), timeout=30) as client:
            _check_probabilities(client.infer(DIGITS, {"image": IMAGES})["probabilities"])
        _check_probabilities(asyncio.run(infer(url)))


@pytest.mark.parametrize("who", ["no certificate", "another CA's certificate"])
def test_batchserve_client_without_the_right_certificate_is_refused(
    mtls_server: ServerProcess, pki: Pki, who: str
) -> None:
    tls = _tls(pki, None if who == "no certificate" else pki.stranger)
    refusals = {"https": (ConnectionLost, Unavailable), "grpcs": (Unavailable,)}
    for url in _urls(mtls_server):
        with (
            Client(url, tls=tls, retry=NO_RETRY, timeout=10) as client,
            pytest.raises(refusals[url.split(":")[0]]),
        ):
            client.infer(DIGITS, {"image": IMAGES})


def test_batchserve_client_refuses_tls_settings_for_plain_urls(pki: Pki) -> None:
    for url in ("http://127.0.0.1:1", "grpc://127.0.0.1:1"):
        with pytest.raises(ValueError, match="tls= needs an https:// or grpcs:// URL"):
            Client(url, tls=_tls(pki, None))
    with pytest.raises(ValueError, match="cert_file and key_file together"):
        TlsConfig(cert_file=pki.client.cert_file)


def test_a_client_that_never_finishes_its_tls_handshake_is_dropped_at_the_header_timeout(
    pki: Pki,
) -> None:
    """asyncio's own bound on the handshake is 60 s, before any protocol of ours exists: a
    TLS port held silent connections that long. The handshake now counts as part of the head."""
    files = _server_files(pki)
    server = start_server(MODEL_REPO, [*ONLY_DIGITS, *files, "--http-header-timeout", "1"])
    try:
        with socket.create_connection(("127.0.0.1", server.http_port), timeout=10) as silent:
            started = time.monotonic()
            assert silent.recv(1) == b""  # closed by the server, no handshake ever begun
            waited = time.monotonic() - started
        with httpx.Client(verify=_context(pki, None)) as client:
            ready = client.get(f"https://127.0.0.1:{server.http_port}/v2/health/ready")
    finally:
        assert server.stop() == 0
    assert 0.5 < waited < 5
    assert ready.status_code == 200


def test_a_grpc_client_that_never_starts_its_tls_handshake_is_dropped(pki: Pki) -> None:
    """grpc core's handshake deadline covers the TLS handshake as well as HTTP/2's preface.

    Not counted: channelz lists a TLS connection only once its TLS handshake is done."""
    files = _server_files(pki)
    server = start_server(MODEL_REPO, [*ONLY_DIGITS, *files, "--grpc-handshake-timeout", "1000"])
    try:
        with socket.create_connection(("127.0.0.1", server.grpc_port), timeout=10) as silent:
            started = time.monotonic()
            assert silent.recv(1) == b""  # closed by the server, no handshake ever begun
            waited = time.monotonic() - started
        _triton_grpc_infer(server, pki, None)  # and TLS clients are still served
    finally:
        assert server.stop() == 0
    assert 0.5 < waited < 5


# --- Triton's gRPC-only TLS flags (L0_secure_grpc) ----------------------------------------


def _triton_grpc_flags(pki: Pki, *, mutual: bool) -> list[str]:
    """Triton's L0_secure_grpc server flags, on this run's files."""
    use = "--grpc-use-ssl-mutual=true" if mutual else "--grpc-use-ssl=true"
    return [
        use,
        f"--grpc-server-cert={pki.server.cert_file}",
        f"--grpc-server-key={pki.server.key_file}",
        f"--grpc-root-cert={pki.ca.cert_file}",
    ]


@pytest.mark.parametrize("mutual", [False, True], ids=["ssl", "ssl-mutual"])
def test_tritons_grpc_ssl_flags_secure_grpc_and_leave_http_plain(pki: Pki, mutual: bool) -> None:
    """As Triton's flags do: gRPC serves TLS (requiring a client certificate signed by the
    root only with -mutual), HTTP stays plain, as its L0_secure_grpc readiness check needs."""
    server = start_server(MODEL_REPO, [*ONLY_DIGITS, *_triton_grpc_flags(pki, mutual=mutual)])
    try:
        record = _listening(server)
        assert (record["http_tls"], record["grpc_tls"]) == ("off", "mutual" if mutual else "tls")
        plain = httpclient.InferenceServerClient(server.http_url)
        assert plain.is_server_ready()
        _triton_grpc_infer(server, pki, pki.client)
        without = _triton_grpc(server, pki, None)
        if mutual:
            with pytest.raises(InferenceServerException, match="UNAVAILABLE"):
                without.is_server_live(client_timeout=10)
        else:  # the root certificate is given, and no client certificate asked for
            assert without.is_server_live(client_timeout=10)
        without.close()
        with (
            grpcclient.InferenceServerClient(server.grpc_url) as insecure,
            pytest.raises(InferenceServerException),
        ):
            insecure.is_server_live(client_timeout=5)
    finally:
        assert server.stop() == 0
