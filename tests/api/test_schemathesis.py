"""The API against its own OpenAPI document, fuzzed by schemathesis with every check.

Each operation gets positive and negative examples; every response must be a
non-5xx, documented status with a documented content type and body schema, and
invalid data must be refused. A stateful run follows the OpenAPI links from a
created experiment to its reads, changes and actions.

The app runs in-process through schemathesis' ASGI transport, which runs its lifespan
(the lifespan opens the backends itself, in the transport's event loop). Two
backend sets: SQLite with the in-process KV store, and PostgreSQL with etcd.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis.generation.modes import GenerationMode
from schemathesis.python import asgi
from schemathesis.specs.openapi.schemas import OpenApiSchema

from controlplane.api.app import create_app
from controlplane.auth.roles import Role
from controlplane.db import migrate
from controlplane.kernel.settings import Settings
from tests.conftest import ETCD, unique
from tests.support.auth import bearer, install_test_tokens

# the ASGI transport's Host
HOSTS = {"trusted_hosts": "testserver,localhost"}
EXAMPLES = 15
STEPS = 10
STATEFUL_EXAMPLES = 8

# positive_data_acceptance asserts that every schema-valid request is accepted. Some
# rules cannot be written in JSON Schema: steps increase strictly, an inline rule names
# the experiment's service, one of the sticky header/cookie is set, the upstream
# allow-list. Such requests are refused with a documented 422 naming the field; every
# other check runs (5xx, statuses, content types, response schemas, negative data).
EXCLUDED = [schemathesis.checks.positive_data_acceptance]


@pytest.fixture(scope="module", params=["embedded", "real"])
def api_schema(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[OpenApiSchema]:
    if request.param == "real":
        database = request.getfixturevalue("migrated_pg")
        backends = Settings(
            database_url=database, etcd=ETCD, etcd_prefix="/" + unique("fuzz"), **HOSTS
        )
    else:
        folder: Path = tmp_path_factory.mktemp("fuzz")
        database = f"sqlite:///{folder}/canary.db"
        migrate.upgrade(database)
        backends = Settings(
            database_url=database, etcd="memory://", redis_url="memory://", **HOSTS
        )
    install_test_tokens(database)
    app = create_app(backends)
    schema = schemathesis.openapi.from_asgi("/openapi.json", app)
    # every call as an admin, so every operation is reachable; schemathesis' own
    # `ignored_auth` check also sends each one without it and expects a refusal
    schema.config.update(headers=bearer(Role.ADMIN))
    schema.config.generation.update(max_examples=EXAMPLES, deterministic=True)
    schema.config.checks.update(excluded_check_names=[c.__name__ for c in EXCLUDED])
    try:
        yield schema
    finally:
        asgi.shutdown_lifespans()  # closes the backends the lifespan opened


# The operations, read from a document that needs no backends to build. (schemathesis'
# own pytest parametrization does not run on this pytest, hence one test per operation
# and generation mode, each driving hypothesis itself.)
_PATHS = create_app(Settings()).openapi()["paths"]
OPERATIONS = [
    pytest.param(path, method.upper(), mode, id=f"{method.upper()} {path} {mode.value}")
    for path, item in _PATHS.items()
    for method, operation in item.items()
    for mode in GenerationMode
    # an operation that takes no input has no invalid input to send
    if mode is GenerationMode.POSITIVE
    or operation.get("parameters")
    or operation.get("requestBody")
]


@pytest.mark.parametrize(("path", "method", "mode"), OPERATIONS)
def test_every_operation_answers_as_documented(
    api_schema: OpenApiSchema, path: str, method: str, mode: GenerationMode
) -> None:
    operation = api_schema[path][method]

    @given(case=operation.as_strategy(generation_mode=mode))
    @settings(
        max_examples=EXAMPLES,
        deadline=None,
        suppress_health_check=list(HealthCheck),
        derandomize=True,
        database=None,
    )
    def answers_as_documented(case: schemathesis.Case) -> None:
        case.call_and_validate(excluded_checks=EXCLUDED)

    answers_as_documented()


def test_created_experiments_follow_their_links(api_schema: OpenApiSchema) -> None:
    machine = api_schema.as_state_machine()
    run = settings(
        max_examples=STATEFUL_EXAMPLES,
        stateful_step_count=STEPS,
        deadline=None,
        suppress_health_check=list(HealthCheck),
        derandomize=True,
        database=None,
    )
    machine.run(settings=run)
