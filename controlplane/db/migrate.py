"""Running the Alembic migrations from code (`canary db …`, `canary dev`, tests).

The Config is built here, pointing at the installed `migrations` package, so the
commands work from any directory and without an alembic.ini.
"""

from __future__ import annotations

import io
from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory

import migrations
from controlplane.db.session import database_url, make_engine
from controlplane.kernel.errors import ConfigError


def script_location() -> Path:
    """The migrations package directory (found through __path__, which also works when
    an editable install maps it as a namespace package)."""
    for entry in migrations.__path__:
        if (Path(entry) / "env.py").is_file():
            return Path(entry)
    raise ConfigError("the migrations package has no env.py: is the install complete?")


def alembic_config(url: str) -> Config:
    config = Config(stdout=io.StringIO())
    config.set_main_option("script_location", str(script_location()))
    # '%' is interpolation syntax in the ini-style config, so escape it.
    rendered = database_url(url).render_as_string(hide_password=False)
    config.set_main_option("sqlalchemy.url", rendered.replace("%", "%%"))
    return config


def upgrade(url: str, revision: str = "head") -> None:
    command.upgrade(alembic_config(url), revision)


def downgrade(url: str, revision: str = "-1") -> None:
    command.downgrade(alembic_config(url), revision)


def current(url: str) -> str | None:
    """The database's revision, or None for an empty database."""
    engine = make_engine(url)
    try:
        with engine.connect() as conn:
            return MigrationContext.configure(conn).get_current_revision()
    finally:
        engine.dispose()


def head(url: str) -> str | None:
    return ScriptDirectory.from_config(alembic_config(url)).get_current_head()


def pending(url: str) -> list[tuple[str, str]]:
    """The migrations the database lacks, oldest first: (revision, first line of its
    message). Empty when it is at head. Raises BackendUnavailable when it cannot be read."""
    from controlplane.db.session import db_errors

    with db_errors():
        now = current(url)
    scripts = ScriptDirectory.from_config(alembic_config(url))
    missing = [
        (script.revision, (script.doc or "").strip().splitlines()[0] if script.doc else "")
        for script in scripts.iterate_revisions("heads", now or "base")
        if script.revision != now
    ]
    return list(reversed(missing))
