"""`canary collector`: consume sample streams, publish window snapshots."""

from __future__ import annotations

from typing import Annotated

import typer


def register(app: typer.Typer) -> None:
    @app.command("collector")
    def collector_command(
        redis: Annotated[str | None, typer.Option("--redis", help="redis://… or memory://")] = None,
        etcd: Annotated[
            str | None, typer.Option("--etcd", help="host:port[,…] or memory://")
        ] = None,
        etcd_prefix: Annotated[str | None, typer.Option("--etcd-prefix")] = None,
        namespace: Annotated[
            str | None, typer.Option("--redis-namespace", help="first segment of Redis keys")
        ] = None,
        admin: Annotated[
            str | None, typer.Option("--admin", help="HOST:PORT for /healthz, /readyz, /metrics")
        ] = None,
        name: Annotated[
            str | None, typer.Option("--name", help="consumer name (default: unique per process)")
        ] = None,
        tick: Annotated[float, typer.Option("--tick", help="seconds between publishes")] = 0.1,
        claim_idle_ms: Annotated[
            int, typer.Option("--claim-idle-ms", help="claim others' entries idle this long")
        ] = 30_000,
        count: Annotated[int, typer.Option("--count", help="entries per read")] = 200,
    ) -> None:
        """Read sample batches (consumer group `collectors`) and publish snapshots."""
        from controlplane.collector.main import main
        from controlplane.kernel.settings import Settings

        overrides = {
            key: value
            for key, value in {
                "redis_url": redis,
                "etcd": etcd,
                "etcd_prefix": etcd_prefix,
                "redis_namespace": namespace,
            }.items()
            if value is not None
        }
        settings = Settings.model_validate(overrides)
        main(settings, name=name, admin=admin, tick=tick, claim_idle_ms=claim_idle_ms, count=count)
