"""`canary rules recommend` against a real API whose snapshot board is a real Redis."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
from typer.testing import CliRunner

from controlplane.api.app import create_app
from controlplane.cli.main import app
from controlplane.db import migrate
from controlplane.kernel.settings import Settings
from controlplane.kernel.streams_redis import RedisStreams
from tests.cli.conftest import serving
from tests.support.auth import bearer, install_test_tokens

SERVICE = "reco-cli"


@pytest.fixture
def streaming_api(tmp_path: Path, redis_url: str, redis_namespace: str) -> Iterator[str]:
    """The API with its streams open, so it reads the decisions stream of the namespace."""
    database_url = f"sqlite:///{tmp_path / 'canary.db'}"
    migrate.upgrade(database_url)
    install_test_tokens(database_url)
    settings = Settings(
        database_url=database_url,
        etcd="memory://",
        redis_url=redis_url,
        redis_namespace=redis_namespace,
    )
    with serving(create_app(settings, streams=True)) as url:
        yield url


async def publish_history(
    redis_url: str, namespace: str, experiment: str, p95s: list[float]
) -> None:
    """Decisions entries as the collector writes them, one window apart."""
    board = RedisStreams(redis_url, namespace=namespace)
    try:
        for i, p95 in enumerate(p95s):
            ts = 1_800_000_000.0 + 10 * i
            baseline = {"count": 1000, "failures": 5, "p95_ms": p95}
            await board.publish(
                experiment,
                {},
                {
                    "kind": "snapshot", "experiment": experiment, "ts": repr(ts),
                    "window_start": repr(ts - 10), "window_end": repr(ts), "window_sec": "10",
                    "variants": json.dumps({"baseline": baseline}),
                },
            )  # fmt: skip
    finally:
        await board.close()


def test_rules_recommend_prints_the_proposal_and_its_numbers(
    streaming_api: str, redis_url: str, redis_namespace: str
) -> None:
    body = {
        "name": "reco", "service": SERVICE,
        "variants": {"baseline": {"upstream": "http://b:80"}, "canary": {"upstream": "http://c:80"}},
        "steps": [{"weight_pct": 10, "hold_sec": 60}],
    }  # fmt: skip
    created = httpx.post(
        f"{streaming_api}/v1/experiments", json=body, timeout=10, headers=bearer()
    )
    assert created.status_code == 201, created.text
    p95s = [100.0 + 4 * i for i in range(12)]
    asyncio.run(publish_history(redis_url, redis_namespace, str(created.json()["id"]), p95s))

    result = CliRunner().invoke(
        app, ["rules", "recommend", SERVICE, "--api", streaming_api], env={"COLUMNS": "200"}
    )

    assert result.exit_code == 0, result.output
    expected = np.ceil(np.percentile(p95s, 95) * 1.25 * 10) / 10
    assert "threshold_ms" in result.stdout and f"{expected:g}" in result.stdout
    assert "failure_ratio" in result.stdout and "0.01" in result.stdout
    assert "windows" in result.stdout and "12" in result.stdout
