"""Alembic environment: the target is the ORM models' metadata.

The URL (or an open connection) comes from the Config built in code by
controlplane.db.migrate, so no alembic.ini is needed and any cwd works.
"""

from __future__ import annotations

from alembic import context
from sqlalchemy import Connection, text

from controlplane.db.models import Base
from controlplane.db.session import make_engine

config = context.config
target_metadata = Base.metadata

# Replicas that start together (an API Deployment scaled to 3 on an empty database)
# each run `canary db upgrade`. On PostgreSQL the upgrade is one transaction, so a
# transaction-scoped advisory lock taken before Alembic reads the version makes the
# others wait, then find the schema current and do nothing. SQLite serialises writers
# by itself. The key is a constant of ours: "canary" as a 64-bit integer.
MIGRATION_LOCK_KEY = 0x63616E617279


def run_with(connection: Connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=target_metadata,
        # SQLite alters tables by copying them; batch mode does that for us.
        render_as_batch=connection.dialect.name == "sqlite",
        compare_type=True,
    )
    with context.begin_transaction():
        if connection.dialect.name == "postgresql":
            connection.execute(
                text("SELECT pg_advisory_xact_lock(:key)"), {"key": MIGRATION_LOCK_KEY}
            )
        context.run_migrations()


def run_offline() -> None:
    context.configure(
        url=config.get_main_option("sqlalchemy.url"),
        target_metadata=target_metadata,
        literal_binds=True,
        dialect_opts={"paramstyle": "named"},
    )
    with context.begin_transaction():
        context.run_migrations()


def run_online() -> None:
    connection = config.attributes.get("connection")
    if connection is not None:
        run_with(connection)
        return
    url = config.get_main_option("sqlalchemy.url")
    if not url:
        raise RuntimeError("no database URL in the Alembic config")
    engine = make_engine(url)
    try:
        with engine.connect() as conn:
            run_with(conn)
    finally:
        engine.dispose()


if context.is_offline_mode():
    run_offline()
else:
    run_online()
