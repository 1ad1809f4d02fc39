"""Alembic migrations, located by `controlplane.db.migrate` from this package's path."""
