"""`canary serve` before it listens: an unmigrated database is named as such, and the
bootstrap admin token from a file (a Kubernetes Secret) is installed once."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest
import typer

from controlplane.cli.main import main
from controlplane.cli.server import _bootstrap_token_or_exit
from controlplane.db import migrate
from controlplane.db.session import make_engine, make_sessionmaker
from controlplane.db.tokens import find_live_token, list_tokens, revoke_token
from controlplane.kernel.settings import Settings

TOKEN = "cnry_" + "a1" * 32


def serve(url: str, capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    code = main(["serve", "--database-url", url, "--listen", "127.0.0.1:0"])
    return code, capsys.readouterr().err


def test_serve_on_an_empty_database_names_the_migrations_and_the_command(
    sqlite_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, err = serve(sqlite_url, capsys)
    heads = len(list(Path(migrate.script_location(), "versions").glob("0*.py")))
    assert code == 1
    line = err.strip().splitlines()[-1]
    assert line.startswith(f"canary serve: the database lacks {heads} migration(s): 0001 (")
    assert line.endswith("run `canary db upgrade` (same --database-url / CANARY_DATABASE_URL) "
                         "first")
    assert "database unavailable" not in err


def test_serve_on_a_database_behind_names_only_what_is_missing(
    sqlite_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    head = migrate.head(sqlite_url)
    assert head is not None
    migrate.upgrade(sqlite_url)
    migrate.downgrade(sqlite_url, "-1")
    code, err = serve(sqlite_url, capsys)
    assert code == 1
    assert f"lacks 1 migration(s): {head} (" in err


def token_file(tmp_path: Path, token: str) -> str:
    path = tmp_path / "bootstrap-token"
    path.write_text(token + "\n")
    return str(path)


def live(url: str) -> list[tuple[str, str]]:
    with make_sessionmaker(make_engine(url))() as session:
        return [(t.name, t.role.value) for t in list_tokens(session=session)]


@pytest.fixture(params=["sqlite", "postgresql"])
def database(request: pytest.FixtureRequest) -> str:
    url: str = request.getfixturevalue("sqlite_url" if request.param == "sqlite" else "pg_url")
    return url


def test_the_bootstrap_token_is_installed_once_and_works(database: str, tmp_path: Path) -> None:
    migrate.upgrade(database)
    settings = Settings(database_url=database,
                        bootstrap_admin_token_file=token_file(tmp_path, TOKEN))
    _bootstrap_token_or_exit(settings)
    _bootstrap_token_or_exit(settings)  # a restart, another replica: nothing new
    assert live(database) == [("bootstrap-admin", "admin")]
    engine = make_engine(database)
    with make_sessionmaker(engine).begin() as session:
        found = find_live_token(session=session, token=TOKEN, now=datetime.now(UTC))
        assert found is not None and found.role.value == "admin"
        # an admin revokes it: a restart does not bring it back
        revoke_token(session=session, ref="bootstrap-admin", now=datetime.now(UTC))
    _bootstrap_token_or_exit(settings)
    assert live(database) == []
    # the Secret rotated: the new token is installed
    rotated = Settings(database_url=database,
                       bootstrap_admin_token_file=token_file(tmp_path, "cnry_" + "b2" * 32))
    _bootstrap_token_or_exit(rotated)
    assert live(database) == [("bootstrap-admin", "admin")]


def test_a_rotated_secret_replaces_the_live_bootstrap_token(
    sqlite_url: str, tmp_path: Path
) -> None:
    migrate.upgrade(sqlite_url)
    first = tmp_path / "first"
    first.mkdir()
    _bootstrap_token_or_exit(Settings(database_url=sqlite_url,
                                      bootstrap_admin_token_file=token_file(first, TOKEN)))
    _bootstrap_token_or_exit(Settings(
        database_url=sqlite_url,
        bootstrap_admin_token_file=token_file(tmp_path, "cnry_" + "c3" * 32)))
    with make_sessionmaker(make_engine(sqlite_url))() as session:
        assert find_live_token(session=session, token=TOKEN, now=datetime.now(UTC)) is None
        assert find_live_token(session=session, token="cnry_" + "c3" * 32,
                               now=datetime.now(UTC)) is not None


@pytest.mark.parametrize("content", ["not-a-token", "cnry_short", "", "cnry_" + "a" * 30 + "\nx"])
def test_a_bootstrap_file_without_one_token_is_refused(
    sqlite_url: str, tmp_path: Path, content: str, capsys: pytest.CaptureFixture[str]
) -> None:
    migrate.upgrade(sqlite_url)
    path = tmp_path / "token"
    path.write_text(content)
    settings = Settings(database_url=sqlite_url, bootstrap_admin_token_file=str(path))
    with pytest.raises(typer.Exit):
        _bootstrap_token_or_exit(settings)
    err = capsys.readouterr().err
    assert err.startswith("canary serve: bootstrap admin token: ") and err.count("\n") == 1
    assert live(sqlite_url) == []


def test_two_replicas_installing_the_bootstrap_token_at_once_both_start(
    pg_url: str, tmp_path: Path
) -> None:
    """The second replica's insert waits on the first's unique key, then fails when it
    commits: it reads again and finds the token installed, instead of exiting."""
    import threading
    import time

    from sqlalchemy import text

    from controlplane.db.tokens import ensure_bootstrap_token

    migrate.upgrade(pg_url)
    settings = Settings(database_url=pg_url, bootstrap_admin_token_file=token_file(tmp_path, TOKEN))
    engine = make_engine(pg_url)
    outcome: list[BaseException | None] = []

    def second_replica() -> None:
        try:
            _bootstrap_token_or_exit(settings)
            outcome.append(None)
        except BaseException as exc:  # typer.Exit too: the test reports what was raised
            outcome.append(exc)

    with make_sessionmaker(engine).begin() as first:
        ensure_bootstrap_token(session=first, token=TOKEN, now=datetime.now(UTC))  # flushed
        racer = threading.Thread(target=second_replica)
        racer.start()
        with engine.connect() as watcher:  # commit only once the second waits on the lock
            deadline = time.monotonic() + 10
            while not watcher.execute(text(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                "AND wait_event_type = 'Lock'"
            )).scalar() and racer.is_alive():
                assert time.monotonic() < deadline, "the second replica never waited"
                time.sleep(0.02)
                watcher.rollback()
    racer.join(10)
    assert outcome == [None], outcome
    assert live(pg_url) == [("bootstrap-admin", "admin")]
    engine.dispose()
