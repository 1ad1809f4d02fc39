"""How to reach etcd, Redis and Prometheus securely: TLS files and credentials, from Settings.

Kept apart from the adapters so that choosing a store (`open_kv`, `open_streams`)
never imports grpc or redis-py, and so that every process builds its access the
same way. Passwords are not held here: `password()` reads them when a connection
authenticates, from the secret file (re-read, so rotation needs no restart) or the
variable.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from controlplane.kernel.errors import ConfigError
from controlplane.kernel.secrets import secret_from
from controlplane.kernel.settings import Settings
from controlplane.kernel.tls import read_pem


def _no_secret() -> str | None:
    return None


@dataclass(frozen=True)
class EtcdAccess:
    """TLS material (PEM bytes, as gRPC takes them) and the etcd user, if any."""

    ca: bytes | None = None
    cert: bytes | None = None
    key: bytes | None = None
    user: str | None = None
    password: Callable[[], str | None] = field(default=_no_secret, repr=False)

    @property
    def tls(self) -> bool:
        return self.ca is not None or self.cert is not None


@dataclass(frozen=True)
class RedisAccess:
    """Files for redis-py's TLS options and a password kept out of the URL."""

    ca_file: str | None = None
    cert_file: str | None = None
    key_file: str | None = None
    password: Callable[[], str | None] = field(default=_no_secret, repr=False)


def etcd_access(settings: Settings) -> EtcdAccess:
    """Read and check the etcd TLS files now, so a bad path fails at start-up."""
    if bool(settings.etcd_cert_file) != bool(settings.etcd_key_file):
        raise ConfigError("CANARY_ETCD_CERT_FILE and CANARY_ETCD_KEY_FILE go together")
    ca = cert = key = None
    if settings.etcd_ca_file:
        ca = read_pem(settings.etcd_ca_file, what="CANARY_ETCD_CA_FILE")
    if settings.etcd_cert_file and settings.etcd_key_file:
        cert = read_pem(settings.etcd_cert_file, what="CANARY_ETCD_CERT_FILE")
        key = read_pem(settings.etcd_key_file, what="CANARY_ETCD_KEY_FILE")
    user = settings.etcd_user or None
    inline = settings.etcd_password or None
    password_file = settings.etcd_password_file
    if user is None and (inline or password_file):
        raise ConfigError("an etcd password is set but CANARY_ETCD_USER is not")
    if user is not None and not (inline or password_file):
        raise ConfigError(
            "CANARY_ETCD_USER is set without CANARY_ETCD_PASSWORD or CANARY_ETCD_PASSWORD_FILE"
        )
    if password_file:
        # fail at start-up on an unreadable file; later reads pick up rotations
        secret_from(value=None, file=password_file, what="CANARY_ETCD_PASSWORD_FILE")

    def password() -> str | None:
        return secret_from(value=inline, file=password_file, what="CANARY_ETCD_PASSWORD_FILE")

    return EtcdAccess(ca=ca, cert=cert, key=key, user=user, password=password)


def redis_access(settings: Settings) -> RedisAccess:
    if bool(settings.redis_cert_file) != bool(settings.redis_key_file):
        raise ConfigError("CANARY_REDIS_CERT_FILE and CANARY_REDIS_KEY_FILE go together")
    for what, path in (
        ("CANARY_REDIS_CA_FILE", settings.redis_ca_file),
        ("CANARY_REDIS_CERT_FILE", settings.redis_cert_file),
        ("CANARY_REDIS_KEY_FILE", settings.redis_key_file),
    ):
        if path:
            read_pem(path, what=what)
    password_file = settings.redis_password_file
    if password_file:
        secret_from(value=None, file=password_file, what="CANARY_REDIS_PASSWORD_FILE")

    def password() -> str | None:
        return secret_from(value=None, file=password_file, what="CANARY_REDIS_PASSWORD_FILE")

    return RedisAccess(
        ca_file=settings.redis_ca_file,
        cert_file=settings.redis_cert_file,
        key_file=settings.redis_key_file,
        password=password,
    )


@dataclass(frozen=True)
class PrometheusAccess:
    """Where Prometheus answers and how to authenticate: TLS files, and a bearer token
    or a basic-auth password read from their files at each query (rotation needs no
    restart); neither is ever kept here or logged."""

    url: str
    timeout_sec: float = 2.0
    ca_file: str | None = None
    cert_file: str | None = None
    key_file: str | None = None
    user: str | None = None
    password: Callable[[], str | None] = field(default=_no_secret, repr=False)
    bearer_token: Callable[[], str | None] = field(default=_no_secret, repr=False)


def prometheus_access(settings: Settings) -> PrometheusAccess | None:
    """None without CANARY_PROMETHEUS_URL; files checked now, so a bad path fails at
    start-up rather than as every query's no-data reason."""
    if not settings.prometheus_url:
        return None
    if bool(settings.prometheus_cert_file) != bool(settings.prometheus_key_file):
        raise ConfigError(
            "CANARY_PROMETHEUS_CERT_FILE and CANARY_PROMETHEUS_KEY_FILE go together"
        )
    for what, path in (
        ("CANARY_PROMETHEUS_CA_FILE", settings.prometheus_ca_file),
        ("CANARY_PROMETHEUS_CERT_FILE", settings.prometheus_cert_file),
        ("CANARY_PROMETHEUS_KEY_FILE", settings.prometheus_key_file),
    ):
        if path:
            read_pem(path, what=what)
    user = settings.prometheus_user or None
    password_file = settings.prometheus_password_file or None
    token_file = settings.prometheus_bearer_token_file or None
    if user is None and password_file:
        raise ConfigError(
            "CANARY_PROMETHEUS_PASSWORD_FILE is set but CANARY_PROMETHEUS_USER is not"
        )
    if user is not None and not password_file:
        raise ConfigError("CANARY_PROMETHEUS_USER is set without CANARY_PROMETHEUS_PASSWORD_FILE")
    if user is not None and token_file:
        raise ConfigError(
            "CANARY_PROMETHEUS_BEARER_TOKEN_FILE or CANARY_PROMETHEUS_USER, not both"
        )
    if user is not None and ":" in user:
        raise ConfigError("CANARY_PROMETHEUS_USER must not contain ':'")
    if password_file:
        secret_from(value=None, file=password_file, what="CANARY_PROMETHEUS_PASSWORD_FILE")
    if token_file:
        secret_from(value=None, file=token_file, what="CANARY_PROMETHEUS_BEARER_TOKEN_FILE")

    def password() -> str | None:
        return secret_from(value=None, file=password_file, what="CANARY_PROMETHEUS_PASSWORD_FILE")

    def bearer_token() -> str | None:
        return secret_from(value=None, file=token_file, what="CANARY_PROMETHEUS_BEARER_TOKEN_FILE")

    return PrometheusAccess(
        url=settings.prometheus_url,
        timeout_sec=settings.prometheus_timeout_sec,
        ca_file=settings.prometheus_ca_file,
        cert_file=settings.prometheus_cert_file,
        key_file=settings.prometheus_key_file,
        user=user,
        password=password,
        bearer_token=bearer_token,
    )
