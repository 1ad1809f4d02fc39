"""`canary rules …`: a service's breaker rule (architecture §6) through the REST API."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from controlplane.cli.remote import (
    DEFAULT_API,
    ApiOption,
    JsonOption,
    open_client,
    print_json,
    reporting,
)
from controlplane.cli.service_files import (
    ServiceArgument,
    ServiceOption,
    apply_service_file,
    field_table,
)


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
        service: ServiceOption = None,
        api: ApiOption = DEFAULT_API,
        as_json: JsonOption = False,
    ) -> None:
        """Apply the rule in a file to the service it names (see deploy/examples/rule.yaml)."""
        from controlplane.client.files import load_rule

        apply_service_file(
            "canary rules apply",
            file,
            service,
            api,
            load=load_rule,
            put=lambda client, target, body: client.put_rule(target, body),
            what="breaker rule",
            as_json=as_json,
        )

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
