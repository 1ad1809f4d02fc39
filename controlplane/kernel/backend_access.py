"""How to reach etcd and Redis securely: TLS files and credentials, from Settings.

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
