"""PostgreSQL connections start with server-side bounds: a statement that runs away
or waits on a lock is cancelled by the server and reported as the database being
unavailable, instead of holding a controller round or a request without end."""

from __future__ import annotations

import asyncio
import socket

import pytest
from sqlalchemy import text
from sqlalchemy.engine import make_url

from controlplane.db.listen import _conninfo, listen_for_routes
from controlplane.db.session import (
    PG_LOCK_TIMEOUT_MS,
    database_url,
    db_errors,
    make_engine,
    pg_connect_args,
)
from controlplane.kernel.errors import BackendUnavailable

pytestmark = pytest.mark.real


def setting(url: str, name: str, **engine_args: int) -> str:
    engine = make_engine(url, **engine_args)
    try:
        with engine.connect() as conn:
            return str(conn.execute(text(f"SHOW {name}")).scalar_one())
    finally:
        engine.dispose()


def test_every_connection_starts_with_a_statement_and_a_lock_timeout(pg_url: str) -> None:
    assert setting(pg_url, "statement_timeout") == "30s"
    assert setting(pg_url, "lock_timeout") == f"{PG_LOCK_TIMEOUT_MS // 1000}s"
    assert setting(pg_url, "statement_timeout", statement_timeout_ms=0) == "0"


def test_a_statement_over_its_bound_is_cancelled_and_reported_unavailable(pg_url: str) -> None:
    engine = make_engine(pg_url, statement_timeout_ms=50)
    try:
        with engine.connect() as conn, pytest.raises(BackendUnavailable), db_errors():
            conn.execute(text("SELECT pg_sleep(30)"))
        with engine.connect() as conn:  # the pool goes on serving
            assert conn.execute(text("SELECT 1")).scalar_one() == 1
    finally:
        engine.dispose()


def test_options_in_the_url_win(pg_url: str) -> None:
    url = make_url(pg_url).update_query_dict({"options": "-c statement_timeout=1234"})
    rendered = url.render_as_string(hide_password=False)
    assert setting(rendered, "statement_timeout") == "1234ms"
    assert setting(rendered, "lock_timeout") == "0"  # the URL's options replace ours whole


def test_the_bounds_are_refused_when_negative() -> None:
    with pytest.raises(ValueError, match="≥ 0"):
        pg_connect_args(make_url("postgresql://h/db"), -1)
    assert pg_connect_args(make_url("postgresql://h/db?connect_timeout=2&keepalives=0"), 0) == {
        "options": f"-c statement_timeout=0 -c lock_timeout={PG_LOCK_TIMEOUT_MS}",
        "keepalives_idle": "10", "keepalives_interval": "5", "keepalives_count": "3",
    }  # fmt: skip


def test_every_connection_keeps_its_socket_alive(pg_url: str) -> None:
    """Client-side keepalives, seen from the client's socket: a server gone without
    a word is noticed in ~25 s, not after the system's two hours."""
    engine = make_engine(pg_url)
    try:
        with engine.connect() as conn:
            raw = conn.connection.dbapi_connection
            sock = socket.socket(fileno=raw.pgconn.socket)  # type: ignore[union-attr]
            try:
                assert sock.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE) == 1
                assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE) == 10
                assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT) == 3
            finally:
                sock.detach()  # the connection's own descriptor: never closed here
    finally:
        engine.dispose()


def test_the_route_listener_connects_with_bounds_unless_the_url_names_them() -> None:
    query = make_url(_conninfo(make_url("postgresql+psycopg://u:p@h/db"))).query
    assert query == {
        "connect_timeout": "5", "keepalives": "1", "keepalives_idle": "10",
        "keepalives_interval": "5", "keepalives_count": "3",
    }  # fmt: skip
    own = make_url(_conninfo(make_url("postgresql://h/db?connect_timeout=1"))).query
    assert own["connect_timeout"] == "1"


async def test_the_route_listener_listens_with_its_bounds(pg_url: str) -> None:
    listening = asyncio.Event()
    task = asyncio.create_task(
        listen_for_routes(
            database_url(pg_url), lambda _: None, accept=lambda _: True,
            on_listening=listening.set,
        )
    )  # fmt: skip
    try:
        await asyncio.wait_for(listening.wait(), timeout=30)  # a hang guard
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
