"""Typed settings, read once from CANARY_* variables (CLI flags override them)."""

from __future__ import annotations

import re
from typing import Literal
from urllib.parse import urlsplit

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from controlplane.kernel.errors import ConfigError
from controlplane.kernel.etcd_endpoints import ENDPOINTS_HELP, parse_endpoints
from controlplane.kernel.tracing_config import otlp_base_url
from controlplane.kernel.values import UpstreamPolicy, split_upstream


def parse_host_port(value: str, *, default_host: str = "127.0.0.1") -> tuple[str, int]:
    """'host:port', ':port' or '[v6]:port' -> (host, port), with a one-line error."""
    text = value.strip()
    host, sep, port_text = text.rpartition(":")
    if not sep or not port_text.isdigit():
        raise ConfigError(f"expected HOST:PORT, got {value!r}")
    port = int(port_text)
    if not 0 <= port <= 65535:
        raise ConfigError(f"port out of range in {value!r}")
    host = host.strip("[]") or default_host
    return host, port


def prometheus_url_problem(value: str) -> str | None:
    """Why a Prometheus base URL is refused, or None (empty: no provider)."""
    text = value.strip()
    if not text:
        return None
    if any(ord(c) < 33 or ord(c) == 127 for c in text) or len(text) > 2048:
        return "the Prometheus URL has spaces or control characters, or is too long"
    try:
        parts = urlsplit(text)
        port = parts.port
    except ValueError as exc:
        return f"the Prometheus URL does not parse: {exc}"
    if parts.scheme not in ("http", "https"):
        return "the Prometheus URL must start with http:// or https://"
    if not parts.hostname:
        return "the Prometheus URL names no host"
    if parts.username is not None or parts.password is not None:
        return ("no credentials in the Prometheus URL: CANARY_PROMETHEUS_BEARER_TOKEN_FILE "
                "or CANARY_PROMETHEUS_USER and CANARY_PROMETHEUS_PASSWORD_FILE")
    if parts.query or parts.fragment:
        return "the Prometheus URL takes no query or fragment"
    if port == 0:
        return "the Prometheus URL's port is 0"
    return None


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="CANARY_", extra="ignore")

    database_url: str = Field(
        default="sqlite:///canary.db",
        description="SQLAlchemy URL: postgresql+psycopg://… or sqlite:///file.db",
    )
    etcd: str = Field(
        default="memory://",
        description=ENDPOINTS_HELP,
    )

    @field_validator("etcd")
    @classmethod
    def _etcd_shape(cls, value: str) -> str:
        if value.strip().startswith("memory:"):
            return value  # the store factory says what is wrong with it, if anything
        try:
            parse_endpoints(value)
        except ConfigError as exc:
            raise ValueError(str(exc)) from None
        return value

    etcd_prefix: str = Field(default="/canary", description="prefix of every etcd key")
    redis_url: str = Field(
        default="memory://",
        description="redis://…, rediss://…, redis+cluster://host:port[,host:port…], "
        "rediss+cluster://…, or memory:// in-process",
    )
    redis_namespace: str = Field(
        default="canary", description="first segment of every Redis key (canary:…)"
    )
    listen: str = Field(default="127.0.0.1:8080", description="HOST:PORT the API serves on")
    api: str = Field(default="http://127.0.0.1:8080", description="API base URL for the CLI")
    log_level: str = Field(default="info")
    log_format: Literal["text", "json"] = Field(
        default="text", description="text lines, or one JSON object per line"
    )
    access_log: bool = Field(
        default=False,
        description="log every HTTP request the API answers (uvicorn's access lines); off: "
        "the dashboard's polls would bury the decision log (`canary_api_requests` counts "
        "them anyway)",
    )
    # tracing (OpenTelemetry over OTLP/HTTP); off unless an endpoint is configured here
    # or in the standard OTEL_EXPORTER_OTLP_[TRACES_]ENDPOINT
    otel_endpoint: str | None = Field(
        default=None,
        description="OTLP/HTTP collector base URL (traces go to <url>/v1/traces)",
    )
    otel_sample_ratio: float = Field(
        default=1.0, ge=0.0, le=1.0,
        description="share of new traces recorded; a request's sampled parent is followed",
    )

    @field_validator("otel_endpoint")
    @classmethod
    def _otel_endpoint_shape(cls, value: str | None) -> str | None:
        if value is None or value == "":
            return None
        return otlp_base_url(value)
    upstream_allow: str = Field(
        default="",
        description="hosts/CIDRs upstreams may name, comma-separated; empty = any host "
        "except link-local and cloud metadata addresses",
    )

    @field_validator("upstream_allow", "notify_allow")
    @classmethod
    def _allow_shape(cls, value: str) -> str:
        UpstreamPolicy.parse(value)
        return value

    @property
    def upstream_policy(self) -> UpstreamPolicy:
        return UpstreamPolicy.parse(self.upstream_allow)

    # notifications (webhooks)
    public_url: str = Field(
        default="",
        description="the control plane's address as people open it (links in "
        "notifications: <public_url>/ui/experiments/<id>); empty: notifications carry "
        "no link (the CLI's `api` setting is where the CLI looks, not where people do)",
    )
    notify_allow: str = Field(
        default="",
        description="hosts/CIDRs webhooks may name, comma-separated; empty = any host "
        "except link-local and cloud metadata addresses",
    )
    notify_timeout_sec: float = Field(
        default=10.0, gt=0, le=60, description="longest webhook exchange, connect included"
    )
    notify_max_attempts: int = Field(
        default=12, ge=1, le=100, description="attempts before a delivery is given up"
    )
    notify_max_age_sec: float = Field(
        default=24 * 3600.0, ge=60, le=7 * 24 * 3600.0,
        description="a delivery not done this long after its event is given up",
    )
    controller_shards: int = Field(
        default=0, ge=0, le=4096,
        description="0: one elected controller judges every experiment; N: the experiments "
        "fall into N virtual shards shared among the running replicas (decision 0057; "
        "every replica must say the same N)",
    )
    controller_lease_ttl: int = Field(
        default=5, ge=1, le=60,
        description="seconds a controller's lease outlives its last renewal: a dead "
        "replica's lead and shards are taken over within this plus about a second",
    )

    @field_validator("public_url")
    @classmethod
    def _public_url_shape(cls, value: str) -> str:
        if value:  # a browser's address: no h2c://, and not called an upstream
            split_upstream(value, what="the public", schemes=("http", "https"))
        return value

    @property
    def notify_policy(self) -> UpstreamPolicy:
        return UpstreamPolicy.parse(self.notify_allow, what="webhook",
                                    setting="CANARY_NOTIFY_ALLOW")

    @property
    def dashboard_base_url(self) -> str | None:
        """Where links to the dashboard point; None without a public_url."""
        return self.public_url or None

    @field_validator("etcd_prefix")
    @classmethod
    def _prefix_shape(cls, value: str) -> str:
        value = "/" + value.strip("/")
        if value == "/":
            raise ValueError("etcd prefix must not be empty")
        return value

    @field_validator("redis_namespace")
    @classmethod
    def _namespace_shape(cls, value: str) -> str:
        # the first segment of every Redis key: braces would break the Cluster hash
        # tags, and glob characters the stream scan
        if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_-]{0,31}", value):
            raise ValueError(
                "Redis namespace must be 1-32 letters, digits, '_' or '-', starting "
                "with a letter or digit"
            )
        return value

    @field_validator("listen")
    @classmethod
    def _listen_shape(cls, value: str) -> str:
        try:
            parse_host_port(value)
        except ConfigError as exc:  # pydantic reports only ValueError as a bad value
            raise ValueError(str(exc)) from None
        return value

    @property
    def listen_host_port(self) -> tuple[str, int]:
        return parse_host_port(self.listen)

    # TLS and backend credentials
    tls_cert: str | None = Field(default=None, description="API server certificate (PEM)")
    tls_key: str | None = Field(default=None, description="API server private key (PEM)")
    tls_client_ca: str | None = Field(
        default=None, description="CA of API client certificates; set: mTLS required"
    )
    ca_file: str | None = Field(default=None, description="CA the CLI trusts for the API")
    client_cert: str | None = Field(default=None, description="CLI client certificate (mTLS)")
    client_key: str | None = Field(default=None, description="CLI client key (mTLS)")
    etcd_ca_file: str | None = Field(default=None, description="CA of etcd's certificate")
    etcd_cert_file: str | None = Field(default=None, description="client certificate for etcd")
    etcd_key_file: str | None = Field(default=None, description="client key for etcd")
    etcd_user: str | None = Field(default=None, description="etcd user (auth enabled)")
    etcd_password: str | None = Field(default=None, repr=False, description="etcd password")
    etcd_password_file: str | None = Field(
        default=None, description="file holding the etcd password (wins over etcd_password)"
    )
    redis_ca_file: str | None = Field(default=None, description="CA of Redis's certificate")
    redis_cert_file: str | None = Field(default=None, description="client certificate for Redis")
    redis_key_file: str | None = Field(default=None, description="client key for Redis")
    redis_password_file: str | None = Field(
        default=None, description="file holding the Redis password (instead of in the URL)"
    )
    admin_token_file: str | None = Field(
        default=None, description="bearer token required by admin endpoints (except probes)"
    )
    bootstrap_admin_token_file: str | None = Field(
        default=None,
        description="file (e.g. a mounted Secret) holding an admin API token `canary serve` "
        "installs at start, hashed, idempotently: the first admin without database access",
    )
    partial_format: Literal[1, 2, 3, 4] = Field(
        default=4,
        description="how a collector writes its partial windows: 4, format 3 with its "
        "unit rows and distinct units written smaller (decision 0080); 3, the seconds "
        "that changed, a first byte paired with its total without what it shares with "
        "it (decision 0072); 2, the same written again (decision 0058); 1, the whole "
        "window; 3, 2 or 1 while readers older than format 4, 3 or 2 are still running "
        "in a rolling upgrade",
    )

    @field_validator("partial_format", mode="before")
    @classmethod
    def _partial_format_from_text(cls, value: object) -> object:
        # an environment variable is text, which a Literal of ints would refuse: the
        # rolling-upgrade setting (CANARY_PARTIAL_FORMAT=2) must be readable from one
        if isinstance(value, str) and value.strip() in ("1", "2", "3", "4"):
            return int(value.strip())
        return value
    # the metric provider (decision 0048): where rules' `metrics:` are read
    prometheus_url: str = Field(
        default="",
        description="Prometheus base URL, http:// or https:// (a path prefix allowed, no "
        "credentials); empty: no provider, rules' metrics read as no data",
    )
    prometheus_ca_file: str | None = Field(
        default=None, description="CA of Prometheus's certificate"
    )
    prometheus_cert_file: str | None = Field(
        default=None, description="client certificate for Prometheus"
    )
    prometheus_key_file: str | None = Field(default=None, description="client key for Prometheus")
    prometheus_bearer_token_file: str | None = Field(
        default=None, description="file holding a bearer token for Prometheus (re-read per query)"
    )
    prometheus_user: str | None = Field(default=None, description="Prometheus basic-auth user")
    prometheus_password_file: str | None = Field(
        default=None, description="file holding the basic-auth password (re-read per query)"
    )
    prometheus_timeout_sec: float = Field(
        default=2.0, gt=0, le=60, description="longest one Prometheus query may take, in all"
    )

    @field_validator("prometheus_url")
    @classmethod
    def _prometheus_url_shape(cls, value: str) -> str:
        problem = prometheus_url_problem(value)
        if problem:
            raise ValueError(problem)
        return value.strip().rstrip("/")

    # authentication
    trusted_hosts: str = Field(
        default="",
        description="Host header values answered, comma-separated (`*.example.com` "
        "allowed, `*` for any); empty: the listen host, localhost, 127.0.0.1 and ::1",
    )
    max_body_bytes: int = Field(
        default=1024 * 1024, ge=1, le=64 * 1024 * 1024, description="largest request body"
    )
    oidc_issuer: str = Field(default="", description="OIDC issuer (iss); empty: no OIDC")
    oidc_audience: str = Field(default="", description="the audience (aud) tokens must name")
    oidc_jwks_url: str = Field(default="", description="URL of the issuer's JWKS")
    oidc_jwks_file: str = Field(default="", description="a JWKS file, instead of the URL")
    oidc_jwks_timeout_sec: float = Field(
        default=5.0, gt=0, le=30, description="longest a JWKS fetch may take, in all"
    )
    oidc_algorithms: str = Field(
        default="RS256,ES256", description="accepted signature algorithms, comma-separated"
    )
    oidc_roles_claim: str = Field(
        default="roles", description="the claim holding the caller's roles or groups"
    )
    oidc_role_map: str = Field(
        default="",
        description="claim value=role pairs, comma-separated (e.g. sre=operator); the "
        "role names themselves always map to their role",
    )
    oidc_leeway_sec: int = Field(
        default=30, ge=0, le=300, description="clock skew allowed on exp/nbf/iat"
    )

    @property
    def oidc_enabled(self) -> bool:
        return bool(self.oidc_issuer)

    @property
    def trusted_host_list(self) -> list[str]:
        given = [h.strip().lower() for h in self.trusted_hosts.split(",") if h.strip()]
        if given:
            return given
        defaults = ["localhost", "127.0.0.1", "::1"]
        host = self.listen_host_port[0].lower()
        # a wildcard bind names no host a client would use: loopback names only
        if host not in ("0.0.0.0", "::", "") and host not in defaults:
            defaults.insert(0, host)
        return defaults
