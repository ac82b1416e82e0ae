"""Throwaway certificate authorities and certificates, made at test time with `cryptography`.

Shared by the unit and the integration tests; it imports nothing of batchserve.
"""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

_DAY = datetime.timedelta(days=1)


@dataclass(frozen=True)
class Issued:
    """A certificate and its key, in memory and written as PEM files."""

    cert_file: Path
    key_file: Path
    certificate: x509.Certificate
    key: ec.EllipticCurvePrivateKey

    @property
    def cert_pem(self) -> bytes:
        return self.cert_file.read_bytes()

    @property
    def key_pem(self) -> bytes:
        return self.key_file.read_bytes()


def _write(
    directory: Path, name: str, cert: x509.Certificate, key: ec.EllipticCurvePrivateKey
) -> Issued:
    cert_file, key_file = directory / f"{name}.crt", directory / f"{name}.key"
    cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_file.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return Issued(cert_file, key_file, cert, key)


def _builder(subject: str, issuer: x509.Name | None = None) -> x509.CertificateBuilder:
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)])
    now = datetime.datetime.now(datetime.UTC)
    return (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(issuer or name)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - _DAY)
        .not_valid_after(now + _DAY)
    )


def make_ca(directory: Path, name: str) -> Issued:
    """A self-signed certificate authority."""
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        _builder(f"{name} test CA")
        .public_key(key.public_key())
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True, content_commitment=False, key_encipherment=False,
                data_encipherment=False, key_agreement=False, key_cert_sign=True,
                crl_sign=True, encipher_only=False, decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )  # fmt: skip
    return _write(directory, name, cert, key)


def issue(directory: Path, name: str, ca: Issued, *, server: bool) -> Issued:
    """A leaf certificate signed by ``ca``: a server's for 127.0.0.1 and localhost, or a
    client's."""
    key = ec.generate_private_key(ec.SECP256R1())
    usage = ExtendedKeyUsageOID.SERVER_AUTH if server else ExtendedKeyUsageOID.CLIENT_AUTH
    builder = (
        _builder(name, ca.certificate.subject)
        .public_key(key.public_key())
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca.key.public_key()), critical=False
        )
    )
    if server:
        names = [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
        builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
    return _write(directory, name, builder.sign(ca.key, hashes.SHA256()), key)


@dataclass(frozen=True)
class Pki:
    """A server certificate and a client certificate from one CA, and a client certificate
    from another CA the server does not trust."""

    ca: Issued
    server: Issued
    client: Issued
    stranger: Issued


def make_pki(directory: Path) -> Pki:
    ca = make_ca(directory, "ca")
    other = make_ca(directory, "other-ca")
    return Pki(
        ca=ca,
        server=issue(directory, "server", ca, server=True),
        client=issue(directory, "client", ca, server=False),
        stranger=issue(directory, "stranger", other, server=False),
    )
