"""A real API for the CLI tests: the app on SQLite + in-process etcd, served by uvicorn.

One server per test module, on a free port, in a thread of this process; each test
uses its own service names, so experiments of different tests never collide.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import uvicorn
from fastapi import FastAPI

from controlplane.api.app import create_app
from controlplane.cli.server import background_services
from controlplane.db import migrate
from controlplane.kernel.settings import Settings
from tests.support.auth import ADMIN_TOKEN, install_test_tokens

STARTUP_TIMEOUT_SEC = 10.0


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@contextlib.contextmanager
def serving(app: FastAPI, **tls: Any) -> Iterator[str]:
    """Serve `app` with uvicorn in a thread on a free port; yield its base URL.

    tls: uvicorn's ssl_* options (as `canary serve` builds them): the URL is https."""
    port = free_port()
    config = uvicorn.Config(
        app, host="127.0.0.1", port=port, log_level="warning", ws="none", lifespan="on", **tls
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, name="canary-api", daemon=True)
    thread.start()
    deadline = time.monotonic() + STARTUP_TIMEOUT_SEC
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            server.should_exit = True
            thread.join(timeout=5)
            pytest.fail("the API did not start")
        time.sleep(0.02)
    try:
        yield f"{'https' if tls else 'http'}://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)


@pytest.fixture(scope="module")
def api_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    database_url = f"sqlite:///{tmp_path_factory.mktemp('api') / 'canary.db'}"
    migrate.upgrade(database_url)
    install_test_tokens(database_url)
    settings = Settings(database_url=database_url, etcd="memory://", redis_url="memory://")
    # as `canary serve` runs it: the controller's leader publishes each verdict's route,
    # which `exp wait` waits for
    with serving(
        create_app(settings, services=background_services(settings, embedded=False),
                   streams=True)
    ) as url:
        yield url


@pytest.fixture(autouse=True)
def no_user_config(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The CLI reads no config or token file of whoever runs the tests."""
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    for name in ("CANARY_CONFIG", "CANARY_TOKEN_FILE", "CANARY_API", "CANARY_CA_FILE"):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture(autouse=True)
def admin_token(monkeypatch: pytest.MonkeyPatch) -> str:
    """Every command of these tests carries the test admin token (see tests/support/auth)."""
    monkeypatch.setenv("CANARY_TOKEN", ADMIN_TOKEN)
    return ADMIN_TOKEN


@pytest.fixture
def unreachable_url() -> str:
    """A URL where nothing listens (a port just freed)."""
    return f"http://127.0.0.1:{free_port()}"


@pytest.fixture
def service() -> str:
    return f"svc-{uuid.uuid4().hex[:8]}"


@pytest.fixture
def experiment_file(tmp_path: Path, service: str) -> Path:
    """The shipped example, moved onto this test's own service."""
    example = Path(__file__).resolve().parents[2] / "deploy" / "examples" / "experiment.yaml"
    text = example.read_text().replace("service: payment-api", f"service: {service}")
    assert service in text
    path = tmp_path / "experiment.yaml"
    path.write_text(text)
    return path


@pytest.fixture
def rule_file(tmp_path: Path, service: str) -> Path:
    example = Path(__file__).resolve().parents[2] / "deploy" / "examples" / "rule.yaml"
    text = example.read_text().replace("service: payment-api", f"service: {service}")
    assert service in text
    path = tmp_path / "rule.yaml"
    path.write_text(text)
    return path
