"""`canary notify add|list|rm|test|deliveries`: webhook notifications.

`add` subscribes a webhook (admins) and prints its signing secret, once; `list`
shows the subscriptions (never their secrets); `rm` deletes one.

`test` sends a sample notification and says what the receiver answered: through the
API to a stored subscription (`--subscription ID`: the API holds its secret), or
from here to any URL with a secret from a file (`--url URL --secret-file F`, to try
a receiver before subscribing it). Exit 0 when the receiver took it (2xx), 1 when
it did not, 2 on a usage error.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from controlplane.cli.remote import (
    DEFAULT_API,
    EXIT_REFUSED,
    ApiOption,
    JsonOption,
    dash,
    fail,
    open_client,
    print_json,
    reporting,
)

COMMAND = "canary notify test"
SECRET_FILE_MAX = 4096


def read_secret(path: Path) -> str:
    """The secret in a file: one line, its surrounding whitespace ignored."""
    from controlplane.kernel.errors import ConfigError
    from controlplane.notify.signing import SECRET_MAX_CHARS, SECRET_MIN_CHARS

    try:
        with path.open("rb") as handle:
            raw = handle.read(SECRET_FILE_MAX + 1)
    except OSError as exc:
        raise ConfigError(f"cannot read the secret file {str(path)!r}: {exc.strerror}") from None
    if len(raw) > SECRET_FILE_MAX:
        raise ConfigError(f"the secret file {str(path)!r} is larger than {SECRET_FILE_MAX} bytes")
    try:
        secret = raw.decode("utf-8").strip()
    except UnicodeDecodeError:
        raise ConfigError(f"the secret file {str(path)!r} is not UTF-8 text") from None
    if not SECRET_MIN_CHARS <= len(secret) <= SECRET_MAX_CHARS or any(
        c.isspace() or not c.isprintable() for c in secret
    ):
        raise ConfigError(
            f"the secret in {str(path)!r} must be one line of {SECRET_MIN_CHARS}-"
            f"{SECRET_MAX_CHARS} printable characters without spaces"
        )
    return secret


def send_sample(url: str, secret: str, fmt: str) -> dict[str, Any]:
    """Sign and send the sample from this process, under CANARY_NOTIFY_* settings."""
    import asyncio

    from controlplane.kernel.clock import SystemClock, utc_now
    from controlplane.kernel.errors import ValidationFailed
    from controlplane.kernel.settings import Settings
    from controlplane.kernel.values import split_webhook
    from controlplane.notify.payloads import render
    from controlplane.notify.records import Format
    from controlplane.notify.sample import sample_event
    from controlplane.notify.sender import Outgoing, WebhookSender

    try:
        split_webhook(url)
        chosen = Format(fmt)
    except ValueError as exc:
        raise ValidationFailed(str(exc)) from None
    settings = Settings()
    clock = SystemClock()
    body = render(sample_event(utc_now(clock)), chosen, base_url=settings.dashboard_base_url)
    sender = WebhookSender(
        policy=settings.notify_policy,
        timeout_sec=settings.notify_timeout_sec,
        connect_timeout_sec=min(5.0, settings.notify_timeout_sec),
    )
    refused = sender.refusal(url)
    if refused is not None:
        raise ValidationFailed(f"not sent: {refused}")

    async def once() -> dict[str, Any]:
        try:
            result = await sender.send(
                Outgoing(
                    url=url, secret=secret, body=body, event_id=0, delivery_id=None, attempt=1
                ),
                timestamp=int(clock.now()),
            )
        finally:
            await sender.close()
        return {
            "delivered": result.delivered,
            "status": result.status,
            "error": None if result.delivered else result.describe(),
            "event_id": 0,
        }

    return asyncio.run(once())


def cell_text(value: Any) -> str:
    """A table cell as people read it: a list as its items, a flag as yes or no."""
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, list):
        return ", ".join(str(item) for item in value) or "-"
    return dash(value)


def _table(rows: list[dict[str, Any]], columns: list[str]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(*columns)
    for row in rows:
        table.add_row(*(cell_text(row.get(c)) for c in columns))
    Console(markup=False).print(table)


def register(app: typer.Typer) -> None:
    notify = typer.Typer(help="Webhook notifications.", no_args_is_help=True)
    app.add_typer(notify, name="notify")

    @notify.command("test")
    def test_command(
        subscription: Annotated[
            int | None,
            typer.Option(
                "--subscription", help="a stored subscription's id (sent by the API)", min=1
            ),
        ] = None,
        url: Annotated[str | None, typer.Option("--url", help="send to this URL from here")] = None,
        secret_file: Annotated[
            Path | None, typer.Option("--secret-file", help="the signing secret, for --url")
        ] = None,
        fmt: Annotated[str, typer.Option("--format", help="json or slack, for --url")] = "json",
        api: ApiOption = DEFAULT_API,
        as_json: JsonOption = False,
    ) -> None:
        """Send a sample notification (a trip, event id 0) and print the outcome."""
        if (subscription is None) == (url is None):
            raise fail(COMMAND, "give either --subscription ID or --url URL --secret-file FILE")
        if url is not None and secret_file is None:
            raise fail(COMMAND, "--url needs --secret-file FILE (the signing secret)")
        with reporting(COMMAND):
            if subscription is not None:
                with open_client(api) as client:
                    outcome = client.test_subscription(subscription)
            else:
                assert url is not None and secret_file is not None
                outcome = send_sample(url, read_secret(secret_file), fmt)
        if as_json:
            print_json(outcome)
        if not outcome.get("delivered"):
            raise fail(
                COMMAND, f"not delivered: {outcome.get('error') or 'no answer'}", EXIT_REFUSED
            )
        if not as_json:
            typer.echo(f"delivered: the receiver answered HTTP {outcome.get('status')}")

    @notify.command("add")
    def add_command(
        name: Annotated[str, typer.Option("--name", help="what the subscription is called")],
        url: Annotated[str, typer.Option("--url", help="the receiver's URL (https, or a host "
                                         "CANARY_NOTIFY_ALLOW admits)")],
        service: Annotated[
            str | None, typer.Option("--service", help="only this service's events "
                                     "(default: every service)")
        ] = None,
        kinds: Annotated[
            list[str] | None,
            typer.Option("--kind", help="an event kind or topic to send, repeatable "
                         "(default: every announced kind)"),
        ] = None,
        fmt: Annotated[str, typer.Option("--format", help="json or slack")] = "json",
        secret_file: Annotated[
            Path | None, typer.Option("--secret-file", help="the signing secret (default: "
                                      "the API makes one and prints it once)")
        ] = None,
        disabled: Annotated[
            bool, typer.Option("--disabled", help="store it without sending yet")
        ] = False,
        api: ApiOption = DEFAULT_API,
        as_json: JsonOption = False,
    ) -> None:
        """Subscribe a webhook to experiment events (admins); prints its secret once."""
        body: dict[str, Any] = {"name": name, "url": url, "format": fmt,
                                "enabled": not disabled, "kinds": list(kinds or [])}
        if service is not None:
            body["service"] = service
        with reporting("canary notify add"):
            if secret_file is not None:
                body["secret"] = read_secret(secret_file)
            with open_client(api) as client:
                created = client.create_subscription(body)
        if as_json:
            print_json(created)
            return
        typer.echo(f"subscription {created.get('id')} {created.get('name')!s} -> "
                   f"{created.get('url')} ({created.get('format')}, "
                   f"{'enabled' if created.get('enabled') else 'disabled'})")
        if secret_file is None:
            typer.echo(f"signing secret (shown once, keep it with the receiver): "
                       f"{created.get('secret')}")
        typer.echo(f"try it: canary notify test --subscription {created.get('id')}")

    def list_subscriptions(api: str, as_json: bool, command: str) -> None:
        with reporting(command), open_client(api) as client:
            page = client.list_subscriptions()
        if as_json:
            print_json(page)
            return
        _table(page.get("items", []),
               ["id", "name", "url", "service", "kinds", "format", "enabled"])

    @notify.command("list")
    def list_command(api: ApiOption = DEFAULT_API, as_json: JsonOption = False) -> None:
        """The webhook subscriptions (admins; never their secrets)."""
        list_subscriptions(api, as_json, "canary notify list")

    @notify.command("subscriptions", hidden=True)
    def subscriptions_command(api: ApiOption = DEFAULT_API, as_json: JsonOption = False) -> None:
        """The webhook subscriptions (the former name of `list`)."""
        list_subscriptions(api, as_json, "canary notify subscriptions")

    @notify.command("rm")
    def rm_command(
        subscription: Annotated[int, typer.Argument(metavar="ID", help="the subscription's id",
                                                    min=1, show_default=False)],
        api: ApiOption = DEFAULT_API,
    ) -> None:
        """Delete a subscription (admins): no more deliveries to it."""
        with reporting("canary notify rm"), open_client(api) as client:
            client.delete_subscription(subscription)
        typer.echo(f"subscription {subscription} deleted")

    @notify.command("deliveries")
    def deliveries_command(
        experiment: Annotated[int | None, typer.Option("--experiment", min=1)] = None,
        status: Annotated[
            str | None, typer.Option("--status", help="pending, delivered or failed")
        ] = None,
        limit: Annotated[int, typer.Option("--limit", min=1, max=500)] = 50,
        api: ApiOption = DEFAULT_API,
        as_json: JsonOption = False,
    ) -> None:
        """Deliveries, newest first: where each event went and what came of it."""
        with reporting("canary notify deliveries"), open_client(api) as client:
            page = client.deliveries(experiment=experiment, status=status, limit=limit)
        if as_json:
            print_json(page)
            return
        _table(
            page.get("items", []),
            [
                "id",
                "experiment_id",
                "kind",
                "subscription_name",
                "status",
                "attempts",
                "last_status",
                "last_error",
            ],
        )
