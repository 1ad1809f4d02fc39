"""`canary rules …`: a service's breaker rule (architecture §6) through the REST API."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer

from controlplane.cli.remote import (
    DEFAULT_API,
    ApiOption,
    JsonOption,
    dash,
    open_client,
    print_json,
    reporting,
)

ServiceArgument = Annotated[str, typer.Argument(help="service name", show_default=False)]


def field_table(rule: dict[str, Any], title: str | None = None) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table.grid(padding=(0, 2))
    table.add_column(style="bold")
    table.add_column()
    for key, value in rule.items():
        # nested numbers (a recommendation's evidence) stay readable as JSON
        shown = json.dumps(value) if isinstance(value, dict | list) else dash(value)
        table.add_row(key, shown)
    console = Console(markup=False)
    if title:
        console.print(title)
    console.print(table)


def register(app: typer.Typer) -> None:
    rules = typer.Typer(
        name="rules",
        help="Apply and inspect services' breaker rules through the REST API.",
        no_args_is_help=True,
    )

    @rules.command("apply")
    def apply_command(
        file: Annotated[
            Path, typer.Option("--file", "-f", help="rule as YAML or JSON", show_default=False)
        ],
        service: Annotated[
            str | None, typer.Option(help="the service, when the file does not name it")
        ] = None,
        api: ApiOption = DEFAULT_API,
        as_json: JsonOption = False,
    ) -> None:
        """Apply the rule in a file to the service it names (see deploy/examples/rule.yaml)."""
        from controlplane.client.api_client import ClientError
        from controlplane.client.files import api_errors_to_file, load_rule

        with reporting("canary rules apply"):
            source, body = load_rule(file, service=service)
            target = str(body["service"])
            with open_client(api) as client:
                try:
                    applied = client.put_rule(target, body)
                except ClientError as exc:
                    if exc.status == 422 and exc.errors:
                        raise api_errors_to_file(source, exc.errors) from exc
                    raise
        if as_json:
            print_json(applied)
        else:
            typer.echo(f"applied the breaker rule of {target}")

    @rules.command("show")
    def show_command(
        service: ServiceArgument, api: ApiOption = DEFAULT_API, as_json: JsonOption = False
    ) -> None:
        """Show a service's breaker rule."""
        with reporting("canary rules show"), open_client(api) as client:
            rule = client.get_rule(service)
        if as_json:
            print_json(rule)
        else:
            field_table(rule)

    @rules.command("recommend")
    def recommend_command(
        service: ServiceArgument, api: ApiOption = DEFAULT_API, as_json: JsonOption = False
    ) -> None:
        """Propose a threshold_ms from the baseline's recent latency, with its numbers."""
        with reporting("canary rules recommend"), open_client(api) as client:
            recommendation = client.recommend_rule(service)
        if as_json:
            print_json(recommendation)
        else:
            field_table(recommendation, title=f"recommendation for {service}")

    app.add_typer(rules, name="rules")
