"""Engines and sessions built from Settings (never at import time), and a transaction
helper that runs blocking SQL work off the event loop.

The API and the controller are asyncio programs and the drivers are synchronous, so
SQL work runs in worker threads; one transaction may span an await in between (the
etcd write of a route), and it commits only after that await succeeds.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from typing import Any, TypeVar

import anyio
import anyio.to_thread
from sqlalchemy import Engine, create_engine, event
from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import (
    DataError,
    DBAPIError,
    IntegrityError,
    OperationalError,
    SQLAlchemyError,
)
from sqlalchemy.orm import Session, sessionmaker
from sqlalchemy.orm.exc import StaleDataError

from controlplane.kernel import json_text
from controlplane.kernel.errors import (
    BackendUnavailable,
    CanaryError,
    ConfigError,
    Conflict,
    RevisionConflict,
    ValidationFailed,
)

log = logging.getLogger(__name__)

SQLITE_BUSY_TIMEOUT_MS = 5_000
# A query waiting on a lock, or running away, must not hold a controller round or an
# API request without end, nor a shutdown (which waits for the query's thread): on
# PostgreSQL the server cancels it, and the caller gets "database unavailable".
PG_STATEMENT_TIMEOUT_MS = 30_000
PG_LOCK_TIMEOUT_MS = 10_000
PG_CONNECT_TIMEOUT_SEC = 5
# The server's timeouts do nothing once the server is gone without closing the
# connection (a host lost, a partition): a query's thread would block until the
# system's keepalive notices, about 2 h 11 min by default. Client-side keepalives
# notice in about 25 s.
PG_KEEPALIVES = {
    "keepalives": "1",
    "keepalives_idle": "10",
    "keepalives_interval": "5",
    "keepalives_count": "3",
}

T = TypeVar("T")


def database_url(url: str) -> URL:
    """Parse a database URL; a bare postgresql:// means psycopg 3, the driver we ship."""
    try:
        parsed = make_url(url)
    except Exception as exc:
        raise ConfigError(f"invalid database URL {url!r}: {exc}") from exc
    if parsed.drivername in ("postgresql", "postgres"):
        parsed = parsed.set(drivername="postgresql+psycopg")
    if parsed.get_backend_name() not in ("postgresql", "sqlite"):
        raise ConfigError(f"unsupported database {parsed.drivername!r}: use PostgreSQL or SQLite")
    return parsed


def _sqlite_pragmas(dbapi_connection: Any, _record: Any) -> None:
    cursor = dbapi_connection.cursor()
    try:
        cursor.execute("PRAGMA foreign_keys=ON")
        cursor.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_MS}")
        # WAL lets readers (the controller) proceed while the API writes.
        cursor.execute("PRAGMA journal_mode=WAL")
    finally:
        cursor.close()


def make_engine(url: str, *, statement_timeout_ms: int = PG_STATEMENT_TIMEOUT_MS) -> Engine:
    """An engine for `url`. On PostgreSQL each statement is bounded by
    `statement_timeout_ms` (0: unbounded) and each lock wait by
    PG_LOCK_TIMEOUT_MS, unless the URL sets `options` itself."""
    parsed = database_url(url)
    if parsed.get_backend_name() == "sqlite":
        # Worker threads take turns on a connection, one at a time.
        engine = create_engine(
            parsed, connect_args={"check_same_thread": False}, json_serializer=json_text.dumps
        )
        event.listen(engine, "connect", _sqlite_pragmas)
        return engine
    return create_engine(
        parsed, pool_pre_ping=True, connect_args=pg_connect_args(parsed, statement_timeout_ms),
        json_serializer=json_text.dumps,
    )


def pg_connect_args(url: URL, statement_timeout_ms: int) -> dict[str, Any]:
    """The server-side bounds a PostgreSQL connection starts with; what the URL's
    query names itself wins."""
    if statement_timeout_ms < 0:
        raise ValueError("statement_timeout_ms must be ≥ 0")
    args: dict[str, Any] = {}
    if "connect_timeout" not in url.query:
        args["connect_timeout"] = PG_CONNECT_TIMEOUT_SEC
    args.update({name: value for name, value in PG_KEEPALIVES.items() if name not in url.query})
    if "options" not in url.query:
        args["options"] = (
            f"-c statement_timeout={statement_timeout_ms} -c lock_timeout={PG_LOCK_TIMEOUT_MS}"
        )
    return args


def make_sessionmaker(engine: Engine) -> sessionmaker[Session]:
    return sessionmaker(bind=engine, expire_on_commit=False, autoflush=False)


def translate_db_error(exc: SQLAlchemyError) -> CanaryError:
    """Map a driver error to the product's tree (kernel.errors) at this boundary.

    The driver's text (SQL, constraint and table names, values) is logged here and
    never carried on: the message of the translated error may reach an API client.
    """
    if isinstance(exc, StaleDataError):
        # a lost optimistic-concurrency race, the same kind as a lost etcd CAS
        return RevisionConflict("the experiment changed concurrently; read it again and retry")
    log.warning("database error: %s", getattr(exc, "orig", None) or exc)
    if isinstance(exc, IntegrityError):
        return Conflict("the change conflicts with stored data")
    if isinstance(exc, DataError):
        return ValidationFailed("a value is out of range for the database")
    if isinstance(exc, OperationalError | DBAPIError):
        return BackendUnavailable("database unavailable")
    return BackendUnavailable("database error")


@contextmanager
def db_errors() -> Iterator[None]:
    try:
        yield
    except (SQLAlchemyError, StaleDataError) as exc:
        raise translate_db_error(exc) from exc


class Transaction:
    """One session inside one transaction; `run` calls a sync function in a thread."""

    def __init__(self, session: Session) -> None:
        self.session = session

    async def run(self, fn: Callable[..., T], /, **kwargs: Any) -> T:
        return await in_thread(functools.partial(_guarded, fn, session=self.session, **kwargs))


async def in_thread(call: Callable[[], T]) -> T:
    """`call()` in a worker thread, never abandoned. A thread cannot be stopped, and
    anyio lets go of one when the task awaiting it is cancelled: the task would go on
    to roll back or close the session (or dispose of the engine) while the query still
    runs on the same connection, and two threads in one SQLite connection can crash
    the process. Cancelled, this waits for the thread to finish, then raises."""
    future = asyncio.ensure_future(anyio.to_thread.run_sync(call))
    try:
        return await asyncio.shield(future)
    except asyncio.CancelledError:
        while not future.done():
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.wait({future})  # never cancels it, never raises its error
        if not future.cancelled():
            future.exception()  # retrieved: the caller is cancelled, not told
        raise


def _guarded(fn: Callable[..., T], /, **kwargs: Any) -> T:
    with db_errors():
        return fn(**kwargs)


class Database:
    """The sessionmaker plus async transactions for asyncio callers."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.sessionmaker = make_sessionmaker(engine)

    @asynccontextmanager
    async def transaction(self) -> AsyncIterator[Transaction]:
        """Commit when the block ends normally; roll back on any exception.

        The rollback is shielded from cancellation so nothing is left half-written.
        """
        session = self.sessionmaker()
        try:
            yield Transaction(session)
            await in_thread(functools.partial(_guarded, _commit, session=session))
        except BaseException:
            with anyio.CancelScope(shield=True):
                await in_thread(session.rollback)
            raise
        finally:
            with anyio.CancelScope(shield=True):
                await in_thread(session.close)

    async def read(self, fn: Callable[..., T], /, **kwargs: Any) -> T:
        """Run a read-only function in its own short transaction."""
        async with self.transaction() as tx:
            return await tx.run(fn, **kwargs)

    async def ping(self) -> None:
        def select_one() -> None:
            with self.engine.connect() as conn:
                conn.exec_driver_sql("SELECT 1")

        await in_thread(functools.partial(_guarded, select_one))

    def dispose(self) -> None:
        self.engine.dispose()


def in_transaction(url: str, work: Callable[[Session], T]) -> T:
    """Run `work` in one committed transaction on the database at `url`, on an engine
    of its own (for one-shot commands that open no `Database`)."""
    engine = make_engine(url)
    try:
        with db_errors(), make_sessionmaker(engine).begin() as session:
            return work(session)
    finally:
        engine.dispose()


def _commit(*, session: Session) -> None:
    session.commit()
