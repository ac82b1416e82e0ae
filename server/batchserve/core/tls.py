"""TLS for the HTTP and gRPC listeners: the files checked once at start, then handed to
uvicorn and grpc in the form each wants.

Both listeners get the same certificate and, when a client CA is given, both require a
client certificate signed by it (mutual TLS). The metrics listener stays plain HTTP, as in
Triton: Prometheus scrapes it from inside the cluster, it carries no request data, and a
scraper rarely holds a client certificate.
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any

import grpc


class TlsMode(StrEnum):
    """What a listener asks of its clients; logged at start for each listener."""

    OFF = "off"
    TLS = "tls"
    MUTUAL = "mutual"


def _no_password() -> bytes:
    """Stops OpenSSL from prompting on the terminal for an encrypted key's passphrase."""
    raise ValueError("encrypted")


def _read(path: Path, what: str) -> bytes:
    if not path.is_file():
        raise ValueError(f"{what} {path} does not exist or is not a file")
    try:
        return path.read_bytes()
    except OSError as error:
        raise ValueError(f"cannot read {what} {path}: {error.strerror}") from None


@dataclass(frozen=True, slots=True)
class TlsFiles:
    """The server's certificate chain and key, and the CA that signs client certificates."""

    cert: Path
    key: Path
    ca: Path | None = None
    clients_certified: bool = True
    """With ``ca``: whether a client must present a certificate it signs (mutual TLS).
    Triton's ``--grpc-root-cert`` without ``--grpc-use-ssl-mutual`` gives the CA and asks
    for none."""

    @property
    def mode(self) -> TlsMode:
        return TlsMode.MUTUAL if self._mutual else TlsMode.TLS

    @property
    def _mutual(self) -> bool:
        return self.ca is not None and self.clients_certified

    def check(self) -> None:
        """Load every file as the listeners will; raise ValueError naming the file at fault."""
        cert = _read(self.cert, "TLS certificate file")
        key = _read(self.key, "TLS key file")
        if b"-----BEGIN CERTIFICATE-----" not in cert:
            raise ValueError(f"TLS certificate file {self.cert} holds no PEM certificate")
        if b"PRIVATE KEY-----" not in key:
            raise ValueError(f"TLS key file {self.key} holds no PEM private key")
        if b"ENCRYPTED" in key:
            raise ValueError(f"TLS key file {self.key} is encrypted: give an unencrypted key")
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        try:
            context.load_cert_chain(self.cert, self.key, password=_no_password)
        except (ssl.SSLError, ValueError) as error:
            raise ValueError(
                f"TLS certificate file {self.cert} and key file {self.key} do not load "
                f"together ({_reason(error)})"
            ) from None
        if self.ca is not None:
            self._check_ca(self.ca, context)

    @staticmethod
    def _check_ca(ca: Path, context: ssl.SSLContext) -> None:
        if b"-----BEGIN CERTIFICATE-----" not in _read(ca, "TLS CA file"):
            raise ValueError(f"TLS CA file {ca} holds no PEM certificate")
        try:
            context.load_verify_locations(cafile=ca)
        except ssl.SSLError as error:
            raise ValueError(f"TLS CA file {ca} does not load ({_reason(error)})") from None

    def uvicorn_options(self) -> dict[str, Any]:
        """uvicorn.Config's keywords; with a CA, a client certificate is required."""
        options: dict[str, Any] = {"ssl_certfile": str(self.cert), "ssl_keyfile": str(self.key)}
        if self.ca is not None:
            required = ssl.CERT_REQUIRED if self._mutual else ssl.CERT_NONE
            options |= {"ssl_ca_certs": str(self.ca), "ssl_cert_reqs": required}
        return options

    def grpc_credentials(self) -> grpc.ServerCredentials:
        """gRPC's server credentials; with a CA, a client certificate is required."""
        root = self.ca.read_bytes() if self.ca is not None else None
        return grpc.ssl_server_credentials(
            [(self.key.read_bytes(), self.cert.read_bytes())],
            root_certificates=root,
            require_client_auth=self._mutual,
        )


def _reason(error: Exception) -> str:
    if isinstance(error, ssl.SSLError) and error.reason:
        return str(error.reason)
    return str(error) or type(error).__name__
