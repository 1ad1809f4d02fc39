"""The client's edges: credentials sent from their files at each query and never
logged, TLS with a client certificate against a real Prometheus, and whatever an
endpoint in Prometheus's place may answer (our own test server, not a Prometheus)."""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from controlplane.kernel.backend_access import PrometheusAccess, prometheus_access
from controlplane.kernel.errors import ConfigError
from controlplane.kernel.settings import Settings
from controlplane.providers.prom_answer import MAX_ANSWER_BYTES, NoData, parse_answer
from controlplane.providers.prometheus import PrometheusClient
from tests.support.jwks_server import http_answer
from tests.support.metrics_exporter import MetricsExporter
from tests.support.metrics_exporter import serving as exporting
from tests.support.prometheus import PrometheusProcess
from tests.support.tls import make_pki

ONE = json.dumps({"status": "success", "data": {"resultType": "scalar",
                                                "result": [1.5, "42"]}}).encode()  # fmt: skip


@dataclass
class Endpoint:
    """Answers every request with `answer`, keeping each request's head."""

    answer: bytes = field(default_factory=lambda: http_answer(ONE))
    heads: list[bytes] = field(default_factory=list)
    url: str = ""

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            self.heads.append(await reader.readuntil(b"\r\n\r\n"))
            writer.write(self.answer)
            await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()


@asynccontextmanager
async def endpoint(answer: bytes | None = None) -> AsyncIterator[Endpoint]:
    target = Endpoint() if answer is None else Endpoint(answer)
    server = await asyncio.start_server(target.handle, "127.0.0.1", 0)
    target.url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    try:
        yield target
    finally:
        server.close()
        await server.wait_closed()


async def value_of(access: PrometheusAccess) -> float:
    client = PrometheusClient(access)
    try:
        return await client.value("up", 1.0)
    finally:
        await client.aclose()


async def test_the_bearer_token_is_read_at_each_query_and_never_logged(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    token = tmp_path / "token"
    token.write_text("first-secret\n")
    async with endpoint() as server:
        settings = Settings(prometheus_url=server.url,
                            prometheus_bearer_token_file=str(token))  # fmt: skip
        access = prometheus_access(settings)
        assert access is not None
        assert await value_of(access) == 42
        token.write_text("second-secret\n")
        assert await value_of(access) == 42
        token.unlink()
        with pytest.raises(NoData) as gone:
            await value_of(access)

    assert b"\r\nAuthorization: Bearer first-secret\r\n" in server.heads[0]
    assert b"\r\nAuthorization: Bearer second-secret\r\n" in server.heads[1]
    assert gone.value.outcome == "credentials"
    assert "CANARY_PROMETHEUS_BEARER_TOKEN_FILE: cannot read" in gone.value.reason
    assert "secret" not in caplog.text.replace("CANARY_PROMETHEUS", "")


async def test_a_token_that_would_break_the_header_is_not_sent(tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("tök\x7fen\n")
    async with endpoint() as server:
        access = prometheus_access(Settings(prometheus_url=server.url,
                                            prometheus_bearer_token_file=str(token)))  # fmt: skip
        assert access is not None
        with pytest.raises(NoData) as refused:
            await value_of(access)

    assert server.heads == []
    assert refused.value.reason == (
        "CANARY_PROMETHEUS_BEARER_TOKEN_FILE: the token is not printable ASCII"
    )


async def test_basic_auth_from_the_password_file(tmp_path: Path) -> None:
    password = tmp_path / "password"
    password.write_text("pa:ss\n")
    async with endpoint() as server:
        access = prometheus_access(Settings(
            prometheus_url=server.url + "/prom/", prometheus_user="reader",
            prometheus_password_file=str(password)))  # fmt: skip
        assert access is not None
        assert await value_of(access) == 42

    head = server.heads[0].decode()
    assert head.startswith("POST /prom/api/v1/query HTTP/1.1")
    assert f"Basic {base64.b64encode(b'reader:pa:ss').decode()}" in head


@pytest.mark.parametrize(
    ("answer", "outcome", "reason"),
    [
        (http_answer(b"<html>bad gateway</html>", 502, "text/html"), "http_error",
         "prometheus answered HTTP 502"),
        (http_answer(b"{not json"), "bad_answer", "prometheus's answer is not JSON"),
        (http_answer(b"[" * 100_000), "bad_answer", "prometheus's answer is not JSON"),
        (http_answer(b"x" * (MAX_ANSWER_BYTES + 1)), "too_large",
         f"the answer is larger than {MAX_ANSWER_BYTES} bytes (many series? add a sum()/max())"),
        (http_answer(b"x" * (MAX_ANSWER_BYTES + 1), length=False), "too_large",
         f"the answer is larger than {MAX_ANSWER_BYTES} bytes (many series? add a sum()/max())"),
        (b"HTTP/1.1 302 Found\r\nLocation: http://elsewhere.invalid/\r\nContent-Length: 0\r\n\r\n",
         "http_error", "prometheus answered HTTP 302"),
        (b"HTTP/1.1 200 OK\r\nContent-Encoding: gzip\r\nContent-Length: 2\r\n\r\n{}",
         "bad_answer", "prometheus's answer came compressed though asked not to be"),
        (b"garbage\r\n\r\n", "unreachable", None),
    ],
)
async def test_whatever_answers_in_prometheus_place_is_no_data(
    answer: bytes, outcome: str, reason: str | None
) -> None:
    async with endpoint(answer) as server:
        with pytest.raises(NoData) as no_data:
            await value_of(PrometheusAccess(url=server.url))

    assert no_data.value.outcome == outcome
    if reason is not None:
        assert no_data.value.reason == reason
    else:
        assert no_data.value.reason.startswith("prometheus unreachable: ")


def answer(result_type: str, result: object) -> bytes:
    return json.dumps({"status": "success",
                       "data": {"resultType": result_type, "result": result}}).encode()


BAD_SAMPLE = "prometheus's sample is not [time, \"value\"]"
NOT_ONE = "expected one instant-vector series or a scalar"


def sample(value: object, at: object = 1) -> bytes:
    return answer("vector", [{"metric": {}, "value": [at, value]}])


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        (sample("NaN"), "the value is NaN (a division by zero?)"),
        (sample("+Inf"), "the value is +Inf"),
        (answer("scalar", [1, "-Inf"]), "the value is -Inf"),
        (sample("1_000"), BAD_SAMPLE),
        (sample(" 1"), BAD_SAMPLE),
        (sample("1", at=True), BAD_SAMPLE),
        (sample(1), BAD_SAMPLE),
        (answer("vector", [{"metric": {}, "value": [1, "1", 2]}]), BAD_SAMPLE),
        (answer("vector", [{"metric": {}}, {"metric": {}}]),
         "2 series, expected one: add a sum()/max()"),
        (answer("vector", []), "no series matched (an empty answer)"),
        (answer("vector", {}), "prometheus's vector is not a list"),
        (answer("matrix", []), f"the query returns a matrix, {NOT_ONE}"),
        (answer("string", [1, "x"]), f"the query returns a string, {NOT_ONE}"),
        (b'{"status": "success"}', "prometheus's answer has no data object"),
        (b'{"status": "ok", "data": {}}', "prometheus's answer has no status success"),
        (b"[]", "prometheus's answer is not a JSON object"),
        (b'{"status": "error", "errorType": "bad_data", "error": "parse error\\n\\u0000at x"}',
         "prometheus refused the query (HTTP 200): bad_data: parse error at x"),
    ],
)  # fmt: skip
def test_answers_are_parsed_strictly(body: bytes, reason: str) -> None:
    with pytest.raises(NoData) as no_data:
        parse_answer(200, body)
    assert no_data.value.reason == reason


def test_good_answers_parse() -> None:
    one = [{"metric": {"a": "b"}, "value": [1.5, "0.25"]}]
    assert parse_answer(200, answer("vector", one)) == 0.25
    assert parse_answer(200, answer("scalar", [1, "-3e2"])) == -300


@pytest.mark.parametrize(
    ("url", "problem"),
    [
        ("ftp://p:9090", "must start with http:// or https://"),
        ("http://user:pw@p:9090", "no credentials in the Prometheus URL"),
        ("http://p:9090/?x=1", "no query or fragment"),
        ("http://p:99999", "does not parse"),
        ("http://p 1:9090", "spaces or control characters"),
        ("http://:9090", "names no host"),
    ],
)
def test_bad_prometheus_urls_are_refused(url: str, problem: str) -> None:
    with pytest.raises(ValueError, match=problem):
        Settings(prometheus_url=url)


def test_credentials_settings_are_checked_at_start(tmp_path: Path) -> None:
    secret = tmp_path / "s"
    secret.write_text("x\n")
    url = "https://prom.example:9090/"
    assert prometheus_access(Settings()) is None
    assert Settings(prometheus_url=url).prometheus_url == "https://prom.example:9090"
    for fields, message in (
        ({"prometheus_user": "u"}, "without CANARY_PROMETHEUS_PASSWORD_FILE"),
        ({"prometheus_password_file": str(secret)}, "CANARY_PROMETHEUS_USER is not"),
        ({"prometheus_user": "u", "prometheus_password_file": str(secret),
          "prometheus_bearer_token_file": str(secret)}, "not both"),
        ({"prometheus_bearer_token_file": str(tmp_path / "none")}, "cannot read"),
        ({"prometheus_cert_file": str(secret)}, "go together"),
        ({"prometheus_ca_file": str(secret)}, "is not a PEM file"),
    ):  # fmt: skip
        with pytest.raises(ConfigError, match=message):
            prometheus_access(Settings(prometheus_url=url, **fields))


async def test_tls_with_a_client_certificate_against_prometheus(tmp_path: Path) -> None:
    pki = make_pki(tmp_path / "pki")
    with exporting(MetricsExporter()) as exporter:
        exporter.gauge("tls_g", {"variant": "canary"}, 8)
        secured = PrometheusProcess(exporter.port, tls=pki)
        try:
            secured.start()
            secured.wait_value('tls_g{variant="canary"}', 8)
            base = {"prometheus_url": secured.url, "prometheus_ca_file": pki.ca_file}
            client_cert = {"prometheus_cert_file": pki.client_cert,
                           "prometheus_key_file": pki.client_key}  # fmt: skip
            good = prometheus_access(Settings(**base, **client_cert))
            no_cert = prometheus_access(Settings(**base))
            other = {**base, "prometheus_ca_file": pki.other_ca_file}
            wrong_ca = prometheus_access(Settings(**other, **client_cert))
            assert good is not None and no_cert is not None and wrong_ca is not None

            assert await value_of_query(good, 'tls_g{variant="canary"}') == 8
            for refused in (no_cert, wrong_ca):
                with pytest.raises(NoData) as no_data:
                    await value_of_query(refused, 'tls_g{variant="canary"}')
                assert no_data.value.outcome == "unreachable"
        finally:
            secured.close()


async def value_of_query(access: PrometheusAccess, query: str) -> float:
    client = PrometheusClient(access)
    try:
        return await client.value(query, time.time())
    finally:
        await client.aclose()
