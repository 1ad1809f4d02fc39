"""`canary router nginx|haproxy`: steer a proxy a team already runs, beside it.

An agent next to NGINX or HAProxy follows the service's route in etcd (as a sidecar
does), puts it in force in the proxy, and turns the proxy's access log into samples
for Redis (`routers/`, decision 0045). Flags override the CANARY_* environment.
Only the kernel, the sidecar's reporter and `routers/` are imported.
"""

from __future__ import annotations

from collections.abc import Coroutine
from typing import TYPE_CHECKING, Annotated, Any

import typer

from controlplane.cli.observability import LogFormatOption, observability_settings
from controlplane.cli.sidecar import JoinOption
from controlplane.kernel.errors import plain_message
from controlplane.kernel.etcd_endpoints import ENDPOINTS_HELP
from controlplane.kernel.streams_factory import URL_FORMS

if TYPE_CHECKING:
    from controlplane.kernel.sample_keys import SampleKeys
    from controlplane.kernel.settings import Settings

router_app = typer.Typer(
    name="router",
    help="Steer NGINX or HAProxy as a data plane: routes from etcd, samples from their logs.",
    no_args_is_help=True,
)

ServiceOption = Annotated[str, typer.Option("--service", help="the service the proxy fronts")]
ListenOption = Annotated[
    str, typer.Option("--listen", help="HOST:PORT the proxy serves the service on")
]
AdminOption = Annotated[
    str | None,
    typer.Option("--admin", help="[HOST]:PORT for the agent's /healthz, /readyz, /status, "
                 "/metrics (host 127.0.0.1)"),
]
LogListenOption = Annotated[
    str,
    typer.Option("--log-listen", help="HOST:PORT (UDP, loopback) where the proxy sends its "
                 "access log lines"),
]
EtcdOption = Annotated[
    str | None, typer.Option("--etcd", help=ENDPOINTS_HELP + " (env CANARY_ETCD)")
]
EtcdPrefixOption = Annotated[
    str | None, typer.Option("--etcd-prefix", help="key prefix (env CANARY_ETCD_PREFIX)")
]
RedisOption = Annotated[str | None, typer.Option("--redis", help=f"{URL_FORMS} (env "
                                                  "CANARY_REDIS_URL)")]
AllowForceOption = Annotated[
    bool, typer.Option("--allow-force", help="honour X-Canary-Force: <variant>")
]
SampleKeysOption = Annotated[
    str | None,
    typer.Option("--sample-keys-file", help="kid:secret lines; batches are signed with the "
                 "first key [env CANARY_SAMPLE_KEYS_FILE, or CANARY_SAMPLE_KEYS]"),
]
AdminTokenOption = Annotated[
    str | None,
    typer.Option("--admin-token-file", help="bearer token for /metrics and /status "
                 "(env CANARY_ADMIN_TOKEN_FILE)"),
]


def _fail(command: str, message: str) -> typer.Exit:
    """One line on stderr and exit code 2, as for any bad flag."""
    typer.echo(f"canary router {command}: {message}", err=True)
    return typer.Exit(2)


def _address(command: str, flag: str, text: str) -> tuple[str, int]:
    from controlplane.kernel.errors import ConfigError
    from controlplane.kernel.settings import parse_host_port

    try:
        return parse_host_port(text)
    except ConfigError as exc:
        raise _fail(command, f"{flag}: {exc}") from None


def _service(command: str, service: str) -> None:
    from controlplane.kernel.keys import is_service_name

    if not is_service_name(service):
        raise _fail(command, f"invalid service name {service!r}: lower-case letters, digits, "
                    "'.', '_' or '-', 1-63 characters")


def _settings(
    command: str, *, etcd: str | None, etcd_prefix: str | None, redis: str | None,
    admin_token_file: str | None, log_format: str | None, join: str | None = None,
    sample_keys_file: str | None = None,
) -> tuple[Settings, str | None]:
    """The agent's settings, and its sample keys file (the join file may name it)."""
    from pydantic import ValidationError

    from controlplane.kernel.admin_access import admin_token
    from controlplane.kernel.errors import ConfigError
    from controlplane.kernel.logs import configure_logging
    from controlplane.kernel.settings import Settings

    overrides = {"etcd": etcd, "etcd_prefix": etcd_prefix, "redis_url": redis,
                 "admin_token_file": admin_token_file}  # fmt: skip
    try:
        if join is not None:
            from controlplane.cli.sidecar import joined_backends

            joined = joined_backends(join, etcd=etcd, etcd_prefix=etcd_prefix, redis=redis,
                                     sample_keys_file=sample_keys_file)
            overrides.update(joined.settings())
            sample_keys_file = joined.sample_keys_file
        given = {k: v for k, v in overrides.items() if v is not None}
        given.update(observability_settings(log_format))
        settings = Settings.model_validate(given)
        admin_token(settings.admin_token_file)  # an unreadable file fails here
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(part) for part in first["loc"])
        raise _fail(command, f"{where}: {plain_message(first['msg'])}") from None
    except (ConfigError, ValueError) as exc:
        raise _fail(command, str(exc)) from None
    configure_logging(settings.log_level, settings.log_format)
    return settings, sample_keys_file


def _sample_keys(command: str, sample_keys_file: str | None) -> SampleKeys | None:
    from controlplane.kernel.errors import ConfigError
    from controlplane.kernel.sample_keys import load_sample_keys

    try:
        return load_sample_keys(sample_keys_file)
    except ConfigError as exc:
        raise _fail(command, str(exc)) from None


def _run(command: str, main: Coroutine[Any, Any, None]) -> None:
    from controlplane.kernel.errors import ConfigError
    from sidecar.main import run_loop

    try:
        run_loop(main)
    except ConfigError as exc:
        raise _fail(command, str(exc)) from None
    except OSError as exc:
        raise _fail(command, f"cannot start: {exc.strerror or exc}") from None


@router_app.command("haproxy")
def haproxy_command(
    service: ServiceOption,
    listen: ListenOption,
    socket: Annotated[
        str, typer.Option("--socket", help="HAProxy's stats socket (admin level), a path")
    ],
    map_path: Annotated[
        str, typer.Option("--map", help="the map file the base config loads (a path)")
    ],
    variants: Annotated[
        str, typer.Option("--variants", help="the variants the base config declares, in order")
    ] = "baseline,canary",
    sticky_header: Annotated[
        str | None, typer.Option("--sticky-header", help="the header routes may stick users by")
    ] = "x-user-id",
    sticky_cookie: Annotated[
        str | None, typer.Option("--sticky-cookie", help="the cookie routes may stick users by")
    ] = None,
    print_config: Annotated[
        bool,
        typer.Option("--print-config", help="print HAProxy's base config for these flags and "
                     "exit (start HAProxy with it, with an empty map file, then the agent)"),
    ] = False,
    admin: AdminOption = None,
    log_listen: LogListenOption = "127.0.0.1:5514",
    allow_force: AllowForceOption = False,
    etcd: EtcdOption = None,
    etcd_prefix: EtcdPrefixOption = None,
    redis: RedisOption = None,
    join: JoinOption = None,
    sample_keys_file: SampleKeysOption = None,
    admin_token_file: AdminTokenOption = None,
    log_format: LogFormatOption = None,
) -> None:
    """Steer HAProxy through its runtime API (no reloads); samples from its log."""
    from routers.haproxy.log_lines import HaproxyLineParser
    from routers.haproxy.render import BaseConfig, render_config
    from routers.haproxy.router import HaproxyRouter
    from routers.main import run_router_agent
    from routers.process import AgentOptions

    name = "haproxy"
    _service(name, service)
    log_host, log_port = _address(name, "--log-listen", log_listen)
    try:
        cfg = BaseConfig(
            service=service, listen=listen, stats_socket=socket, map_path=map_path,
            variants=tuple(v.strip() for v in variants.split(",") if v.strip()),
            sticky_header=sticky_header or None, sticky_cookie=sticky_cookie or None,
            allow_force=allow_force, log_target=f"{log_host}:{log_port}",
        )  # fmt: skip
    except ValueError as exc:
        raise _fail(name, str(exc)) from None
    if print_config:
        typer.echo(render_config(cfg), nl=False)
        return
    admin_address = _address(name, "--admin", admin) if admin else None
    settings, sample_keys_file = _settings(
        name, etcd=etcd, etcd_prefix=etcd_prefix, redis=redis, join=join,
        admin_token_file=admin_token_file, log_format=log_format,
        sample_keys_file=sample_keys_file,
    )  # fmt: skip
    keys = _sample_keys(name, sample_keys_file)
    options = AgentOptions(service=service, etcd_prefix=settings.etcd_prefix,
                           log_listen=(log_host, log_port))  # fmt: skip
    _run(name, run_router_agent(
        settings, build_parser=lambda token: HaproxyLineParser(service, token=token),
        build_router=lambda _, token: HaproxyRouter(cfg, log_token=token), options=options,
        admin=admin_address, sample_keys=keys, source_tag="haproxy",
    ))  # fmt: skip


@router_app.command("nginx")
def nginx_command(
    service: ServiceOption,
    listen: ListenOption,
    conf_dir: Annotated[
        str, typer.Option("--conf-dir", help="directory nginx includes canary-*.conf from; "
                          "the agent owns canary-<service>.conf there")
    ],
    nginx_conf: Annotated[
        str, typer.Option("--nginx-conf", help="nginx's main config (checked with nginx -t "
                          "after each change)")
    ],
    status_listen: Annotated[
        str, typer.Option("--status-listen", help="loopback HOST:PORT where nginx answers "
                          "what it holds (port 0: any free one)")
    ] = "127.0.0.1:0",
    nginx: Annotated[str, typer.Option("--nginx", help="the nginx binary")] = "/usr/sbin/nginx",
    pid_file: Annotated[
        str | None, typer.Option("--pid-file", help="nginx's pid file (else `nginx -s reload`)")
    ] = None,
    min_interval: Annotated[
        float, typer.Option("--min-interval", help="seconds between two reloads; route "
                            "changes in between are applied together")
    ] = 0.25,
    default_upstream: Annotated[
        str | None,
        typer.Option("--default-upstream", help="http:// URL served while no route is in "
                     "force (else 503)"),
    ] = None,
    upstream_keepalive: Annotated[
        int, typer.Option("--upstream-keepalive", help="idle connections each nginx worker "
                          "keeps per variant's upstream, 0-10000 (more requests in flight "
                          "than this open a connection each)")
    ] = 128,
    print_config: Annotated[
        bool,
        typer.Option("--print-config", help="print a main nginx.conf that includes --conf-dir, "
                     "write the service's first include there (no route: 503), and exit"),
    ] = False,
    admin: AdminOption = None,
    log_listen: LogListenOption = "127.0.0.1:5514",
    allow_force: AllowForceOption = False,
    etcd: EtcdOption = None,
    etcd_prefix: EtcdPrefixOption = None,
    redis: RedisOption = None,
    join: JoinOption = None,
    sample_keys_file: SampleKeysOption = None,
    admin_token_file: AdminTokenOption = None,
    log_format: LogFormatOption = None,
) -> None:
    """Steer NGINX by rendering, checking (nginx -t) and reloading; samples from its log."""
    from pathlib import Path

    from routers.main import run_router_agent
    from routers.nginx.log_lines import NginxLineParser
    from routers.nginx.main_conf import include_path, main_config, temp_dirs
    from routers.nginx.render import RenderOptions, render
    from routers.nginx.router import NginxRouter, NginxSettings
    from routers.process import AgentOptions
    from routers.samples.token import LogToken
    from routers.seam import RouterError

    name = "nginx"
    _service(name, service)
    log_host, log_port = _address(name, "--log-listen", log_listen)
    status_host, status_port = _address(name, "--status-listen", status_listen)
    if not 0 <= upstream_keepalive <= 10_000:
        raise _fail(name, f"--upstream-keepalive must be 0-10000, got {upstream_keepalive}")
    if not min_interval >= 0:
        raise _fail(name, f"--min-interval must be 0 or more seconds, got {min_interval}")
    conf = Path(nginx_conf).absolute()
    directory = Path(conf_dir).absolute()
    include = include_path(directory, service)

    def options(
        log_target: tuple[str, int] | None, status: int, token: LogToken | None = None
    ) -> RenderOptions:
        return RenderOptions(
            service=service, listen=listen, status_listen=f"{status_host}:{status}",
            log_target=f"{log_target[0]}:{log_target[1]}" if log_target else None,
            allow_force=allow_force, default_upstream=default_upstream, log_token=token,
            keepalive=upstream_keepalive,
        )  # fmt: skip

    if default_upstream is not None:
        from controlplane.kernel.values import split_upstream

        try:
            split_upstream(default_upstream)
        except ValueError as exc:
            raise _fail(name, f"--default-upstream: {exc}") from None
    try:
        first = render(None, options((log_host, log_port), status_port or _free_port()))
    except (ValueError, RouterError) as exc:
        raise _fail(name, str(exc)) from None
    if print_config:
        try:
            directory.mkdir(parents=True, exist_ok=True)
            for path in temp_dirs(conf.parent):
                path.mkdir(parents=True, exist_ok=True)
            if not include.exists():
                include.write_text(first)
        except OSError as exc:
            raise _fail(name, f"cannot write into {directory}: {exc.strerror or exc}") from None
        typer.echo(main_config(conf.parent, directory), nl=False)
        return
    admin_address = _address(name, "--admin", admin) if admin else None
    settings, sample_keys_file = _settings(
        name, etcd=etcd, etcd_prefix=etcd_prefix, redis=redis, join=join,
        admin_token_file=admin_token_file, log_format=log_format,
        sample_keys_file=sample_keys_file,
    )  # fmt: skip
    keys = _sample_keys(name, sample_keys_file)

    def build(log_target: tuple[str, int], token: LogToken) -> NginxRouter:
        return NginxRouter(NginxSettings(
            render=options(log_target, status_port or _free_port(), token), include=include,
            main_conf=conf, nginx=nginx, pid_file=Path(pid_file) if pid_file else None,
            min_interval=min_interval,
        ))  # fmt: skip

    agent_options = AgentOptions(service=service, etcd_prefix=settings.etcd_prefix,
                                 log_listen=(log_host, log_port))  # fmt: skip
    _run(name, run_router_agent(
        settings, build_parser=lambda token: NginxLineParser(service, token=token),
        build_router=build, options=agent_options,
        admin=admin_address, sample_keys=keys, source_tag="nginx",
    ))  # fmt: skip


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def register(app: typer.Typer) -> None:
    app.add_typer(router_app)
