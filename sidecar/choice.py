"""The seam between the proxy and the routing side (assignment, samples).

The proxy asks a `Chooser` where each request goes and tells a `Recorder` how it
went; both are implemented elsewhere and injected, so the proxy knows nothing of
routes, etcd or Redis.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from controlplane.kernel.values import split_upstream

_DEFAULT_PORTS = {"http": 80, "https": 443}
# an upstream marked as speaking HTTP/2 (gRPC services do): h2c in clear text with prior
# knowledge, h2 over TLS; the scheme its requests carry is http or https
_HTTP2_SCHEMES = {"h2c": "http", "h2": "https"}


@dataclass(frozen=True, slots=True)
class Upstream:
    scheme: str  # "http" or "https"
    host: str
    port: int
    base_path: str  # "" or "/prefix" without trailing slash, prepended to the request path
    http2: bool = False  # speaks HTTP/2 (h2c:// or h2://), not HTTP/1.1

    @classmethod
    def parse(cls, url: str) -> Upstream:
        """Parse `http(s)|h2c|h2://host[:port][/prefix]` with the one URL and host
        parser every reader shares; raises ValueError naming the problem (never the
        URL, which may carry a password)."""
        parts = split_upstream(url)
        http2 = parts.scheme in _HTTP2_SCHEMES
        scheme = _HTTP2_SCHEMES.get(parts.scheme, parts.scheme)
        return cls(
            scheme=scheme,
            host=parts.host.name,
            port=parts.port if parts.port is not None else _DEFAULT_PORTS[scheme],
            base_path=parts.path.rstrip("/"),
            http2=http2,
        )

    @property
    def authority(self) -> str:
        """host[:port] as a Host header names it (default port left out)."""
        host = f"[{self.host}]" if ":" in self.host else self.host
        if self.port == _DEFAULT_PORTS[self.scheme]:
            return host
        return f"{host}:{self.port}"

    def __str__(self) -> str:
        scheme = ("h2" if self.scheme == "https" else "h2c") if self.http2 else self.scheme
        return f"{scheme}://{self.authority}{self.base_path}"


@dataclass(frozen=True, slots=True)
class Choice:
    experiment: str | None  # None when serving a default upstream without a route
    variant: str  # "baseline" / "canary" / "default"
    upstream: Upstream
    unit_hash: int  # 32-bit hash of the sticky unit, 0 when none


class NoRoute(Exception):
    """no route and no default upstream: the proxy answers 503"""


class Chooser(Protocol):
    def choose(self, headers: Mapping[str, str]) -> Choice:
        """Pick the variant for a request; header names lower-case. Raises NoRoute."""
        ...


# One request's sample: (ts, experiment, variant, rt_us, outcome, unit_hash,
# first_byte_us): first_byte_us is the time to the response head, <= rt_us (the
# whole time when the exchange ended without a head of its own).
Sample = tuple[float, str | None, str, int, int, int, int]


@dataclass(slots=True)
class SampleColumns:
    """Samples column by column, in order: sample i is (ts[i], experiments[i], …),
    the fields of a `Sample`. What the proxy hands over: it appends to each list as
    requests finish, and a recorder converts a whole column in one C loop, with no
    tuple built per sample nor taken apart again."""

    ts: list[float] = field(default_factory=list)
    experiments: list[str | None] = field(default_factory=list)
    variants: list[str] = field(default_factory=list)
    rt_us: list[int] = field(default_factory=list)
    outcomes: list[int] = field(default_factory=list)
    units: list[int] = field(default_factory=list)
    first_byte_us: list[int] = field(default_factory=list)

    @classmethod
    def of(cls, samples: Sequence[Sample]) -> SampleColumns:
        """The columns of `samples`; ValueError if one is not a 7-tuple."""
        if not samples:
            return cls()
        ts, experiments, variants, rt_us, outcomes, units, first = map(
            list, zip(*samples, strict=True)
        )
        return cls(ts, experiments, variants, rt_us, outcomes, units, first)

    def __len__(self) -> int:
        return len(self.ts)

    def rows(self, start: int = 0, stop: int | None = None) -> list[Sample]:
        """Samples start..stop as tuples."""
        return list(
            zip(
                self.ts[start:stop],
                self.experiments[start:stop],
                self.variants[start:stop],
                self.rt_us[start:stop],
                self.outcomes[start:stop],
                self.units[start:stop],
                self.first_byte_us[start:stop],
                strict=True,
            )
        )


class Recorder(Protocol):
    def record(
        self,
        ts: float,
        experiment: str | None,
        variant: str,
        rt_us: int,
        outcome: int,
        unit_hash: int,
        first_byte_us: int | None = None,
    ) -> None:
        """Never blocks, never raises; outcome = HTTP status, or codec.CONNECT_ERROR /
        TIMEOUT / ABORTED; first_byte_us None: the whole time (no separate head)."""
        ...

    def record_many(self, samples: Sequence[Sample]) -> None:
        """`record` for several samples, in order."""
        ...


class ColumnRecorder(Recorder, Protocol):
    def record_columns(self, columns: SampleColumns) -> None:
        """`record_many` for samples given column by column; what the proxy calls,
        every few milliseconds or few hundred requests, so the per-request cost stays
        small. It may keep the lists: the caller hands them over."""
        ...


def columns_recorder(recorder: Recorder) -> Callable[[SampleColumns], None]:
    """How to hand `recorder` samples column by column: its own `record_columns`,
    or, for a recorder without one, `record_many` with the samples as tuples."""
    record_columns: Callable[[SampleColumns], None] | None = getattr(
        recorder, "record_columns", None
    )
    if record_columns is not None:
        return record_columns
    return lambda columns: recorder.record_many(columns.rows())
