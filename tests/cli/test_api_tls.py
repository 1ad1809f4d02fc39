"""The API over HTTPS (and mTLS) with the options `canary serve` builds, and the CLI
client trusting a private CA; certificates from trustme, server on a private port."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from controlplane.api.app import create_app
from controlplane.cli.main import main
from controlplane.cli.server import tls_options
from controlplane.client.api_client import ApiUnreachable, CanaryClient
from controlplane.db import migrate
from controlplane.kernel.errors import ConfigError
from controlplane.kernel.settings import Settings
from controlplane.kernel.tls import client_context
from tests.cli.conftest import free_port, serving
from tests.support.auth import ADMIN_TOKEN, install_test_tokens
from tests.support.tls import Pki, make_pki


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


@contextlib.contextmanager
def serving_tls(settings: Settings, tmp: Path) -> Iterator[str]:
    database_url = f"sqlite:///{tmp / 'canary.db'}"
    migrate.upgrade(database_url)
    install_test_tokens(database_url)
    app = create_app(settings.model_copy(update={"database_url": database_url}))
    with serving(app, **tls_options(settings)) as url:
        yield url


@pytest.fixture(scope="module")
def https_api(pki: Pki, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    settings = Settings(etcd="memory://", redis_url="memory://",
                        tls_cert=pki.server_cert, tls_key=pki.server_key)
    with serving_tls(settings, tmp_path_factory.mktemp("api")) as url:
        yield url


@pytest.fixture(scope="module")
def mtls_api(pki: Pki, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    settings = Settings(etcd="memory://", redis_url="memory://", tls_cert=pki.server_cert,
                        tls_key=pki.server_key, tls_client_ca=pki.ca_file)
    with serving_tls(settings, tmp_path_factory.mktemp("api-mtls")) as url:
        yield url


def test_the_client_trusting_the_ca_talks_to_the_https_api(https_api: str, pki: Pki) -> None:
    trusting = client_context(ca_file=pki.ca_file)
    with CanaryClient(https_api, token=ADMIN_TOKEN, tls=trusting) as client:
        assert client.list_experiments()["items"] == []


def test_without_the_ca_the_cli_fails_with_one_line(
    https_api: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("CANARY_CA_FILE", raising=False)
    assert main(["exp", "list", "--api", https_api]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert "cannot reach the canary API" in err and "CERTIFICATE_VERIFY_FAILED" in err


def test_the_cli_trusts_the_ca_from_the_flag_or_the_environment(
    https_api: str, pki: Pki, capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    assert main(["--ca-file", pki.ca_file, "exp", "list", "--api", https_api, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["items"] == []
    monkeypatch.setenv("CANARY_CA_FILE", pki.ca_file)
    assert main(["exp", "list", "--api", https_api, "--json"]) == 0


def test_mtls_refuses_a_client_without_a_certificate_and_admits_one_with(
    mtls_api: str, pki: Pki, capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    without_certificate = client_context(ca_file=pki.ca_file)
    with (CanaryClient(mtls_api, token=ADMIN_TOKEN, tls=without_certificate) as client,
          pytest.raises(ApiUnreachable)):
        client.list_experiments()
    monkeypatch.setenv("CANARY_CA_FILE", pki.ca_file)
    monkeypatch.setenv("CANARY_CLIENT_CERT", pki.client_cert)
    monkeypatch.setenv("CANARY_CLIENT_KEY", pki.client_key)
    assert main(["exp", "list", "--api", mtls_api, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["items"] == []


def test_bad_certificate_files_are_one_line_errors_at_start(pki: Pki, tmp_path: Path) -> None:
    missing = str(tmp_path / "missing.pem")
    cases = {
        "cannot read": Settings(tls_cert=missing, tls_key=pki.server_key),
        "does not belong": Settings(tls_cert=pki.server_cert, tls_key=pki.client_key),
        "go together": Settings(tls_cert=pki.server_cert),
        "not a PEM file": Settings(tls_cert=pki.server_cert, tls_key=pki.server_key,
                                   tls_client_ca=str(Path(__file__))),
    }
    for expected, settings in cases.items():
        with pytest.raises(ConfigError, match=expected) as caught:
            tls_options(settings)
        assert "\n" not in str(caught.value)


def test_serve_exits_with_one_line_on_a_mismatched_key(
    pki: Pki, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(["serve", "--listen", f"127.0.0.1:{free_port()}", "--tls-cert",
                 pki.server_cert, "--tls-key", pki.client_key])
    assert code == 2
    err = capsys.readouterr().err
    assert err.startswith("canary serve: API TLS: the key") and err.count("\n") == 1
