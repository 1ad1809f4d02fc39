"""`canary dev`, `canary serve` and `canary db upgrade|downgrade|current`.

Heavy imports (FastAPI, SQLAlchemy, Alembic, uvicorn) happen inside the commands so
`canary --help` stays fast.
"""

from __future__ import annotations

import contextlib
import logging
import signal
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from controlplane.cli.observability import (
    LivenessBoundOption,
    LogFormatOption,
    OtelEndpointOption,
    SampleRatioOption,
    observability_settings,
)
from controlplane.kernel.errors import plain_message
from controlplane.kernel.etcd_endpoints import ENDPOINTS_HELP
from controlplane.kernel.streams_factory import URL_FORMS

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import TracerProvider

    from controlplane.kernel.sample_keys import SampleKeys
    from controlplane.kernel.settings import Settings
    from controlplane.runtime import Background

log = logging.getLogger("canary")

# uvicorn's default parser (httptools) reads a request head of any size before the app
# sees it; h11 refuses one larger than its limit (400, connection closed) as it reads
MAX_HEAD_BYTES = 16 * 1024
HEAD_LIMITS: dict[str, Any] = {"http": "h11", "h11_max_incomplete_event_size": MAX_HEAD_BYTES}

ListenOption = Annotated[
    str | None, typer.Option("--listen", help="HOST:PORT to serve on [env CANARY_LISTEN]")
]
DatabaseOption = Annotated[
    str | None,
    typer.Option("--database-url", help="SQLAlchemy URL [env CANARY_DATABASE_URL]"),
]


def settings_with(**overrides: str | int | None) -> Settings:
    """CANARY_* from the environment, overridden by the flags that were given."""
    from pydantic import ValidationError

    from controlplane.kernel.settings import Settings

    given = {k: v for k, v in overrides.items() if v is not None}
    try:
        return Settings.model_validate(given)
    except ValidationError as exc:
        # one line naming the setting, as the sidecar and collector say it
        first = exc.errors()[0]
        where = ".".join(str(part) for part in first["loc"])
        message = plain_message(first["msg"])
        raise typer.BadParameter(f"{where}: {message}") from exc


def background_services(
    settings: Settings,
    *,
    embedded: bool,
    tracer_provider: TracerProvider | None = None,
    sample_keys: SampleKeys | None = None,
) -> Sequence[Background]:
    """The parts that run inside the API's lifespan, sharing its Backends.

    The controller runs in both commands (several `serve` replicas elect one leader),
    with the board that reads its rules' provider metrics (decision 0048);
    the collector only in `dev`: in production it is its own process (`canary collector`).
    Every process also runs a notification dispatcher (their leases share the outbox).
    """
    from controlplane.controller.runner import Controller
    from controlplane.notify.dispatcher import dispatcher_for

    services: list[Background] = []
    if embedded:
        from controlplane.collector.embedded import EmbeddedCollector
        from controlplane.kernel.sample_keys import generate_sample_keys

        # in-process only, unless `canary dev` wrote the key for joiners (sample_keys)
        services.append(EmbeddedCollector(sample_keys=sample_keys or generate_sample_keys()))
    from controlplane.providers.board import MetricBoard
    from controlplane.providers.service import MetricBoardService

    tracer = None if tracer_provider is None else tracer_provider.get_tracer("canary.controller")
    # provider metrics (CANARY_PROMETHEUS_URL); without one a rule's metrics read as no data
    board = MetricBoard.from_settings(settings)
    services.append(MetricBoardService(board))
    services.append(Controller(tracer=tracer, metric_board=board,
                               shards=settings.controller_shards,
                               lease_ttl=settings.controller_lease_ttl))
    services.append(dispatcher_for(settings))
    return services


def tls_options(settings: Settings) -> dict[str, Any]:
    """uvicorn's TLS options from --tls-cert/--tls-key[/--tls-client-ca]; {} for plain HTTP.

    The files are loaded once here first, so a missing, unreadable or mismatched file
    is a one-line ConfigError before anything listens (uvicorn's own error is a
    traceback). With a client CA, clients must present a certificate it signed.
    """
    import ssl

    from controlplane.kernel.errors import ConfigError
    from controlplane.kernel.tls import server_context

    if not (settings.tls_cert or settings.tls_key or settings.tls_client_ca):
        return {}
    if not (settings.tls_cert and settings.tls_key):
        raise ConfigError("--tls-cert and --tls-key go together (CANARY_TLS_CERT, CANARY_TLS_KEY)")
    server_context(cert_file=settings.tls_cert, key_file=settings.tls_key,
                   client_ca_file=settings.tls_client_ca, what="API TLS")
    options: dict[str, Any] = {"ssl_certfile": settings.tls_cert,
                               "ssl_keyfile": settings.tls_key}
    if settings.tls_client_ca:
        options.update(ssl_ca_certs=settings.tls_client_ca, ssl_cert_reqs=ssl.CERT_REQUIRED)
    return options


def api_address(settings: Settings, *, tls: bool) -> str:
    """The API's base URL for a client on this machine (a wildcard bind is reached
    on loopback)."""
    host, port = settings.listen_host_port
    if host in ("0.0.0.0", "::", ""):
        host = "127.0.0.1"
    elif ":" in host:
        host = f"[{host}]"
    return f"{'https' if tls else 'http'}://{host}:{port}"


def dashboard_address(settings: Settings, *, tls: bool) -> str:
    """The dashboard's URL for a browser on this machine."""
    from controlplane.api.pages import dashboard_url

    return dashboard_url(api_address(settings, tls=tls))


def listen_problem(host: str, port: int) -> str | None:
    """Why the API could not listen on host:port, or None. Checked before anything
    starts: uvicorn finds out only after the lifespan ran, a second `canary dev` would
    by then have revoked the first one's token and replaced its join file."""
    import errno
    import socket

    if port == 0:
        return None
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except OSError as exc:
        return f"cannot listen on {host}:{port}: {exc.strerror or exc}"
    family, kind, proto, _, address = infos[0]
    with socket.socket(family, kind, proto) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn binds
        try:
            probe.bind(address)
        except OSError as exc:
            where = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
            if exc.errno == errno.EADDRINUSE:
                return (f"cannot listen on {where}: the address is in use (another canary "
                        "dev or serve?); choose another with --listen")
            return f"cannot listen on {where}: {exc.strerror or exc}"
    return None


def _listen_or_exit(settings: Settings, command: str) -> None:
    problem = listen_problem(*settings.listen_host_port)
    if problem is not None:
        typer.echo(f"canary {command}: {problem}", err=True)
        raise typer.Exit(1)


def run_api(
    settings: Settings,
    *,
    services: Sequence[Background] = (),
    insecure: bool = False,
    tracer_provider: TracerProvider | None = None,
    admin: str | None = None,
    liveness_bound: float = 30.0,
) -> None:
    """Serve until SIGINT/SIGTERM; uvicorn then drains requests and runs the lifespan's
    shutdown, which stops the services and closes the backends. With `admin`
    (HOST:PORT), /healthz and /metrics are also answered there from a thread.

    A stop signal is raised again, to the handler in place before, once all is stopped
    (`canary serve`: `Stopped`; `canary dev`: its session's exit)."""
    import asyncio

    import uvicorn

    from controlplane.api.app import create_app
    from controlplane.cli.stopping import serve_app
    from controlplane.kernel.admin_thread import Heartbeat
    from controlplane.kernel.clock import SystemClock
    from controlplane.kernel.gc_policy import export_gc_metrics, for_long_running_process

    options = tls_options(settings)
    secure = bool(options)  # uvicorn's ssl_* options, when the API serves TLS
    heartbeat = Heartbeat(SystemClock(), bound=liveness_bound)
    streams = bool(services)
    if admin:
        from controlplane.api.admin_listener import beating

        services = [*services, beating(heartbeat)]
    app = create_app(
        settings, services=services, streams=streams, insecure=insecure,
        tracer_provider=tracer_provider,
    )  # fmt: skip
    if settings.log_format == "json":
        # uvicorn's own logging config would print its records as text: let them reach
        # the root logger's JSON handler instead
        options["log_config"] = None
    host, port = settings.listen_host_port
    dashboard = dashboard_address(settings, tls=secure)
    if settings.log_format == "json":
        log.info("dashboard: %s", dashboard)  # every line on stderr stays JSON
    else:
        typer.echo(f"dashboard: {dashboard}", err=True)
    config = uvicorn.Config(
        app,
        host=host,
        port=port,
        log_level=settings.log_level.lower(),
        access_log=settings.access_log,
        lifespan="off",  # serve_app runs it, so that a stop signal can cancel its startup
        timeout_graceful_shutdown=10,
        **HEAD_LIMITS,
        **options,
    )
    listener = None
    if admin:
        from controlplane.api.admin_listener import serve_api_admin
        from controlplane.kernel.admin_access import admin_token
        from controlplane.kernel.settings import parse_host_port

        admin_host, admin_port = parse_host_port(admin)
        listener = serve_api_admin(app.state.metrics.registry, heartbeat, admin_host,
                                   admin_port, token=admin_token(settings.admin_token_file))
    export_gc_metrics(app.state.metrics.registry)
    for_long_running_process()
    try:
        with asyncio.Runner(loop_factory=config.get_loop_factory()) as runner:
            received = runner.run(serve_app(uvicorn.Server(config), app))
    finally:
        if listener is not None:
            listener.stop()
    if received is not None:
        signal.raise_signal(received)


def _serve_traced(
    settings: Settings, *, embedded: bool, insecure: bool = False,
    sample_keys: SampleKeys | None = None, admin: str | None = None,
    liveness_bound: float = 30.0,
) -> None:
    """`run_api` with the background services, and tracing when it is configured."""
    from controlplane.kernel.errors import ConfigError
    from controlplane.tracer import open_tracer_provider

    try:
        provider = open_tracer_provider(settings)
    except (ConfigError, ValueError) as exc:
        typer.echo(f"canary: tracing: {exc}", err=True)
        raise typer.Exit(2) from exc
    if provider is not None:
        log.info("tracing to %s", settings.otel_endpoint or "the OTEL_EXPORTER_OTLP_* endpoint")
    try:
        try:  # a Prometheus TLS or credential file that cannot be read: one line
            services = background_services(settings, embedded=embedded, tracer_provider=provider,
                                           sample_keys=sample_keys)
        except ConfigError as exc:
            typer.echo(f"canary: prometheus: {exc}", err=True)
            raise typer.Exit(2) from exc
        run_api(settings, services=services, insecure=insecure, tracer_provider=provider,
                admin=admin, liveness_bound=liveness_bound)
    finally:
        if provider is not None:
            provider.shutdown()  # sends what is queued


def _setup_logging(settings: Settings) -> None:
    from controlplane.kernel.logs import configure_logging

    configure_logging(settings.log_level, settings.log_format)
    # Alembic announces every plugin it loads; only the migrations themselves matter.
    logging.getLogger("alembic.runtime.plugins").setLevel(logging.WARNING)
    # httpx logs every request it sends at INFO (webhooks, Prometheus, JWKS): their
    # outcomes are counted and their failures logged by the callers
    logging.getLogger("httpx").setLevel(logging.WARNING)


def _migrate_or_exit(url: str) -> None:
    from controlplane.db import migrate
    from controlplane.kernel.errors import CanaryError

    try:
        migrate.upgrade(url)
    except CanaryError as exc:
        typer.echo(f"canary: cannot migrate the database: {exc}", err=True)
        raise typer.Exit(1) from exc


def _migrated_or_exit(url: str) -> None:
    """Serve only a database at the migrations' head: name what is missing and the
    command that applies it (an unmigrated database is reachable, not unavailable)."""
    from controlplane.db import migrate
    from controlplane.kernel.errors import CanaryError

    try:
        missing = migrate.pending(url)
    except CanaryError as exc:
        typer.echo(f"canary serve: cannot read the database's migrations: {exc}", err=True)
        raise typer.Exit(1) from exc
    if missing:
        names = ", ".join(f"{rev} ({doc})" if doc else rev for rev, doc in missing[:3])
        more = f" and {len(missing) - 3} more" if len(missing) > 3 else ""
        typer.echo(
            f"canary serve: the database lacks {len(missing)} migration(s): {names}{more}; "
            "run `canary db upgrade` (same --database-url / CANARY_DATABASE_URL) first",
            err=True,
        )
        raise typer.Exit(1)


def _bootstrap_token_or_exit(settings: Settings) -> None:
    """Install the admin token CANARY_BOOTSTRAP_ADMIN_TOKEN_FILE names, if any: on
    Kubernetes, the first admin comes from a Secret, not from `kubectl exec`."""
    from controlplane.auth.tokens import looks_like_token
    from controlplane.db.session import db_errors, make_engine, make_sessionmaker
    from controlplane.db.tokens import ensure_bootstrap_token
    from controlplane.kernel.clock import SystemClock, utc_now
    from controlplane.kernel.errors import CanaryError, ConfigError, Conflict
    from controlplane.kernel.secrets import read_secret_file

    path = settings.bootstrap_admin_token_file
    if not path:
        return
    try:
        token = read_secret_file(path, what="bootstrap admin token")
        if not looks_like_token(token):
            raise ConfigError(
                f"{path} does not hold an API token: cnry_ and 20-200 "
                "letters, digits, '-' or '_' (e.g. `echo cnry_$(openssl rand -hex 32)`)"
            )
        engine = make_engine(settings.database_url)
        try:
            for attempt in (1, 2):
                try:
                    with db_errors(), make_sessionmaker(engine).begin() as session:
                        done = ensure_bootstrap_token(session=session, token=token,
                                                      now=utc_now(SystemClock()))
                    break
                except Conflict:
                    # replicas starting together: another one installed it while this
                    # one inserted; reading again finds it
                    if attempt == 2:
                        raise
        finally:
            engine.dispose()
    except CanaryError as exc:
        typer.echo(f"canary serve: bootstrap admin token: {exc}", err=True)
        raise typer.Exit(1) from exc
    log.info("%s", done)


def _auth_or_exit(settings: Settings, *, insecure: bool) -> None:
    """Serve only with a way to authenticate: live tokens in the database, or OIDC;
    `--insecure` serves without, and says so loudly."""
    from controlplane.auth.oidc import OidcVerifier
    from controlplane.db.session import db_errors, make_engine, make_sessionmaker
    from controlplane.db.tokens import count_live_tokens
    from controlplane.kernel.errors import CanaryError

    if insecure:
        log.warning(
            "INSECURE: serving WITHOUT authentication (--insecure): anyone who reaches "
            "http://%s may create, start and delete experiments",
            settings.listen,
        )
        return
    try:
        if OidcVerifier.from_settings(settings) is not None:
            return
        engine = make_engine(settings.database_url)
        try:
            with db_errors(), make_sessionmaker(engine)() as session:
                live = count_live_tokens(session=session)
        finally:
            engine.dispose()
    except CanaryError as exc:
        typer.echo(f"canary serve: cannot check authentication: {exc}", err=True)
        raise typer.Exit(1) from exc
    if live == 0:
        typer.echo(
            "canary serve: no authentication configured: create a token with `canary token "
            "create --name NAME --role admin`, or set CANARY_OIDC_ISSUER (or pass --insecure)",
            err=True,
        )
        raise typer.Exit(1)


def _dev_token(settings: Settings) -> str:
    """A fresh admin token named `dev` (the previous one revoked), so `canary dev`
    needs no set-up and a token it printed earlier stops working."""
    from controlplane.auth.roles import Role
    from controlplane.db.session import db_errors, make_engine, make_sessionmaker
    from controlplane.db.tokens import issue_token, revoke_token
    from controlplane.kernel.clock import SystemClock, utc_now
    from controlplane.kernel.errors import NotFound

    now = utc_now(SystemClock())
    engine = make_engine(settings.database_url)
    try:
        with db_errors(), make_sessionmaker(engine).begin() as session:
            with contextlib.suppress(NotFound):
                revoke_token(session=session, ref=DEV_TOKEN_NAME, now=now)
            _, token = issue_token(
                session=session, name=DEV_TOKEN_NAME, role=Role.ADMIN,
                created_by="canary dev", now=now,
            )  # fmt: skip
    finally:
        engine.dispose()
    return token


DEV_TOKEN_NAME = "dev"


def _exit_on_sigterm(signum: int, frame: object) -> None:
    raise SystemExit(0)

InsecureOption = Annotated[
    bool,
    typer.Option(
        "--insecure",
        help="serve WITHOUT authentication: every caller is an admin (never in production)",
    ),
]
TrustedHostsOption = Annotated[
    str | None,
    typer.Option(
        "--trusted-hosts",
        help="Host header values answered, comma-separated [env CANARY_TRUSTED_HOSTS]",
    ),
]
MaxBodyOption = Annotated[
    int | None,
    typer.Option("--max-body-bytes", help="largest request body [env CANARY_MAX_BODY_BYTES]"),
]


def register(app: typer.Typer) -> None:
    @app.command("dev")
    def dev_command(
        listen: ListenOption = None,
        db_file: Annotated[Path, typer.Option("--db-file", help="the SQLite database file")] = Path(
            "canary.db"
        ),
        backends: Annotated[
            str,
            typer.Option(
                "--backends",
                help="local: start etcd and redis-server on loopback ports so sidecars and "
                "routers can join (--join); memory: in-process, nothing can join; auto: "
                "local when both binaries are installed",
            ),
        ] = "auto",
        join_file: Annotated[
            Path | None,
            typer.Option("--join-file", help="where the join file goes (default: "
                         "canary-dev.json beside --db-file)"),
        ] = None,
        log_format: LogFormatOption = None,
        otel_endpoint: OtelEndpointOption = None,
        trace_sample_ratio: SampleRatioOption = None,
    ) -> None:
        """Control plane in one process on SQLite, with etcd and Redis a sidecar can join."""
        from controlplane.devloop.session import (
            BackendChoice,
            join_commands,
            local_session,
            memory_note,
            missing_binaries,
            resolve_choice,
        )
        from controlplane.kernel.errors import ConfigError

        try:
            wanted = BackendChoice(backends)
        except ValueError:
            raise typer.BadParameter(
                f"--backends must be auto, local or memory, got {backends!r}"
            ) from None
        path = db_file.expanduser().resolve()
        missing = missing_binaries()
        choice = resolve_choice(wanted, missing)
        if choice is BackendChoice.LOCAL and missing:
            typer.echo(f"canary dev: --backends local needs {' and '.join(missing)}", err=True)
            raise typer.Exit(2)
        settings = settings_with(
            listen=listen, database_url=f"sqlite:///{path}", etcd="memory://",
            redis_url="memory://",
            **observability_settings(log_format, otel_endpoint, trace_sample_ratio),
        )  # fmt: skip
        _listen_or_exit(settings, "dev")
        _setup_logging(settings)
        _migrate_or_exit(settings.database_url)
        log.info("database: %s (SQLite, migrated to head)", path)
        token = _dev_token(settings)
        typer.echo(
            f"admin token for this run (the previous `dev` token is revoked):\n"
            f"  export CANARY_TOKEN={token}",
            err=True,
        )
        api = api_address(settings, tls=False)
        if choice is BackendChoice.MEMORY:
            log.warning("%s", memory_note(missing if wanted is BackendChoice.AUTO else []))
            _serve_traced(settings, embedded=True)
            return
        where = (join_file or path.with_name("canary-dev.json")).expanduser().resolve()
        # uvicorn raises SIGTERM again once it has drained: let that unwind through the
        # session, which stops etcd and Redis, instead of killing the process there
        signal.signal(signal.SIGTERM, _exit_on_sigterm)
        try:
            with local_session(join_file=where, api=api,
                               etcd_prefix=settings.etcd_prefix) as session:
                settings = settings.model_copy(update=session.join.settings())
                log.info("etcd on %s and Redis on %s (local, this run only); API on %s",
                         session.join.etcd, session.join.redis_url, api)
                if settings.log_format == "json":  # every line on stderr stays JSON
                    log.info("join this control plane: %s", " | ".join(join_commands(where)))
                else:
                    typer.echo("join this control plane from another terminal:\n"
                               + "\n".join(f"  {line}" for line in join_commands(where)),
                               err=True)
                _serve_traced(settings, embedded=True, sample_keys=session.sample_keys)
        except ConfigError as exc:
            typer.echo(f"canary dev: {exc}", err=True)
            raise typer.Exit(1) from exc

    @app.command("serve")
    def serve_command(
        listen: ListenOption = None,
        database_url: DatabaseOption = None,
        etcd: Annotated[
            str | None, typer.Option("--etcd", help=ENDPOINTS_HELP + " [env CANARY_ETCD]")
        ] = None,
        etcd_prefix: Annotated[
            str | None, typer.Option("--etcd-prefix", help="key prefix [env CANARY_ETCD_PREFIX]")
        ] = None,
        redis: Annotated[
            str | None,
            typer.Option("--redis", help=f"{URL_FORMS} [env CANARY_REDIS_URL]"),
        ] = None,
        tls_cert: Annotated[
            str | None, typer.Option("--tls-cert", help="serve HTTPS: certificate (PEM) "
                                     "[env CANARY_TLS_CERT]")
        ] = None,
        tls_key: Annotated[
            str | None, typer.Option("--tls-key", help="its private key [env CANARY_TLS_KEY]")
        ] = None,
        tls_client_ca: Annotated[
            str | None, typer.Option("--tls-client-ca", help="require client certificates "
                                     "signed by this CA [env CANARY_TLS_CLIENT_CA]")
        ] = None,
        trusted_hosts: TrustedHostsOption = None,
        max_body_bytes: MaxBodyOption = None,
        insecure: InsecureOption = False,
        admin: Annotated[
            str | None,
            typer.Option("--admin", help="[HOST]:PORT for /healthz and /metrics answered "
                         "beside the controller's rounds (bearer token for /metrics: "
                         "--admin-token-file)"),
        ] = None,
        admin_token_file: Annotated[
            str | None,
            typer.Option("--admin-token-file", help="bearer token for the --admin /metrics "
                         "[env CANARY_ADMIN_TOKEN_FILE]"),
        ] = None,
        liveness_bound: LivenessBoundOption = 30.0,
        log_format: LogFormatOption = None,
        otel_endpoint: OtelEndpointOption = None,
        trace_sample_ratio: SampleRatioOption = None,
    ) -> None:
        """API (and controller) on the configured backends. Run `canary db upgrade` first.

        Refuses to start without authentication: API tokens (`canary token create`) or
        OIDC (CANARY_OIDC_*), unless --insecure. Stops on the first SIGINT or SIGTERM,
        during startup too."""
        from controlplane.cli.stopping import stopping_on_signals
        from controlplane.kernel.errors import ConfigError

        # from the first step on: the checks before serving wait on the database, and
        # SIGTERM's default would end the process without a word
        with stopping_on_signals("serve"):
            settings = settings_with(
                listen=listen,
                database_url=database_url,
                etcd=etcd,
                etcd_prefix=etcd_prefix,
                redis_url=redis,
                tls_cert=tls_cert,
                tls_key=tls_key,
                tls_client_ca=tls_client_ca,
                trusted_hosts=trusted_hosts,
                max_body_bytes=max_body_bytes,
                admin_token_file=admin_token_file,
                **observability_settings(log_format, otel_endpoint, trace_sample_ratio),
            )
            _listen_or_exit(settings, "serve")
            _setup_logging(settings)
            try:
                tls_options(settings)
            except ConfigError as exc:
                typer.echo(f"canary serve: {exc}", err=True)
                raise typer.Exit(2) from exc
            _migrated_or_exit(settings.database_url)
            _bootstrap_token_or_exit(settings)
            _auth_or_exit(settings, insecure=insecure)
            _serve_traced(settings, embedded=False, insecure=insecure, admin=admin,
                          liveness_bound=liveness_bound)

    db = typer.Typer(help="Database migrations (Alembic).", no_args_is_help=True)
    app.add_typer(db, name="db")

    @db.command("upgrade")
    def db_upgrade(
        revision: Annotated[str, typer.Argument(help="target revision")] = "head",
        database_url: DatabaseOption = None,
    ) -> None:
        """Migrate the database up to a revision (default: the latest)."""
        from controlplane.db import migrate

        url = settings_with(database_url=database_url).database_url
        migrate.upgrade(url, revision)
        typer.echo(f"database at revision {migrate.current(url)}")

    @db.command("downgrade")
    def db_downgrade(
        revision: Annotated[str, typer.Argument(help="target revision, or 'base'")] = "-1",
        database_url: DatabaseOption = None,
    ) -> None:
        """Migrate the database down (default: one revision)."""
        from controlplane.db import migrate

        url = settings_with(database_url=database_url).database_url
        migrate.downgrade(url, revision)
        typer.echo(f"database at revision {migrate.current(url) or 'base'}")

    @db.command("current")
    def db_current(database_url: DatabaseOption = None) -> None:
        """Print the database's revision and the latest one."""
        from controlplane.db import migrate

        url = settings_with(database_url=database_url).database_url
        now, head = migrate.current(url), migrate.head(url)
        state = "up to date" if now == head else "behind: run `canary db upgrade`"
        typer.echo(f"{now or 'base'} (head {head}, {state})")
