"""Certificates for ``https://`` and ``grpcs://`` servers: a private CA, and a client
certificate for servers that require one (mutual TLS)."""

from __future__ import annotations

import os
import ssl
from dataclasses import dataclass
from pathlib import Path

import grpc

PathLike = str | os.PathLike[str]


@dataclass(frozen=True, slots=True)
class TlsConfig:
    """PEM files the client reads when it is made.

    Args:
        ca_file: CA certificates that sign the server's certificate (default: the
            system's roots).
        cert_file: the client's certificate chain, for a server that requires one.
        key_file: the private key of ``cert_file`` (unencrypted); give both or neither.
    """

    ca_file: PathLike | None = None
    cert_file: PathLike | None = None
    key_file: PathLike | None = None

    def __post_init__(self) -> None:
        if (self.cert_file is None) != (self.key_file is None):
            raise ValueError("TlsConfig: give cert_file and key_file together, or neither")

    def ssl_context(self) -> ssl.SSLContext:
        """For httpx: verifies the server against ``ca_file`` and presents the client's
        certificate when there is one."""
        context = ssl.create_default_context(cafile=self.ca_file)
        if self.cert_file is not None:
            context.load_cert_chain(self.cert_file, self.key_file)
        return context

    def grpc_credentials(self) -> grpc.ChannelCredentials:
        """For a gRPC channel, which takes the files' bytes rather than their paths."""

        def read(path: PathLike | None) -> bytes | None:
            return None if path is None else Path(path).read_bytes()

        return grpc.ssl_channel_credentials(
            root_certificates=read(self.ca_file),
            private_key=read(self.key_file),
            certificate_chain=read(self.cert_file),
        )
