"""Alembic environment: the target is the ORM models' metadata.

The URL (or an open connection) comes from the Config built in code by
controlplane.db.migrate, so no alembic.ini is needed and any cwd works.
"""

from __future__ import annotations

from alembic import context
from sqlalchemy import Connection

from controlplane.db.models import Base
from controlplane.db.session import make_engine

config = context.config
target_metadata = Base.metadata


def run_with(connection: Connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=target_metadata,
        # SQLite alters tables by copying them; batch mode does that for us.
        render_as_batch=connection.dialect.name == "sqlite",
        compare_type=True,
    )
    with context.begin_transaction():
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
