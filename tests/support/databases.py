"""A migrated database handed to each test as if it were new.

Creating, migrating and dropping a database per test costs seconds a case on a
busy server (CREATE DATABASE copies a template and writes it to the WAL; DROP
waits for a checkpoint). Tests that need a migrated schema, not a database of their
own, share the session's one instead: before each test it is emptied to what a new
migrated database holds (every table but alembic's empty, identities restarted)
and left by every other connection, as DROP ... WITH (FORCE) would. A SQLite
database is a file: each test gets its own copy of one migrated once.
"""

from __future__ import annotations

import sqlite3
from contextlib import closing
from pathlib import Path

import psycopg
from psycopg import sql
from sqlalchemy.engine import make_url

from controlplane.db import migrate

MIGRATIONS_TABLE = "alembic_version"


def _conninfo(url: str) -> str:
    return make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)


def migrated(url: str) -> str:
    """`url`, migrated to the head revision."""
    migrate.upgrade(url)
    return url


def emptied(url: str) -> str:
    """`url` with its tables emptied and no other session on it; returns `url`."""
    with psycopg.connect(_conninfo(url), autocommit=True) as conn:
        # a session a test left open (a leaked pool, a listener) would hold locks
        conn.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
            " WHERE datname = current_database() AND pid <> pg_backend_pid()"
        )
        rows = conn.execute(
            "SELECT tablename FROM pg_tables WHERE schemaname = 'public' AND tablename <> %s",
            (MIGRATIONS_TABLE,),
        ).fetchall()
        tables = [sql.Identifier(name) for (name,) in rows]
        if tables:
            conn.execute(
                sql.SQL("TRUNCATE {} RESTART IDENTITY CASCADE").format(sql.SQL(", ").join(tables))
            )
    return url


def copy_sqlite(template: Path, dest: Path) -> str:
    """A copy of the SQLite database `template` at `dest` (through SQLite's backup,
    so what its write-ahead log holds is copied too); returns its URL."""
    with closing(sqlite3.connect(template)) as source, closing(sqlite3.connect(dest)) as copy:
        source.backup(copy)
    return f"sqlite:///{dest}"
