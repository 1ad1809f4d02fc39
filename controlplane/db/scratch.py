"""A PostgreSQL database of one's own for a run (the benchmarks), dropped afterwards."""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from contextlib import contextmanager

from sqlalchemy import create_engine
from sqlalchemy.engine import make_url

from controlplane.db.session import database_url


@contextmanager
def scratch_database(server_url: str, *, tag: str = "canary_scratch") -> Iterator[str]:
    """Create a fresh database on the server of `server_url`; yield its URL; drop it."""
    admin = create_engine(database_url(server_url), isolation_level="AUTOCOMMIT")
    name = f"{tag}_{secrets.token_hex(4)}"
    try:
        with admin.connect() as conn:
            conn.exec_driver_sql(f'CREATE DATABASE "{name}"')
        yield make_url(server_url).set(database=name).render_as_string(hide_password=False)
    finally:
        with admin.connect() as conn:
            conn.exec_driver_sql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.dispose()
