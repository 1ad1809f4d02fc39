"""`canary sidecar --service S --listen HOST:PORT`: the reverse proxy next to a service.

Flags override the CANARY_* environment (kernel Settings). Only the kernel and the
sidecar package are imported: a sidecar never loads the API or the SQL layer.
"""

from __future__ import annotations

import logging
import ssl
from collections.abc import Coroutine
from typing import Annotated, Any

import typer


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
            typer.Option("--admin", help="[HOST]:PORT for /healthz, /readyz, /metrics "
                         "(host 127.0.0.1)"),
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
        head_timeout: Annotated[
            float | None,
            typer.Option(
                "--head-timeout", help="seconds for a client's request head to arrive (408)"
            ),
        ] = None,
        max_connections: Annotated[
            int | None,
            typer.Option(
                "--max-connections",
                envvar="CANARY_SIDECAR_MAX_CONNECTIONS",
                help="client connections held at once, more get 503 "
                "(default: 10000, less if the descriptor limit is lower)",
            ),
        ] = None,
        tunnel_idle_timeout: Annotated[
            float | None,
            typer.Option(
                "--tunnel-idle-timeout",
                help="seconds without a byte either way before an upgraded connection "
                "(WebSocket) is cut (default 300)",
            ),
        ] = None,
        max_tunnels: Annotated[
            int | None,
            typer.Option(
                "--max-tunnels",
                envvar="CANARY_SIDECAR_MAX_TUNNELS",
                help="upgraded connections (WebSocket) open at once, counted within "
                "--max-connections; more get 503 (default: half of --max-connections)",
            ),
        ] = None,
        # sample authentication (decision 0009)
        sample_keys_file: Annotated[
            str | None,
            typer.Option(
                "--sample-keys-file",
                help="kid:secret lines; batches are signed with the first key "
                "[env CANARY_SAMPLE_KEYS_FILE, or the keys in CANARY_SAMPLE_KEYS]",
            ),
        ] = None,
        admin_token_file: Annotated[
            str | None,
            typer.Option("--admin-token-file", help="bearer token for /metrics "
                         "(env CANARY_ADMIN_TOKEN_FILE)"),
        ] = None,
        # the listener's TLS (decision 0011)
        tls_cert: Annotated[
            str | None,
            typer.Option("--tls-cert", help="serve clients over HTTPS with this certificate "
                         "chain (PEM) [env CANARY_SIDECAR_TLS_CERT]",
                         envvar="CANARY_SIDECAR_TLS_CERT"),
        ] = None,
        tls_key: Annotated[
            str | None,
            typer.Option("--tls-key", help="the certificate's private key (PEM) "
                         "[env CANARY_SIDECAR_TLS_KEY]", envvar="CANARY_SIDECAR_TLS_KEY"),
        ] = None,
    ) -> None:
        """Proxy a service: routes from etcd, samples to Redis, admin endpoints."""
        from pydantic import ValidationError

        from controlplane.kernel.admin_access import admin_token
        from controlplane.kernel.errors import ConfigError
        from controlplane.kernel.keys import is_service_name
        from controlplane.kernel.sample_keys import load_sample_keys
        from controlplane.kernel.settings import Settings, parse_host_port
        from sidecar.choice import Upstream
        from sidecar.main import Timeouts, run_sidecar
        from sidecar.proxy.limits import (
            connection_capacity,
            default_max_connections,
            raise_fd_limit,
        )

        if not is_service_name(service):
            raise _fail(
                f"invalid service name {service!r}: lower-case letters, digits, '.', "
                "'_' or '-', 1-63 characters"
            )
        _positive("--connect-timeout", connect_timeout)
        _positive("--read-timeout", read_timeout)
        _positive("--head-timeout", head_timeout)
        _positive("--tunnel-idle-timeout", tunnel_idle_timeout)
        if max_connections is not None:
            capacity = connection_capacity(raise_fd_limit())
            if not 1 <= max_connections <= capacity:
                raise _fail(
                    f"--max-connections must be between 1 and {capacity} (what the "
                    f"descriptor limit carries), got {max_connections}"
                )
        if max_tunnels is not None:
            ceiling = (
                max_connections
                if max_connections is not None
                else default_max_connections(raise_fd_limit())
            )
            if not 1 <= max_tunnels <= ceiling:
                raise _fail(
                    f"--max-tunnels must be between 1 and {ceiling} (--max-connections), "
                    f"got {max_tunnels}"
                )
        overrides = {"etcd": etcd, "etcd_prefix": etcd_prefix, "redis_url": redis,
                     "admin_token_file": admin_token_file}
        try:
            given = {k: v for k, v in overrides.items() if v is not None}
            settings = Settings.model_validate(given)
            admin_token(settings.admin_token_file)  # an unreadable file fails here
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
        try:
            sample_keys = load_sample_keys(sample_keys_file)
            listen_tls = _listen_tls(tls_cert, tls_key)
        except ConfigError as exc:
            raise _fail(str(exc)) from exc

        logging.basicConfig(
            level=settings.log_level.upper(),
            format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        )
        defaults = Timeouts()
        timeouts = Timeouts(
            connect=connect_timeout or defaults.connect,
            read=read_timeout or defaults.read,
            head=head_timeout or defaults.head,
            tunnel_idle=tunnel_idle_timeout or defaults.tunnel_idle,
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
                max_connections=max_connections,
                max_tunnels=max_tunnels,
                sample_keys=sample_keys,
                listen_tls=listen_tls,
            )
        )


def _listen_tls(cert: str | None, key: str | None) -> ssl.SSLContext | None:
    """The listener's TLS context, or None for plain HTTP; both files or neither."""
    from controlplane.kernel.errors import ConfigError
    from controlplane.kernel.tls import server_context

    if cert is None and key is None:
        return None
    if cert is None or key is None:
        raise ConfigError("--tls-cert and --tls-key go together")
    return server_context(cert_file=cert, key_file=key, what="sidecar TLS")


def _run_loop(main: Coroutine[Any, Any, None]) -> None:
    """Run on uvloop when it is installed: the proxy is faster on it."""
    try:
        import uvloop
    except ImportError:
        import asyncio

        asyncio.run(main)
        return
    uvloop.run(main)
