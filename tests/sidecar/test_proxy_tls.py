"""https upstreams: the proxy speaks TLS to them with the context it is given."""

from __future__ import annotations

import shutil
import ssl
import subprocess
from pathlib import Path

import httpx
import pytest

from sidecar.proxy import ProxyOptions, ProxyServer
from tests.sidecar import upstreams
from tests.sidecar.proxy_harness import HeaderChooser, ListRecorder

pytestmark = pytest.mark.skipif(shutil.which("openssl") is None, reason="needs openssl")


@pytest.fixture(scope="module")
def self_signed(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    tmp_path = tmp_path_factory.mktemp("tls")
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        [
            "openssl", "req", "-x509", "-nodes", "-days", "1",
            "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1",
            "-subj", "/CN=localhost", "-addext", "subjectAltName=DNS:localhost",
            "-keyout", str(key), "-out", str(cert),
        ],
        check=True,
        capture_output=True,
    )  # fmt: skip
    return cert, key


async def test_forwards_to_an_https_upstream(self_signed: tuple[Path, Path]) -> None:
    cert, key = self_signed
    server_tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_tls.load_cert_chain(cert, key)
    upstream = upstreams.Upstream("baseline", host="localhost", tls=server_tls)
    await upstream.start()
    client_tls = ssl.create_default_context(cafile=str(cert))
    proxy = ProxyServer(
        HeaderChooser({"baseline": upstream.url}),
        ListRecorder(),
        options=ProxyOptions(ssl_context=client_tls),
    )
    await proxy.start("127.0.0.1", 0)
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{proxy.port}") as client:
            for _ in range(3):
                response = await client.get("/echo?tls=1")
                assert response.status_code == 200
                assert response.json()["target"] == "/echo?tls=1"
        assert upstream.connections == 1
    finally:
        await proxy.stop(timeout=2)
        await upstream.stop()


async def test_an_untrusted_certificate_is_a_connect_error(self_signed: tuple[Path, Path]) -> None:
    cert, key = self_signed
    server_tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server_tls.load_cert_chain(cert, key)
    upstream = upstreams.Upstream("baseline", host="localhost", tls=server_tls)
    await upstream.start()
    proxy = ProxyServer(HeaderChooser({"baseline": upstream.url}), ListRecorder())
    await proxy.start("127.0.0.1", 0)
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{proxy.port}") as client:
            response = await client.get("/echo")
            assert response.status_code == 502
            assert "certificate" in response.json()["detail"].lower()
    finally:
        await proxy.stop(timeout=2)
        await upstream.stop()


async def test_serves_clients_over_https_and_says_so_upstream(tmp_path: Path) -> None:
    """`--tls-cert/--tls-key`: clients speak HTTPS to the sidecar; the upstream gets a
    plain request that says X-Forwarded-Proto: https, whatever the client claimed."""
    from controlplane.kernel.tls import server_context
    from tests.sidecar.recording_upstream import RecordingUpstream
    from tests.support.tls import make_pki

    pki = make_pki(tmp_path / "pki")
    upstream = RecordingUpstream()
    await upstream.start()
    listen_tls = server_context(cert_file=pki.server_cert, key_file=pki.server_key)
    recorder = ListRecorder()
    proxy = ProxyServer(
        HeaderChooser({"baseline": upstream.url}),
        recorder,
        options=ProxyOptions(listen_tls=listen_tls),
    )
    await proxy.start("127.0.0.1", 0)
    try:
        trusted = ssl.create_default_context(cafile=pki.ca_file)
        async with httpx.AsyncClient(
            base_url=f"https://127.0.0.1:{proxy.port}", verify=trusted
        ) as client:
            response = await client.post(
                "/orders", content=b"x" * 1000, headers={"x-forwarded-proto": "gopher"}
            )
        assert response.status_code == 200
        (received,) = upstream.complete
        assert received.target == "/orders"
        assert received.body == b"x" * 1000
        assert received.all("x-forwarded-proto") == ["https"]
        # a client that does not trust the certificate never gets a request through
        untrusted = ssl.create_default_context(cafile=pki.other_ca_file)
        async with httpx.AsyncClient(
            base_url=f"https://127.0.0.1:{proxy.port}", verify=untrusted
        ) as client:
            with pytest.raises(httpx.ConnectError):
                await client.get("/never")
        # nor does a client speaking plain HTTP to the TLS port
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{proxy.port}") as client:
            with pytest.raises(httpx.HTTPError):
                await client.get("/never")
        assert [r.target for r in upstream.complete] == ["/orders"]
    finally:
        await proxy.stop(timeout=2)
        await upstream.stop()


def test_the_cli_needs_both_tls_files(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from controlplane.cli.main import app

    cert = tmp_path / "cert.pem"
    cert.write_text("not a certificate")
    result = CliRunner().invoke(
        app, ["sidecar", "--service", "shop", "--listen", "127.0.0.1:0", "--tls-cert", str(cert)]
    )
    assert result.exit_code == 2
    assert "--tls-cert and --tls-key go together" in result.output
    result = CliRunner().invoke(
        app,
        ["sidecar", "--service", "shop", "--listen", "127.0.0.1:0",
         "--tls-cert", str(cert), "--tls-key", str(cert)],
    )  # fmt: skip
    assert result.exit_code == 2
    assert "sidecar TLS" in result.output
