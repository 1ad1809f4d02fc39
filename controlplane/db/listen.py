"""LISTEN for committed route changes on PostgreSQL (db.routes.ROUTES_CHANNEL).

The leader's reconciler listens on a connection of its own, so a change committed by
another replica's API wakes it within milliseconds. SQLite has no such thing; the
reconciler then polls (controller.reconciler). The payload is a service name written
by db.routes, but any client of the database may NOTIFY: names are bounded and
checked before they are passed on, and what is dropped is counted.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import psycopg
from sqlalchemy.engine import URL

from controlplane.db.routes import ROUTES_CHANNEL
from controlplane.db.session import PG_CONNECT_TIMEOUT_SEC, PG_KEEPALIVES
from controlplane.kernel.errors import BackendUnavailable

log = logging.getLogger(__name__)


def listens(url: URL) -> bool:
    """Whether changes committed to this database can be listened for."""
    return url.get_backend_name() == "postgresql"


# The listener only reads: a server that vanished without closing the connection (a
# host lost, a partition) would leave it waiting for notices that never come, with
# only the 5 s full pass to hide it. TCP keepalives notice within ~25 s; the
# reconciler then listens again.
_LISTENER_BOUNDS = {"connect_timeout": str(PG_CONNECT_TIMEOUT_SEC), **PG_KEEPALIVES}


def _conninfo(url: URL) -> str:
    missing = {name: value for name, value in _LISTENER_BOUNDS.items() if name not in url.query}
    url = url.update_query_dict(missing)  # what the URL names itself wins
    return url.set(drivername="postgresql").render_as_string(hide_password=False)


async def listen_for_routes(
    url: URL,
    on_change: Callable[[str], None],
    *,
    accept: Callable[[str], bool],
    on_listening: Callable[[], None],
) -> None:
    """Call `on_change(service)` for every route change committed, until cancelled.

    `on_listening` is called once LISTEN holds: what was committed before was announced
    to no one. `accept` checks a payload before it is passed on. Raises
    BackendUnavailable when the connection is lost (the caller listens again).
    """
    try:
        conn = await psycopg.AsyncConnection.connect(_conninfo(url), autocommit=True)
    except psycopg.Error as exc:
        raise BackendUnavailable(f"cannot listen for route changes: {exc}") from exc
    try:
        async with conn:
            await conn.execute(f"LISTEN {ROUTES_CHANNEL}")
            on_listening()
            async for note in conn.notifies():
                if accept(note.payload):
                    on_change(note.payload)
                else:
                    log.warning("ignored a route change notice that names no service")
    except psycopg.Error as exc:
        raise BackendUnavailable(f"listening for route changes stopped: {exc}") from exc
