"""Certificates made at test time (the `cryptography` package): a CA, and leaf certificates it
signs for a server (valid for localhost and 127.0.0.1) or a client."""

from __future__ import annotations

import datetime
from dataclasses import dataclass
from ipaddress import ip_address
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID


@dataclass(frozen=True)
class Pair:
    cert: str  # path of the PEM certificate
    key: str  # path of the PEM private key


def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _write(path: Path, cert: x509.Certificate, key: ec.EllipticCurvePrivateKey) -> Pair:
    path.with_suffix(".crt").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    path.with_suffix(".key").write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return Pair(str(path.with_suffix(".crt")), str(path.with_suffix(".key")))


def _builder(subject: str, issuer: str, public_key) -> x509.CertificateBuilder:  # noqa: ANN001
    now = datetime.datetime.now(datetime.UTC)
    return (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)]))
        .issuer_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, issuer)]))
        .public_key(public_key)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
    )


class CA:
    def __init__(self, directory: Path, name: str = "kvledger-test-ca") -> None:
        self.directory, self.name = directory, name
        self.key = _key()
        self.cert = (
            _builder(name, name, self.key.public_key())
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(self.key, hashes.SHA256())
        )
        self.pem = _write(directory / name, self.cert, self.key).cert

    def issue(self, name: str, server: bool, client: bool | None = None) -> Pair:
        """A leaf certificate for a server (valid for localhost and 127.0.0.1) or a client;
        `client=True` with `server=True` makes one that serves both roles (serve's children
        share one)."""
        key = _key()
        client = not server if client is None else client
        usages = [ExtendedKeyUsageOID.SERVER_AUTH] if server else []
        usages += [ExtendedKeyUsageOID.CLIENT_AUTH] if client else []
        builder = (
            _builder(name, self.name, key.public_key())
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage(usages), critical=False)
        )
        if server:
            names = [x509.DNSName("localhost"), x509.IPAddress(ip_address("127.0.0.1"))]
            builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
        return _write(self.directory / name, builder.sign(self.key, hashes.SHA256()), key)
