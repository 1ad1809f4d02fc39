"""What a supervisor tells a worker: one JSON line on the worker's stdin.

The supervisor has validated every value before starting any worker; the worker
parses the line strictly all the same (unknown fields, wrong types and out-of-range
numbers are refused) and reads secrets from their files or environment itself, so no
secret travels in the line.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

MAX_SPEC_BYTES = 64 * 1024


class WorkerSpec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    index: int = Field(ge=0, le=4096)
    service: str = Field(min_length=1, max_length=63)
    host: str = Field(max_length=255)
    port: int = Field(ge=1, le=65535)
    # an inherited listening socket; None: bind host:port with SO_REUSEPORT
    listen_fd: int | None = Field(default=None, ge=0)
    admin_socket: str = Field(min_length=1, max_length=200)
    # Settings fields given as flags (CANARY_* from the environment fill in the rest)
    settings: dict[str, str] = Field(default_factory=dict)
    default_upstream: str | None = None
    force_header_enabled: bool = False
    connect_timeout: float = Field(gt=0)
    read_timeout: float = Field(gt=0)
    head_timeout: float = Field(gt=0)
    max_connections: int | None = Field(default=None, ge=1)
    max_tunnels: int | None = Field(default=None, ge=1)
    tunnel_idle_timeout: float = Field(gt=0)
    tls_handshake_timeout: float = Field(default=10.0, gt=0)
    max_connections_per_client: int | None = Field(default=None, ge=0)
    client_ipv6_prefix: int = Field(default=128, ge=32, le=128)
    max_headers: int = Field(default=100, ge=1, le=10_000)
    sample_keys_file: str | None = None
    tls_cert: str | None = None
    tls_key: str | None = None

    def to_line(self) -> bytes:
        return self.model_dump_json().encode() + b"\n"

    @classmethod
    def from_line(cls, line: bytes) -> WorkerSpec:
        if len(line) > MAX_SPEC_BYTES or not line.endswith(b"\n"):
            raise ValueError("the worker spec is not one line of at most 64 KiB")
        return cls.model_validate_json(line)
