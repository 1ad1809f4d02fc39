"""`canary sidecar --service S --listen HOST:PORT`: the reverse proxy next to a service.

Flags override the CANARY_* environment (kernel Settings). Only the kernel and the
sidecar package are imported: a sidecar never loads the API or the SQL layer.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Coroutine
from typing import Annotated, Any

import typer

_SERVICE = re.compile(r"^[a-z0-9]([a-z0-9._-]{0,62})$")


def _fail(message: str) -> typer.Exit:
    """One line on stderr and exit code 2, as for any bad flag."""
    typer.echo(f"canary sidecar: {message}", err=True)
    return typer.Exit(2)


def _positive(name: str, value: float | None) -> None:
    if value is not None and not value > 0:
        raise _fail(f"{name} must be a positive number of seconds, got {value}")


def register(app: typer.Typer) -> None:
    @app.command("sidecar")
    def sidecar_command(
        service: Annotated[str, typer.Option("--service", help="the service this sidecar fronts")],
        listen: Annotated[str, typer.Option("--listen", help="HOST:PORT the proxy serves on")],
        admin: Annotated[
            str | None,
            typer.Option("--admin", help="HOST:PORT for /healthz, /readyz and /metrics"),
        ] = None,
        etcd: Annotated[
            str | None, typer.Option("--etcd", help="host:port[,…] or memory:// (env CANARY_ETCD)")
        ] = None,
        etcd_prefix: Annotated[
            str | None, typer.Option("--etcd-prefix", help="key prefix (env CANARY_ETCD_PREFIX)")
        ] = None,
        redis: Annotated[
            str | None,
            typer.Option("--redis", help="redis://… or memory:// (env CANARY_REDIS_URL)"),
        ] = None,
        default_upstream: Annotated[
            str | None,
            typer.Option("--default-upstream", help="URL served while no route is in force"),
        ] = None,
        allow_force: Annotated[
            bool, typer.Option("--allow-force", help="honour X-Canary-Force: <variant>")
        ] = False,
        connect_timeout: Annotated[
            float | None, typer.Option("--connect-timeout", help="seconds to connect upstream")
        ] = None,
        read_timeout: Annotated[
            float | None,
            typer.Option("--read-timeout", help="seconds of upstream silence before a 504"),
        ] = None,
    ) -> None:
        """Proxy a service: routes from etcd, samples to Redis, admin endpoints."""
        from pydantic import ValidationError

        from controlplane.kernel.errors import ConfigError
        from controlplane.kernel.settings import Settings, parse_host_port
        from sidecar.choice import Upstream
        from sidecar.main import Timeouts, run_sidecar

        if not _SERVICE.match(service):
            raise _fail(
                f"invalid service name {service!r}: lower-case letters, digits, '.', "
                "'_' or '-', 1-63 characters"
            )
        _positive("--connect-timeout", connect_timeout)
        _positive("--read-timeout", read_timeout)
        overrides = {"etcd": etcd, "etcd_prefix": etcd_prefix, "redis_url": redis}
        try:
            given = {k: v for k, v in overrides.items() if v is not None}
            settings = Settings.model_validate(given)
            listen_at = parse_host_port(listen)
            admin_at = parse_host_port(admin) if admin else None
            if default_upstream:
                Upstream.parse(default_upstream)
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(part) for part in first["loc"])
            raise _fail(f"{where}: {first['msg']}") from exc
        except (ConfigError, ValueError) as exc:
            raise _fail(str(exc)) from exc

        logging.basicConfig(
            level=settings.log_level.upper(),
            format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        )
        defaults = Timeouts()
        timeouts = Timeouts(
            connect=connect_timeout or defaults.connect, read=read_timeout or defaults.read
        )
        _run_loop(
            run_sidecar(
                settings,
                service=service,
                listen=listen_at,
                admin=admin_at,
                default_upstream=default_upstream,
                force_header_enabled=allow_force,
                timeouts=timeouts,
            )
        )


def _run_loop(main: Coroutine[Any, Any, None]) -> None:
    """Run on uvloop when it is installed: the proxy is faster on it."""
    try:
        import uvloop
    except ImportError:
        import asyncio

        asyncio.run(main)
        return
    uvloop.run(main)
