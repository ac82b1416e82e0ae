"""TLS settings: refused at start, with one line naming the file, unless the listeners could
load them."""

import os
import ssl
from pathlib import Path

import pytest
from batchserve.cli import build_parser, main
from batchserve.core.settings import Settings
from batchserve.core.tls import TlsMode
from batchserve.runtime.serve_command import settings_from_args
from pydantic import ValidationError

from tests.tls_certs import Pki, make_pki


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture(autouse=True)
def _no_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for key in list(os.environ):
        if key.startswith("BATCHSERVE_"):
            monkeypatch.delenv(key)


def _settings(*argv: str | Path) -> Settings:
    return settings_from_args(build_parser().parse_args(["serve", *map(str, argv)]))


@pytest.fixture(autouse=True)
def _never_serve(monkeypatch: pytest.MonkeyPatch) -> None:
    """Settings that should be refused but are not fail the test instead of serving."""

    def serve(settings: Settings) -> None:
        raise AssertionError(f"the server would have started with {settings}")

    monkeypatch.setattr("batchserve.runtime.app.run", serve)


def _refusal(capsys: pytest.CaptureFixture[str], *argv: str | Path) -> str:
    """What `batchserve serve` prints when it refuses to start: one line."""
    assert main(["serve", *map(str, argv)]) == 2
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1, lines
    return lines[0]


def test_tls_is_off_by_default() -> None:
    assert _settings().tls is None


def test_certificate_and_key_turn_on_tls(pki: Pki) -> None:
    tls = _settings(
        "--tls-cert-file", pki.server.cert_file, "--tls-key-file", pki.server.key_file
    ).tls
    assert tls is not None
    assert tls.mode is TlsMode.TLS
    assert tls.uvicorn_options() == {
        "ssl_certfile": str(pki.server.cert_file),
        "ssl_keyfile": str(pki.server.key_file),
    }


def test_a_client_ca_turns_on_mutual_tls(pki: Pki, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BATCHSERVE_TLS_CA_FILE", str(pki.ca.cert_file))
    tls = _settings(
        "--tls-cert-file", pki.server.cert_file, "--tls-key-file", pki.server.key_file
    ).tls
    assert tls is not None
    assert tls.mode is TlsMode.MUTUAL
    options = tls.uvicorn_options()
    assert options["ssl_ca_certs"] == str(pki.ca.cert_file)
    assert options["ssl_cert_reqs"] == ssl.CERT_REQUIRED


def test_certificate_and_key_go_together(pki: Pki) -> None:
    with pytest.raises(ValidationError, match="give both or neither"):
        _settings("--tls-cert-file", pki.server.cert_file)
    with pytest.raises(ValidationError, match="give both or neither"):
        Settings(tls_key_file=pki.server.key_file)


def test_a_client_ca_needs_a_server_certificate(pki: Pki) -> None:
    with pytest.raises(ValidationError, match=r"--tls-ca-file .* needs --tls-cert-file"):
        _settings("--tls-ca-file", pki.ca.cert_file)


def test_a_missing_file_is_named_on_one_line(
    pki: Pki, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = tmp_path / "missing.crt"
    line = _refusal(capsys, "--tls-cert-file", missing, "--tls-key-file", pki.server.key_file)
    assert (
        line == f"batchserve serve: TLS certificate file {missing} does not exist or is not a file"
    )
    line = _refusal(
        capsys, "--tls-cert-file", pki.server.cert_file, "--tls-key-file", pki.server.key_file,
        "--tls-ca-file", missing,
    )  # fmt: skip
    assert line == f"batchserve serve: TLS CA file {missing} does not exist or is not a file"


def test_half_a_pair_is_refused_on_one_line(pki: Pki, capsys: pytest.CaptureFixture[str]) -> None:
    line = _refusal(capsys, "--tls-key-file", pki.server.key_file)
    assert line == (
        "batchserve serve: --tls-cert-file and --tls-key-file go together: give both or neither"
    )


def test_files_that_do_not_load_are_named(pki: Pki) -> None:
    server, client = pki.server, pki.client
    cases = [
        (
            server.key_file,
            server.key_file,
            None,
            f"certificate file {server.key_file} holds no PEM",
        ),
        (server.cert_file, server.cert_file, None, f"key file {server.cert_file} holds no PEM"),
        (server.cert_file, client.key_file, None, f"key file {client.key_file} do not load"),
        (server.cert_file, server.key_file, server.key_file, f"CA file {server.key_file} holds"),
    ]
    for cert, key, ca, message in cases:
        with pytest.raises(ValidationError, match=message):
            Settings(tls_cert_file=cert, tls_key_file=key, tls_ca_file=ca)


def test_an_encrypted_key_is_refused_without_prompting(pki: Pki, tmp_path: Path) -> None:
    from cryptography.hazmat.primitives import serialization

    encrypted = tmp_path / "encrypted.key"
    encrypted.write_bytes(
        pki.server.key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.BestAvailableEncryption(b"secret"),
        )
    )
    with pytest.raises(ValidationError, match=f"key file {encrypted} is encrypted"):
        Settings(tls_cert_file=pki.server.cert_file, tls_key_file=encrypted)


def test_other_invalid_settings_get_one_line_each(capsys: pytest.CaptureFixture[str]) -> None:
    line = _refusal(capsys, "--http-port", "70000")
    assert line == "batchserve serve: --http-port 70000 is not a port: give 0 to 65535"
