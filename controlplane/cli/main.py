"""`canary` — the one console script (architecture §10).

Each command group lives in its own module with a `register(app)` function and
imports its heavy dependencies inside the commands, so `canary --help` stays fast.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, Any, cast

import typer

from controlplane.cli import (
    bench,
    collector,
    demo,
    experiments,
    inject,
    judge,
    notify,
    overload,
    remote,
    router,
    rules,
    server,
    services,
    sidecar,
    tokens,
)

app = typer.Typer(
    name="canary",
    help="Canary releases and A/B experiments with circuit breaking.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)


@app.callback()
def root(
    ctx: typer.Context,
    token_file: Annotated[
        Path | None,
        typer.Option(
            "--token-file",
            help="file holding the API token (else CANARY_TOKEN, else CANARY_TOKEN_FILE, "
            "else the config's token_file, else ~/.config/canary/token)",
        ),
    ] = None,
    ca_file: Annotated[
        str | None,
        typer.Option(
            "--ca-file",
            help="CA file the client trusts for an https:// API [env CANARY_CA_FILE, else "
            "the config's ca_file]",
        ),
    ] = None,
) -> None:
    """Canary releases and A/B experiments with circuit breaking.

    Settings for the commands that talk to the API may also come from a config file
    (TOML: api, token_file, ca_file), ~/.config/canary/config.toml or $CANARY_CONFIG."""
    import os

    from controlplane.client.config import CliConfig, load_config
    from controlplane.kernel.errors import ConfigError

    try:
        config, remote.config_error = load_config(), None
    except ConfigError as exc:
        # only the commands that talk to the API read it: they refuse with this error
        config, remote.config_error = CliConfig(), exc
    remote.token_file = token_file
    remote.ca_file = ca_file or (None if os.environ.get("CANARY_CA_FILE") else config.ca_file)
    remote.config_token_file = config.token_file
    if config.api is not None:
        # below --api and CANARY_API: click reads a default_map after the environment
        ctx.default_map = api_defaults(ctx.command, config.api)


def api_defaults(command: Any, api: str) -> dict[str, Any]:
    """A default_map giving `api` to every command below `command` that has --api."""
    found: dict[str, Any] = {}
    if any(param.name == "api" for param in command.params):
        found["api"] = api
    for name, sub in (getattr(command, "commands", None) or {}).items():
        below = api_defaults(sub, api)
        if below:
            found[name] = below
    return found


for module in (bench, collector, demo, experiments, inject, judge, notify, overload, router, rules,
               server, services, sidecar, tokens):
    module.register(app)


# Typer ≥ 0.20 carries its own copy of click and older ones use click itself: take the
# exception classes from whichever copy typer raises, through its public BadParameter.
_UsageError = cast(type[Exception], typer.BadParameter.__base__)
_ClickException = cast(type[Exception], _UsageError.__base__)


def main(argv: list[str] | None = None) -> int:
    """Run a command; the exit code. A usage error (unknown command or option, a missing
    or malformed value) is one line on stderr and exit code 2, not a framed panel."""
    try:
        result = app(args=argv, prog_name="canary", standalone_mode=False)
    except _ClickException as exc:
        ctx = getattr(exc, "ctx", None)
        code = int(getattr(exc, "exit_code", 1))
        if type(exc).__name__ == "NoArgsIsHelpError" and ctx is not None:
            print(ctx.get_help())  # `canary` alone, or a group without a command
            return 0
        message = str(exc.format_message()).rstrip(".")  # type: ignore[attr-defined]
        if isinstance(exc, _UsageError):
            command = ctx.command_path if ctx is not None else "canary"
            print(f"{command}: {message} (see '{command} --help')", file=sys.stderr)
        else:
            print(f"canary: {message}", file=sys.stderr)
        return code
    except typer.Abort:
        print("canary: aborted", file=sys.stderr)
        return 1
    return result if isinstance(result, int) else 0


def run() -> None:
    """The console script."""
    sys.exit(main())


if __name__ == "__main__":
    run()
