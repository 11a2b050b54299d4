"""TLS on the gRPC links between hosts: frontend -> scheduler and worker -> scheduler.

The rule: a link is encrypted when its end is given a certificate (the scheduler) or a CA to
trust (a frontend or worker); it is mutually authenticated when the scheduler is also given a
CA, which it then requires every caller's certificate to chain to. Plaintext stays the default,
and is only reasonable on loopback: `plaintext_warning` says so, loudly, for any other bind.

Files are read once, at startup, with an error that names the flag and the file; their
contents (keys above all) are never logged.
"""

from __future__ import annotations

import ipaddress
import logging
import ssl
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

log = logging.getLogger(__name__)


class TlsConfigError(ValueError):
    """A TLS file that is missing, unreadable or not PEM, or a certificate without its key."""


@dataclass(frozen=True)
class TlsFiles:
    """Paths of PEM files: this end's certificate chain and key, and the CA it trusts."""

    cert: str | None = None
    key: str | None = None
    ca: str | None = None

    @property
    def enabled(self) -> bool:
        return bool(self.cert or self.key or self.ca)


def files_of(settings: Any) -> TlsFiles:
    """The TLS files of a service's settings (kvledger.groups.GrpcTlsOptions)."""
    return TlsFiles(settings.grpc_tls_cert, settings.grpc_tls_key, settings.grpc_tls_ca)


def checked(settings: Any, server: bool, service: str) -> TlsFiles:
    """The service's TLS files, every one read once now: a bad one stops startup with one
    line naming the flag and the file."""
    files = files_of(settings)
    try:
        check(files, server)
    except TlsConfigError as err:
        raise SystemExit(f"{service}: {err}") from None
    if not server and files.cert and not files.ca:
        log.warning(
            "%s: --grpc-tls-cert without --grpc-tls-ca: the scheduler's certificate is "
            "checked against the system's roots, which a private CA is not among",
            service,
        )
    return files


@dataclass(frozen=True)
class _Pem:
    cert: bytes | None
    key: bytes | None
    ca: bytes | None


def _read(path: str | None, flag: str, marker: bytes) -> bytes | None:
    if not path:
        return None
    try:
        data = Path(path).read_bytes()
    except OSError as err:
        raise TlsConfigError(f"{flag} {path}: {err.strerror or err}") from None
    if b"-----BEGIN " not in data or marker not in data:
        raise TlsConfigError(f"{flag} {path}: not a PEM {marker.decode().strip('- ').lower()}")
    return data


def _load(files: TlsFiles) -> _Pem:
    if bool(files.cert) != bool(files.key):
        raise TlsConfigError("--grpc-tls-cert and --grpc-tls-key go together: give both")
    pem = _Pem(
        cert=_read(files.cert, "--grpc-tls-cert", b"CERTIFICATE"),
        key=_read(files.key, "--grpc-tls-key", b"PRIVATE KEY"),
        ca=_read(files.ca, "--grpc-tls-ca", b"CERTIFICATE"),
    )
    if files.cert and files.key:
        _check_pair(files.cert, files.key)
    return pem


def _check_pair(cert: str, key: str) -> None:
    """The key is this certificate's, and not encrypted (gRPC cannot ask for a passphrase);
    otherwise the scheduler's bind, or every handshake, fails with a message naming neither."""
    try:
        ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT).load_cert_chain(cert, key, password=_no_password)
    except (ssl.SSLError, OSError, TypeError, ValueError) as err:
        raise TlsConfigError(
            f"--grpc-tls-key {key} is not the unencrypted key of --grpc-tls-cert {cert} "
            f"({type(err).__name__})"
        ) from None


def _no_password() -> bytes:
    raise ValueError("the key is encrypted")


def server_credentials(files: TlsFiles) -> grpc.ServerCredentials | None:
    """The scheduler's credentials: None (plaintext) when no file is given. A CA makes the
    TLS mutual: a caller without a certificate that chains to it is refused in the handshake,
    before any RPC (worker and frontend tokens still apply on top)."""
    if not files.enabled:
        return None
    pem = _load(files)
    if pem.cert is None or pem.key is None:
        raise TlsConfigError(
            "the scheduler serves TLS with --grpc-tls-cert and --grpc-tls-key; "
            "--grpc-tls-ca alone only says whom to trust"
        )
    return grpc.ssl_server_credentials(
        [(pem.key, pem.cert)],
        root_certificates=pem.ca,
        require_client_auth=pem.ca is not None,
    )


def channel_credentials(files: TlsFiles) -> grpc.ChannelCredentials | None:
    """A frontend's or worker's credentials for its link to the scheduler: None (plaintext)
    when no file is given. Without --grpc-tls-ca the system's roots are trusted; with
    --grpc-tls-cert/--grpc-tls-key this end presents its certificate (for mutual TLS)."""
    if not files.enabled:
        return None
    pem = _load(files)
    return grpc.ssl_channel_credentials(
        root_certificates=pem.ca, private_key=pem.key, certificate_chain=pem.cert
    )


def check(files: TlsFiles, server: bool) -> None:
    """Reads every file once so that a bad one stops startup with a clear error."""
    if server:
        server_credentials(files)
    else:
        channel_credentials(files)


def add_port(server: Any, address: str, files: TlsFiles) -> int:
    """Binds `address` on a grpc (or grpc.aio) server, with TLS when configured; 0 = failed."""
    creds = server_credentials(files)
    if creds is None:
        return server.add_insecure_port(address)
    return server.add_secure_port(address, creds)


def channel(target: str, files: TlsFiles, options: Sequence[tuple[str, Any]]) -> grpc.Channel:
    return channel_with(target, channel_credentials(files), options)


def channel_with(
    target: str, creds: grpc.ChannelCredentials | None, options: Sequence[tuple[str, Any]]
) -> grpc.Channel:
    """A channel with credentials made once (a worker reconnects with the files it started
    with: a file missing mid-rotation must not end its reconnect loop)."""
    if creds is None:
        return grpc.insecure_channel(target, options=options)
    return grpc.secure_channel(target, creds, options=options)


def aio_channel(
    target: str,
    files: TlsFiles,
    options: Sequence[tuple[str, Any]],
    interceptors: Sequence[grpc.aio.ClientInterceptor] | None = None,
) -> grpc.aio.Channel:
    creds = channel_credentials(files)
    if creds is None:
        return grpc.aio.insecure_channel(target, options=options, interceptors=interceptors)
    return grpc.aio.secure_channel(target, creds, options=options, interceptors=interceptors)


def is_loopback(host: str) -> bool:
    """True for `localhost` and loopback addresses; names are not resolved (a name other than
    localhost may point anywhere)."""
    host = host.strip("[]")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def plaintext_warning(host: str, files: TlsFiles, worker_token: str) -> str | None:
    """The warning for a scheduler reachable from other hosts without TLS (its tokens and
    every user's prompt and tokens cross the network in the clear), or without a worker token
    (anyone who reaches it can register as a worker). None on loopback."""
    if is_loopback(host):
        return None
    missing = []
    if not files.enabled:
        missing.append(
            "TLS (--grpc-tls-cert/--grpc-tls-key: prompts, tokens and auth tokens cross "
            "the network in the clear)"
        )
    if not worker_token:
        missing.append(
            "a worker token (--worker-auth-token: any host that reaches it can register "
            "as a worker)"
        )
    if not missing:
        return None
    return (
        f"the scheduler binds {host}, reachable from other hosts, without "
        + " and without ".join(missing)
    )
