"""Fixtures for the real services, each test isolated by its own prefix or database.

Real services: etcd (CANARY_TEST_ETCD, default 127.0.0.1:2379), Redis
(CANARY_TEST_REDIS, default redis://127.0.0.1:6379/0) and PostgreSQL
(CANARY_TEST_PG, default postgresql+psycopg://postgres@127.0.0.1:5432/test).
`make test` starts what is missing; a service that does not answer fails the tests
that need it, it never skips them.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from hypothesis import settings as hypothesis_settings

from controlplane.db import migrate
from controlplane.kernel.settings import Settings
from tests.support.databases import copy_sqlite
from tests.support.etcd_cluster import EtcdCluster
from tests.support.outage import Outage, open_outage
from tests.support.processes import EtcdProcess
from tests.support.redis_cluster import RedisCluster, start_cluster
from tests.support.redis_sentinel import SentinelSet, start_sentinel_set

ETCD = os.environ.get("CANARY_TEST_ETCD", "127.0.0.1:2379")
REDIS = os.environ.get("CANARY_TEST_REDIS", "redis://127.0.0.1:6379/0")
PG = os.environ.get("CANARY_TEST_PG", "postgresql+psycopg://postgres@127.0.0.1:5432/test")


def _resolve_lazy_imports() -> None:
    """Import now what anyio would import on first use, possibly in a server's thread.

    anyio ships a pytest plugin, so pytest's assertion rewriter compiles every anyio
    module it imports. On Python 3.11 that compile is not thread-safe ("AST constructor
    recursion depth mismatch"): a static file served from a live API's thread, the
    first time it asks for `anyio.open_file`, could fail while the main thread compiles
    too. Resolving the lazy names here, before any thread starts, leaves nothing to
    compile later.
    """
    import anyio

    for name in dir(anyio):
        getattr(anyio, name)


_resolve_lazy_imports()

# a per-example deadline is a wall-clock limit: on two busy cores it fails tests whose
# behaviour is right; speed is measured by `canary bench`, not asserted here
hypothesis_settings.register_profile("suite", deadline=None)
hypothesis_settings.load_profile("suite")


# tests that run for tens of seconds; their modules are handed out first (below)
LONG_RUNNING = ("e2e", "slow")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Put the modules holding long tests first, keeping every module's own order.

    pytest-xdist's load scheduling deals the tests out in this order (`make test`
    passes --maxschedchunk 2, so a worker is given two at a time as it frees up): the
    long ones are spread over the workers at the start and the short ones fill in
    around them, instead of one worker taking a long test near the end while the
    others sit idle.
    """
    long_modules = {
        item.nodeid.split("::", 1)[0]
        for item in items
        if any(item.get_closest_marker(name) for name in LONG_RUNNING)
    }
    items.sort(key=lambda item: item.nodeid.split("::", 1)[0] not in long_modules)


def unique(tag: str) -> str:
    return f"{tag}-{uuid.uuid4().hex[:10]}"


@pytest.fixture
def etcd_endpoint() -> str:
    return ETCD


@pytest.fixture
def etcd_prefix() -> str:
    return "/" + unique("canary-test")


@pytest.fixture
def redis_url() -> str:
    return REDIS


@pytest.fixture
def redis_namespace() -> Iterator[str]:
    namespace = unique("canary-test")
    yield namespace
    import redis as redis_sync

    client = redis_sync.Redis.from_url(REDIS)
    try:
        keys = list(client.scan_iter(match=f"{namespace}:*", count=1000))
        if keys:
            client.delete(*keys)
    finally:
        client.close()


@pytest.fixture(scope="session")
def pg_database_url() -> Iterator[str]:
    """A fresh PostgreSQL database for this test session, dropped at the end."""
    import psycopg
    from sqlalchemy.engine import make_url

    admin = make_url(PG)
    name = "canary_test_" + uuid.uuid4().hex[:12]
    conninfo = admin.set(drivername="postgresql").render_as_string(hide_password=False)
    with psycopg.connect(conninfo, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    try:
        yield admin.set(database=name).render_as_string(hide_password=False)
    finally:
        with psycopg.connect(conninfo, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture
def pg_url(pg_database_url: str) -> Iterator[str]:
    """A fresh database per test: created from the session's server, dropped after."""
    import psycopg
    from sqlalchemy.engine import make_url

    base = make_url(pg_database_url)
    name = "canary_t_" + uuid.uuid4().hex[:12]
    conninfo = base.set(drivername="postgresql").render_as_string(hide_password=False)
    with psycopg.connect(conninfo, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    try:
        yield base.set(database=name).render_as_string(hide_password=False)
    finally:
        with psycopg.connect(conninfo, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture
def sqlite_url(tmp_path: os.PathLike[str]) -> str:
    return f"sqlite:///{tmp_path}/canary.db"


@pytest.fixture(scope="session")
def migrated_sqlite(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A SQLite database migrated once for the session, copied for each test that asks
    for a migrated one (migrating a new file costs a quarter of a second a test)."""
    path = tmp_path_factory.mktemp("migrated") / "canary.db"
    migrate.upgrade(f"sqlite:///{path}")
    return path


@pytest.fixture(params=["real", "embedded"])
def backend_settings(
    request: pytest.FixtureRequest, tmp_path: os.PathLike[str], etcd_prefix: str
) -> Iterator[Settings]:
    """The same test twice: PostgreSQL + etcd + Redis, then SQLite + memory + memory.

    The SQLite database comes migrated (a copy of the session's); every user of this
    fixture upgrades its database first, which is then a no-op.
    """
    if request.param == "real":
        db = request.getfixturevalue("pg_url")
        namespace = request.getfixturevalue("redis_namespace")
        yield Settings(
            database_url=db,
            etcd=ETCD,
            etcd_prefix=etcd_prefix,
            redis_url=REDIS,
            redis_namespace=namespace,
        )
    else:
        template = request.getfixturevalue("migrated_sqlite")
        yield Settings(
            database_url=copy_sqlite(template, Path(tmp_path) / "canary.db"),
            etcd="memory://",
            etcd_prefix=etcd_prefix,
            redis_url="memory://",
        )


@pytest.fixture(scope="module")
def own_etcd() -> Iterator[EtcdProcess]:
    """An etcd of the module's own, for tests that cut it off or compact its history."""
    proc = EtcdProcess()
    proc.start()
    try:
        yield proc
    finally:
        proc.close()


@pytest.fixture(scope="session")
def etcd_cluster_session() -> Iterator[EtcdCluster]:
    """A 3-member etcd cluster on private ports, started once for the session."""
    cluster = EtcdCluster(size=3)
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.close()


@pytest.fixture
def etcd_cluster(etcd_cluster_session: EtcdCluster) -> EtcdCluster:
    """The session's cluster with every member up: a test may kill members freely."""
    etcd_cluster_session.heal()
    return etcd_cluster_session


@pytest.fixture(params=["memory", "etcd"])
async def outage(request: pytest.FixtureRequest, own_etcd: EtcdProcess) -> AsyncIterator[Outage]:
    """A consumer's store that the test can take away past its history and bring back."""
    async with open_outage(request.param, own_etcd) as opened:
        yield opened


@pytest.fixture(scope="session")
def redis_cluster() -> Iterator[RedisCluster]:
    """A 3-primary, 3-replica Redis Cluster on private ports, shared by the session.

    Tests that kill a node restore it (restart, wait until the cluster is ok) before
    they end, so the next test finds every slot served and every primary replicated.
    """
    cluster = start_cluster()
    try:
        yield cluster
    finally:
        cluster.close()


@pytest.fixture(scope="session")
def redis_sentinel() -> Iterator[SentinelSet]:
    """A Redis primary, its replica and three sentinels on private ports, for the session."""
    found = start_sentinel_set()
    try:
        yield found
    finally:
        found.close()
