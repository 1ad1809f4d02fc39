"""`canary token create|list|revoke`: API tokens, straight on the database.

They need no API, so the first admin token can be made before one runs (bootstrap);
admins may also manage tokens remotely through /v1/tokens.
"""

from __future__ import annotations

import getpass
from typing import Annotated

import typer

from controlplane.cli.remote import JsonOption, fail, print_json
from controlplane.cli.server import DatabaseOption, settings_with


def _creator() -> str:
    try:
        return f"cli:{getpass.getuser()}"
    except (OSError, KeyError):
        return "cli"


def register(app: typer.Typer) -> None:
    token = typer.Typer(help="API tokens (on the database directly).", no_args_is_help=True)
    app.add_typer(token, name="token")

    @token.command("create")
    def create_command(
        name: Annotated[str, typer.Option("--name", help="who or what holds the token")],
        role: Annotated[str, typer.Option("--role", help="viewer, operator or admin")],
        database_url: DatabaseOption = None,
    ) -> None:
        """Create a token and print it, once: only its hash is stored."""
        from controlplane.auth.roles import parse_role
        from controlplane.db.session import in_transaction
        from controlplane.db.tokens import issue_token
        from controlplane.kernel.clock import SystemClock, utc_now
        from controlplane.kernel.errors import CanaryError

        command = "canary token create"
        try:
            parsed = parse_role(role)
        except ValueError as exc:
            raise fail(command, str(exc)) from None
        url = settings_with(database_url=database_url).database_url
        try:
            info, secret = in_transaction(
                url,
                lambda session: issue_token(
                    session=session, name=name, role=parsed, created_by=_creator(),
                    now=utc_now(SystemClock()),
                ),
            )  # fmt: skip
        except CanaryError as exc:
            raise fail(command, str(exc), 1) from None
        typer.echo(secret)
        typer.echo(
            f"token {info.id} {info.name!r} ({info.role.value}) created; it is shown only "
            f"this once: export CANARY_TOKEN=<the line above>",
            err=True,
        )

    @token.command("list")
    def list_command(
        database_url: DatabaseOption = None,
        revoked: Annotated[bool, typer.Option("--revoked", help="also revoked ones")] = False,
        as_json: JsonOption = False,
    ) -> None:
        """The tokens (never their secrets)."""
        from controlplane.db.session import in_transaction
        from controlplane.db.tokens import list_tokens
        from controlplane.kernel.errors import CanaryError

        url = settings_with(database_url=database_url).database_url
        try:
            found = in_transaction(
                url, lambda session: list_tokens(session=session, include_revoked=revoked)
            )
        except CanaryError as exc:
            raise fail("canary token list", str(exc), 1) from None
        if as_json:
            print_json([info.__dict__ for info in found])
            return
        from controlplane.cli.experiments import time_text

        for info in found:
            # the seconds in UTC, as every other CLI time (not +00:00 and microseconds)
            used = time_text(info.last_used_at.isoformat()) if info.last_used_at else "never"
            state = (f"revoked {time_text(info.revoked_at.isoformat())}" if info.revoked_at
                     else "live")
            typer.echo(
                f"{info.id:>4}  {info.name:<24} {info.role.value:<9} created "
                f"{time_text(info.created_at.isoformat())} by {info.created_by}, used {used}, "
                f"{state}"
            )

    @token.command("revoke")
    def revoke_command(
        ref: Annotated[str, typer.Argument(metavar="ID|NAME", help="the token's id or name")],
        database_url: DatabaseOption = None,
    ) -> None:
        """Revoke a token: the API refuses it from the next request on."""
        from controlplane.db.session import in_transaction
        from controlplane.db.tokens import revoke_token
        from controlplane.kernel.clock import SystemClock, utc_now
        from controlplane.kernel.errors import CanaryError, NotFound

        url = settings_with(database_url=database_url).database_url
        try:
            info = in_transaction(
                url,
                lambda session: revoke_token(session=session, ref=ref, now=utc_now(SystemClock())),
            )
        except NotFound as exc:
            raise fail("canary token revoke", str(exc), 2) from None
        except CanaryError as exc:
            raise fail("canary token revoke", str(exc), 1) from None
        typer.echo(f"token {info.id} {info.name!r} revoked")

