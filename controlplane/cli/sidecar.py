"""`canary sidecar --service S --listen HOST:PORT`: the reverse proxy next to a service.

Flags override the CANARY_* environment (kernel Settings). Only the kernel and the
sidecar package are imported: a sidecar never loads the API or the SQL layer.
"""

from __future__ import annotations

import errno
from typing import TYPE_CHECKING, Annotated

import typer

from controlplane.cli.observability import (
    LogFormatOption,
    OtelEndpointOption,
    SampleRatioOption,
    observability_settings,
)
from controlplane.kernel.errors import plain_message
from controlplane.kernel.etcd_endpoints import ENDPOINTS_HELP
from controlplane.kernel.streams_factory import URL_FORMS

if TYPE_CHECKING:
    from controlplane.kernel.dev_join import DevJoin
    from controlplane.kernel.settings import Settings

# the listener's address is taken, not this host's, or not ours to bind
_BIND_ERRORS = frozenset({errno.EADDRINUSE, errno.EADDRNOTAVAIL, errno.EACCES})


def _fail(message: str) -> typer.Exit:
    """One line on stderr and exit code 2, as for any bad flag."""
    typer.echo(f"canary sidecar: {message}", err=True)
    return typer.Exit(2)


def _positive(name: str, value: float | None) -> None:
    if value is not None and not value > 0:
        raise _fail(f"{name} must be a positive number of seconds, got {value}")


JoinOption = Annotated[
    str | None,
    typer.Option("--join", help="join a `canary dev` control plane: the join file it wrote "
                 "(sets --etcd, --etcd-prefix, --redis and --sample-keys-file)"),
]


def joined_backends(
    join: str, *, etcd: str | None, etcd_prefix: str | None, redis: str | None,
    sample_keys_file: str | None,
) -> DevJoin:
    """The join file's backends; a flag it would set, given as well, is a usage error
    (which one was meant cannot be told). Raises ConfigError."""
    from controlplane.kernel.dev_join import read_join
    from controlplane.kernel.errors import ConfigError

    both = [flag for flag, value in (("--etcd", etcd), ("--etcd-prefix", etcd_prefix),
                                     ("--redis", redis),
                                     ("--sample-keys-file", sample_keys_file))
            if value is not None]  # fmt: skip
    if both:
        raise ConfigError(f"--join sets {', '.join(both)}: give one or the other")
    joined = read_join(join)
    _still_there(join, joined)
    return joined


def _still_there(join: str, joined: DevJoin) -> None:
    """A `canary dev` that was killed leaves its join file: refuse it at once rather
    than retry a dead etcd forever behind 503s. The ports are this run's own, so a
    control plane that is gone never comes back on them."""
    import socket
    from urllib.parse import urlsplit

    from controlplane.kernel.errors import ConfigError
    from controlplane.kernel.settings import parse_host_port

    redis = urlsplit(joined.redis_url)
    for name, (host, port) in (("etcd", parse_host_port(joined.etcd)),
                               ("Redis", (redis.hostname or "", redis.port or 0))):
        try:
            socket.create_connection((host, port), timeout=1.0).close()
        except OSError:
            where = joined.etcd if name == "etcd" else joined.redis_url
            raise ConfigError(
                f"join file {join}: nothing answers at {name} {where}: is `canary dev` "
                "still running? (one killed leaves its join file behind)"
            ) from None


def _in_process_warnings(settings: Settings) -> list[str]:
    from controlplane.kernel.dev_join import in_process_backends, in_process_warning

    backends = in_process_backends(settings.etcd, settings.redis_url)
    return [in_process_warning("sidecar", backends)] if backends else []


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
            str | None, typer.Option("--etcd", help=ENDPOINTS_HELP + " (env CANARY_ETCD)")
        ] = None,
        etcd_prefix: Annotated[
            str | None, typer.Option("--etcd-prefix", help="key prefix (env CANARY_ETCD_PREFIX)")
        ] = None,
        redis: Annotated[
            str | None,
            typer.Option("--redis", help=f"{URL_FORMS} (env CANARY_REDIS_URL)"),
        ] = None,
        join: JoinOption = None,
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
        max_connections_per_client: Annotated[
            int | None,
            typer.Option(
                "--max-connections-per-client",
                envvar="CANARY_SIDECAR_MAX_CONNECTIONS_PER_CLIENT",
                help="client connections one address holds at once, TLS handshakes "
                "included; more are refused (default: a quarter of --max-connections, at "
                "most 512; 0: no cap, e.g. behind one NAT or ingress)",
            ),
        ] = None,
        client_ipv6_prefix: Annotated[
            int,
            typer.Option(
                "--client-ipv6-prefix",
                help="IPv6 clients are counted per network of this prefix length, 32-128 "
                "(default 128: per address; 64: per host's usual network)",
            ),
        ] = 128,
        max_headers: Annotated[
            int,
            typer.Option(
                "--max-headers",
                help="header fields in a request head, a chunked request's trailers or "
                "an HTTP/2 header block; more get 431 (default 100)",
            ),
        ] = 100,
        tls_handshake_timeout: Annotated[
            float | None,
            typer.Option(
                "--tls-handshake-timeout",
                help="seconds for a client's TLS handshake, from accept (default 10)",
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
        log_format: LogFormatOption = None,
        otel_endpoint: OtelEndpointOption = None,
        trace_sample_ratio: SampleRatioOption = None,
        workers: Annotated[
            int | None,
            typer.Option(
                "--workers",
                envvar="CANARY_SIDECAR_WORKERS",
                help="proxy processes sharing the port, under one supervisor that serves "
                "--admin (default: the CPUs available, affinity and cgroup quota; 1: one "
                "process, no supervisor)",
            ),
        ] = None,
    ) -> None:
        """Proxy a service: routes from etcd, samples to Redis, admin endpoints."""
        from pydantic import ValidationError

        from controlplane.kernel.admin_access import admin_token
        from controlplane.kernel.errors import ConfigError
        from controlplane.kernel.keys import is_service_name
        from controlplane.kernel.logs import configure_logging
        from controlplane.kernel.sample_keys import load_sample_keys
        from controlplane.kernel.settings import Settings, parse_host_port
        from sidecar.choice import Upstream
        from sidecar.main import (
            ClientBounds,
            Timeouts,
            listen_tls_context,
            run_loop,
            run_sidecar,
        )
        from sidecar.proxy.limits import (
            connection_capacity,
            default_max_connections,
            raise_fd_limit,
        )
        from sidecar.workers.cpus import available_cpus
        from sidecar.workers.policy import workers_error

        if not is_service_name(service):
            raise _fail(
                f"invalid service name {service!r}: lower-case letters, digits, '.', "
                "'_' or '-', 1-63 characters"
            )
        _positive("--connect-timeout", connect_timeout)
        _positive("--read-timeout", read_timeout)
        _positive("--head-timeout", head_timeout)
        cpus = available_cpus()
        workers = cpus if workers is None else workers
        if (problem := workers_error(workers, cpus)) is not None:
            raise _fail(problem)
        _positive("--tunnel-idle-timeout", tunnel_idle_timeout)
        _positive("--tls-handshake-timeout", tls_handshake_timeout)
        if max_connections_per_client is not None and max_connections_per_client < 0:
            raise _fail(
                f"--max-connections-per-client must be 0 (no cap) or more, got "
                f"{max_connections_per_client}"
            )
        if not 32 <= client_ipv6_prefix <= 128:
            raise _fail(
                f"--client-ipv6-prefix must be between 32 and 128, got {client_ipv6_prefix}"
            )
        if not 1 <= max_headers <= 10_000:
            raise _fail(f"--max-headers must be between 1 and 10000, got {max_headers}")
        bounds = ClientBounds(
            max_connections_per_client=max_connections_per_client,
            ipv6_prefix=client_ipv6_prefix,
            max_headers=max_headers,
        )
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
            if join is not None:
                joined = joined_backends(join, etcd=etcd, etcd_prefix=etcd_prefix, redis=redis,
                                         sample_keys_file=sample_keys_file)
                overrides.update(joined.settings())
                sample_keys_file = joined.sample_keys_file
            given = {k: v for k, v in overrides.items() if v is not None}
            given.update(observability_settings(log_format, otel_endpoint, trace_sample_ratio))
            settings = Settings.model_validate(given)
            token = admin_token(settings.admin_token_file)  # an unreadable file fails here
            listen_at = parse_host_port(listen)
            admin_at = parse_host_port(admin) if admin else None
            if default_upstream:
                Upstream.parse(default_upstream)
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(part) for part in first["loc"])
            raise _fail(f"{where}: {plain_message(first['msg'])}") from exc
        except (ConfigError, ValueError) as exc:
            raise _fail(str(exc)) from exc
        try:
            sample_keys = load_sample_keys(sample_keys_file)
            listen_tls = listen_tls_context(tls_cert, tls_key)
        except ConfigError as exc:
            raise _fail(str(exc)) from exc

        configure_logging(settings.log_level, settings.log_format)
        defaults = Timeouts()
        timeouts = Timeouts(
            connect=connect_timeout or defaults.connect,
            read=read_timeout or defaults.read,
            head=head_timeout or defaults.head,
            tunnel_idle=tunnel_idle_timeout or defaults.tunnel_idle,
            tls_handshake=tls_handshake_timeout or defaults.tls_handshake,
        )
        if workers > 1:
            from sidecar.workers.listeners import platform_mode, reserve
            from sidecar.workers.rundir import make_socket_dir
            from sidecar.workers.spec import WorkerSpec
            from sidecar.workers.supervisor import run_supervisor

            try:
                socket_dir = make_socket_dir()
            except ConfigError as exc:
                raise _fail(str(exc)) from exc
            try:  # before any worker starts: a port in use is a one-line error
                listener = reserve(*listen_at, platform_mode())
            except OSError as exc:
                socket_dir.rmdir()
                raise _fail(f"cannot listen on {listen}: {exc.strerror or exc}") from exc
            spec = WorkerSpec(
                index=0, service=service, host=listen_at[0], port=listener.port,
                admin_socket="-", settings=given, default_upstream=default_upstream,
                force_header_enabled=allow_force, connect_timeout=timeouts.connect,
                read_timeout=timeouts.read, head_timeout=timeouts.head,
                max_connections=max_connections, max_tunnels=max_tunnels,
                tunnel_idle_timeout=timeouts.tunnel_idle, sample_keys_file=sample_keys_file,
                tls_cert=tls_cert, tls_key=tls_key,
                tls_handshake_timeout=timeouts.tls_handshake,
                max_connections_per_client=max_connections_per_client,
                client_ipv6_prefix=client_ipv6_prefix, max_headers=max_headers,
            )  # fmt: skip
            code = run_loop(
                run_supervisor(
                    spec=spec, workers=workers, listener=listener, socket_dir=socket_dir,
                    admin=admin_at, admin_token=token,
                    warnings=_in_process_warnings(settings),  # each worker logs it
                )
            )  # fmt: skip
            raise typer.Exit(code)
        try:
            run_loop(
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
                    bounds=bounds,
                    sample_keys=sample_keys,
                    listen_tls=listen_tls,
                )
            )
        except OSError as exc:
            if exc.errno not in _BIND_ERRORS:
                raise
            # asyncio's message names the address (the proxy's or the admin's)
            raise _fail(f"cannot listen: {exc}") from None
