"""kvledger/tls.py over real gRPC: a TLS server is reached only through its CA, a mutual-TLS
server only by a client whose certificate chains to its CA, and bad files stop startup."""

from __future__ import annotations

from concurrent import futures

import grpc
import pytest
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from kvledger.rpc import CHANNEL_OPTIONS
from kvledger.tls import TlsConfigError, TlsFiles, add_port, channel, check, plaintext_warning
from tests.certs import CA
from tests.serving import free_port


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    d = tmp_path_factory.mktemp("pki")
    ca, other = CA(d, "ca"), CA(d, "other-ca")
    return dict(
        ca=ca,
        other=other,
        server=ca.issue("scheduler", server=True),
        client=ca.issue("worker", server=False),
        stranger=other.issue("stranger", server=False),
    )


def _serve(files: TlsFiles) -> tuple[grpc.Server, str]:
    server = grpc.server(futures.ThreadPoolExecutor(2))
    servicer = health.HealthServicer()
    servicer.set("", health_pb2.HealthCheckResponse.SERVING)
    health_pb2_grpc.add_HealthServicer_to_server(servicer, server)
    port = free_port()
    assert add_port(server, f"127.0.0.1:{port}", files) != 0
    server.start()
    return server, f"127.0.0.1:{port}"


def _probe(target: str, files: TlsFiles) -> grpc.StatusCode:
    with channel(target, files, CHANNEL_OPTIONS) as ch:
        try:
            health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(), timeout=5)
        except grpc.RpcError as err:
            return err.code()
        return grpc.StatusCode.OK


def test_tls_server_is_reached_only_by_a_client_trusting_its_ca(pki):
    server, target = _serve(TlsFiles(pki["server"].cert, pki["server"].key))
    try:
        assert _probe(target, TlsFiles(ca=pki["ca"].pem)) == grpc.StatusCode.OK
        assert _probe(target, TlsFiles(ca=pki["other"].pem)) == grpc.StatusCode.UNAVAILABLE
        assert _probe(target, TlsFiles()) == grpc.StatusCode.UNAVAILABLE  # plaintext
    finally:
        server.stop(0)


def test_mutual_tls_refuses_a_client_without_a_certificate_of_its_ca(pki):
    srv = pki["server"]
    server, target = _serve(TlsFiles(srv.cert, srv.key, pki["ca"].pem))
    try:
        ca = pki["ca"].pem
        assert _probe(target, TlsFiles(ca=ca)) == grpc.StatusCode.UNAVAILABLE
        stranger = pki["stranger"]
        assert (
            _probe(target, TlsFiles(stranger.cert, stranger.key, ca)) == grpc.StatusCode.UNAVAILABLE
        )
        client = pki["client"]
        assert _probe(target, TlsFiles(client.cert, client.key, ca)) == grpc.StatusCode.OK
    finally:
        server.stop(0)


def test_bad_files_stop_startup_naming_the_flag_and_never_the_key(pki, tmp_path):
    srv = pki["server"]
    with pytest.raises(TlsConfigError, match="go together"):
        check(TlsFiles(cert=srv.cert), server=True)
    with pytest.raises(TlsConfigError, match="--grpc-tls-ca .*No such file"):
        check(TlsFiles(srv.cert, srv.key, str(tmp_path / "missing.pem")), server=True)
    with pytest.raises(TlsConfigError, match="--grpc-tls-key .*not a PEM private key"):
        check(TlsFiles(srv.cert, srv.cert), server=True)
    with pytest.raises(TlsConfigError, match="is not the unencrypted key of --grpc-tls-cert"):
        check(TlsFiles(srv.cert, pki["client"].key), server=True)  # another certificate's key
    with pytest.raises(TlsConfigError, match="--grpc-tls-ca alone"):
        check(TlsFiles(ca=pki["ca"].pem), server=True)
    swapped = TlsFiles(srv.key, srv.cert)
    with pytest.raises(TlsConfigError) as err:
        check(swapped, server=False)
    key_text = open(srv.key).read()  # noqa: SIM115
    assert key_text.splitlines()[1] not in str(err.value)


@pytest.mark.parametrize("host", ["127.0.0.1", "localhost", "::1", "[::1]", "127.0.0.2"])
def test_loopback_binds_are_not_warned_about(host):
    assert plaintext_warning(host, TlsFiles(), "") is None


def test_a_non_loopback_bind_without_tls_or_worker_token_is_warned_about(pki):
    tls = TlsFiles(pki["server"].cert, pki["server"].key)
    assert "TLS" in plaintext_warning("0.0.0.0", TlsFiles(), "t")
    assert "worker token" in plaintext_warning("10.0.0.5", tls, "")
    both = plaintext_warning("scheduler.internal", TlsFiles(), "")
    assert "TLS" in both and "worker token" in both
    assert plaintext_warning("0.0.0.0", tls, "t") is None
