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
