"""What the commands that talk to the REST API share: `--api`, `--json`, exit codes.

Exit codes, so scripts and CI pipelines can tell outcomes apart:

    0  done
    1  the API refused the change (409: illegal transition, one running per service),
       refused the caller (401: no or a bad token, 403: a role too low), or failed (5xx)
    2  usage or input error: a bad file, an invalid body (422), an unknown id (404),
       an API that cannot be reached

Every error is one line on stderr, prefixed with the command that failed.
"""

from __future__ import annotations

import json
import ssl
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from controlplane.kernel.errors import CanaryError
from controlplane.kernel.settings import Settings

if TYPE_CHECKING:
    from controlplane.client.api_client import CanaryClient

EXIT_REFUSED = 1
EXIT_USAGE = 2

# The default stays readable in --help; CANARY_API overrides it, --api overrides both.
ApiOption = Annotated[
    str,
    typer.Option(
        "--api",
        envvar="CANARY_API",
        help="base URL of the canary API",
        show_envvar=True,
    ),
]
DEFAULT_API: str = Settings.model_fields["api"].default
JsonOption = Annotated[bool, typer.Option("--json", help="print JSON instead of a table")]


# `canary --token-file F …` and `canary --ca-file F …`, set by the root command
# before any subcommand runs, and the config file's token file
token_file: Path | None = None
ca_file: str | None = None
config_token_file: Path | None = None
config_error: CanaryError | None = None  # the config file could not be read


def client_tls(settings: Settings, *, ca_file: str | None = None) -> ssl.SSLContext | None:
    """The client's TLS context from --ca-file / CANARY_CA_FILE and CANARY_CLIENT_CERT /
    CANARY_CLIENT_KEY (mTLS); None: the system's CAs and no client certificate."""
    from controlplane.kernel.tls import client_context

    ca = ca_file or settings.ca_file
    if not (ca or settings.client_cert or settings.client_key):
        return None
    return client_context(ca_file=ca, cert_file=settings.client_cert,
                          key_file=settings.client_key, what="API TLS")


def open_client(api: str) -> CanaryClient:
    from controlplane.client.api_client import CanaryClient
    from controlplane.client.credentials import find_token

    if config_error is not None:
        raise config_error
    return CanaryClient(
        api, token=find_token(token_file, config_token_file=config_token_file),
        tls=client_tls(Settings(), ca_file=ca_file),
    )


def exit_code_for(error: CanaryError) -> int:
    from controlplane.client.api_client import ClientError

    if isinstance(error, ClientError) and (error.status in (401, 403, 409) or error.status >= 500):
        return EXIT_REFUSED
    return EXIT_USAGE


def fail(command: str, message: str, code: int = EXIT_USAGE) -> typer.Exit:
    # one line even when a message carries newlines (e.g. a server's text body)
    typer.echo(f"{command}: {' '.join(message.split())}", err=True)
    return typer.Exit(code)


@contextmanager
def reporting(command: str, *, exit_code: int | None = None) -> Iterator[None]:
    """Turn any product error inside the block into one stderr line and an exit code.

    exit_code: one code for every error, for commands whose other codes mean
        something else (`exp wait`: 1 is a rolled-back experiment, not an API error).
    """
    try:
        yield
    except CanaryError as exc:
        code = exit_code if exit_code is not None else exit_code_for(exc)
        message = str(exc)
        if getattr(exc, "status", None) == 401:
            message += (" (give a token: CANARY_TOKEN, --token-file, CANARY_TOKEN_FILE or "
                        "~/.config/canary/token)")
        raise fail(command, message, code) from None


def print_json(value: Any) -> None:
    typer.echo(json.dumps(value, indent=2, sort_keys=True, default=str))


def dash(value: Any) -> str:
    return "-" if value is None or value == "" else str(value)
