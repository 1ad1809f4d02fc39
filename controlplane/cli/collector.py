"""`canary collector`: consume sample streams, publish window snapshots."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

import typer

from controlplane.cli.observability import (
    LivenessBoundOption,
    LogFormatOption,
    observability_settings,
)
from controlplane.collector.pacing import MAX_PUBLISH_EVERY_SEC, PUBLISH_EVERY_SEC
from controlplane.kernel.errors import plain_message
from controlplane.kernel.etcd_endpoints import ENDPOINTS_HELP
from controlplane.kernel.streams_factory import URL_FORMS

if TYPE_CHECKING:
    from controlplane.kernel.sample_keys import SampleKeys


def register(app: typer.Typer) -> None:
    @app.command("collector")
    def collector_command(
        redis: Annotated[
            str | None, typer.Option("--redis", help=f"{URL_FORMS} [env CANARY_REDIS_URL]")
        ] = None,
        etcd: Annotated[
            str | None, typer.Option("--etcd", help=ENDPOINTS_HELP)
        ] = None,
        etcd_prefix: Annotated[str | None, typer.Option("--etcd-prefix")] = None,
        namespace: Annotated[
            str | None, typer.Option("--redis-namespace", help="first segment of Redis keys")
        ] = None,
        admin: Annotated[
            str | None,
            typer.Option("--admin", help="[HOST]:PORT for /healthz, /readyz, /metrics "
                         "(host 127.0.0.1)"),
        ] = None,
        name: Annotated[
            str | None, typer.Option("--name", help="consumer name (default: unique per process)")
        ] = None,
        tick: Annotated[float, typer.Option("--tick", help="seconds between publishes")] = 0.1,
        publish_every: Annotated[
            float,
            typer.Option(
                "--publish-every",
                help="publish a changed experiment at most this often, in seconds (0: at "
                "every tick); one whose canary just turned worse goes out at once",
                min=0.0, max=MAX_PUBLISH_EVERY_SEC,
            ),
        ] = PUBLISH_EVERY_SEC,
        claim_idle_ms: Annotated[
            int, typer.Option("--claim-idle-ms", help="claim others' entries idle this long")
        ] = 30_000,
        count: Annotated[int, typer.Option("--count", help="entries per read")] = 200,
        # sample authentication (decision 0009)
        sample_keys_file: Annotated[
            str | None,
            typer.Option(
                "--sample-keys-file",
                help="kid:secret lines; refuse batches not signed with one of them "
                "[env CANARY_SAMPLE_KEYS_FILE, or the keys in CANARY_SAMPLE_KEYS]",
            ),
        ] = None,
        admin_token_file: Annotated[
            str | None,
            typer.Option("--admin-token-file", help="bearer token for /metrics "
                         "(env CANARY_ADMIN_TOKEN_FILE)"),
        ] = None,
        liveness_bound: LivenessBoundOption = 30.0,
        log_format: LogFormatOption = None,
    ) -> None:
        """Read sample batches (consumer group `collectors`) and publish snapshots."""
        from pydantic import ValidationError

        from controlplane.collector.main import main
        from controlplane.kernel.settings import Settings

        overrides = {
            key: value
            for key, value in {
                "redis_url": redis,
                "etcd": etcd,
                "etcd_prefix": etcd_prefix,
                "redis_namespace": namespace,
                "admin_token_file": admin_token_file,
            }.items()
            if value is not None
        }
        overrides.update(observability_settings(log_format))
        try:
            settings = Settings.model_validate(overrides)
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(part) for part in first["loc"])
            typer.echo(f"canary collector: {where}: {plain_message(first['msg'])}", err=True)
            raise typer.Exit(2) from exc
        sample_keys = _sample_keys_or_exit(sample_keys_file)
        main(
            settings, name=name, admin=admin, tick=tick, claim_idle_ms=claim_idle_ms,
            count=count, sample_keys=sample_keys, liveness_bound=liveness_bound,
            publish_every=publish_every,
        )  # fmt: skip


def _sample_keys_or_exit(path: str | None) -> SampleKeys | None:
    """The configured sample keys, or one line on stderr and exit code 2."""
    from controlplane.kernel.errors import ConfigError
    from controlplane.kernel.sample_keys import load_sample_keys

    try:
        return load_sample_keys(path)
    except ConfigError as exc:
        typer.echo(f"canary collector: {exc}", err=True)
        raise typer.Exit(2) from exc
