"""The Prometheus metric provider: instant queries over HTTP(S), and a metric's
evidence for both variants.

One `httpx.AsyncClient` per provider (its connections kept), TLS and credentials as
for the other backends (`kernel/backend_access.py`): the bearer token or basic-auth
password is read from its file at each query, so a rotation needs no restart, and
is never logged. Each query is bounded in time (the whole exchange, and Prometheus
is told the same bound) and in size, and its answer parsed strictly
(`prom_answer.py`); every failure is a `NoData` with a one-line reason, never an
exception out of `read`.

Both variants are read at the same evaluation time, concurrently.
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Callable
from typing import Final

import httpx

from controlplane.kernel.backend_access import PrometheusAccess
from controlplane.kernel.clock import Clock, SystemClock
from controlplane.kernel.errors import ConfigError
from controlplane.kernel.metric_specs import MetricKind, MetricSpec
from controlplane.kernel.tls import client_context
from controlplane.providers.evidence import MetricEvidence, Reading
from controlplane.providers.prom_answer import MAX_ANSWER_BYTES, NoData, one_line, parse_answer
from controlplane.providers.promql import render_query

QUERY_PATH: Final = "/api/v1/query"
# no compression: a small compressed body may inflate far past MAX_ANSWER_BYTES at once
_ASK: Final = {"Accept": "application/json", "Accept-Encoding": "identity"}

Outcome = Callable[[str], None]
DEFAULT_CONCURRENCY: Final = 8


def _ignore(outcome: str) -> None:
    return None


class PrometheusClient:
    """Instant queries against one Prometheus. `on_outcome` hears each query's outcome
    ("ok" or a NoData outcome), for the counters."""

    def __init__(
        self,
        access: PrometheusAccess,
        *,
        clock: Clock | None = None,
        on_outcome: Outcome = _ignore,
        slots: asyncio.Semaphore | None = None,
    ) -> None:
        self.access = access
        self.timeout_sec = access.timeout_sec
        self._clock = clock or SystemClock()
        self._on_outcome = on_outcome
        # shared with other clients' reads when given: at most so many queries at once
        self._slots = slots or asyncio.Semaphore(DEFAULT_CONCURRENCY)
        self._url = access.url.rstrip("/") + QUERY_PATH
        verify: ssl.SSLContext | bool = True
        if access.url.startswith("https://"):
            verify = client_context(
                ca_file=access.ca_file,
                cert_file=access.cert_file,
                key_file=access.key_file,
                what="CANARY_PROMETHEUS",
            )
        self._http = httpx.AsyncClient(
            timeout=httpx.Timeout(access.timeout_sec),
            follow_redirects=False,  # a redirect could carry the credentials elsewhere
            verify=verify,
            trust_env=False,  # the configured URL, not a proxy from the environment
        )

    async def aclose(self) -> None:
        await self._http.aclose()

    async def value(self, query: str, at: float) -> float:
        """The query's one value at epoch time `at`, or NoData. The timeout runs from
        when the query holds a slot, not while it waits for one."""
        try:
            async with self._slots:
                value = await self._value(query, at)
        except NoData as exc:
            self._on_outcome(exc.outcome)
            raise
        self._on_outcome("ok")
        return value

    async def _value(self, query: str, at: float) -> float:
        timeout = self.timeout_sec
        headers = dict(_ASK)
        auth: tuple[str, str] | None = None
        try:
            token = self.access.bearer_token()
            if token is not None:
                headers["Authorization"] = f"Bearer {_header_safe(token)}"
            if self.access.user is not None:
                auth = (self.access.user, self.access.password() or "")
        except ConfigError as exc:  # names the file, never the secret
            raise NoData("credentials", one_line(str(exc))) from None
        # seconds as a plain number: Prometheus refuses a fractional "0.5s"
        form = {"query": query, "time": f"{at:.3f}", "timeout": f"{timeout:.3f}"}
        try:
            async with asyncio.timeout(timeout):
                async with self._http.stream(
                    "POST", self._url, data=form, headers=headers, auth=auth
                ) as answer:
                    body = await _bounded_body(answer)
                    status = answer.status_code
        except TimeoutError:
            raise NoData("timeout", f"timed out after {timeout:g} s") from None
        except httpx.TimeoutException:
            raise NoData("timeout", f"timed out after {timeout:g} s") from None
        except httpx.HTTPError as exc:
            detail = one_line(f"{type(exc).__name__}: {exc}", 160)
            raise NoData("unreachable", f"prometheus unreachable: {detail}") from None
        except ssl.SSLError as exc:
            detail = one_line(str(exc), 160)
            raise NoData("unreachable", f"prometheus unreachable: TLS: {detail}") from None
        return parse_answer(status, body)

    async def read(
        self, spec: MetricSpec, variants: tuple[str, str], window_sec: int
    ) -> MetricEvidence:
        """The metric for (baseline, canary) = `variants`, both at the same instant.
        Queries are listed canary first, then baseline (a ratio: bad, then total)."""
        at = self._clock.now()
        baseline, canary = variants
        try:
            canary_queries = _queries(spec, canary, window_sec)
            baseline_queries = _queries(spec, baseline, window_sec)
        except ValueError as exc:  # the rule checks refuse such a query: never sent
            reading = Reading.missing(one_line(str(exc)))
            return MetricEvidence(spec.name, reading, reading, at)
        canary_reading, baseline_reading = await asyncio.gather(
            self._reading(spec, canary_queries, at), self._reading(spec, baseline_queries, at)
        )
        return MetricEvidence(
            spec.name, canary_reading, baseline_reading, at, canary_queries + baseline_queries
        )

    async def _reading(self, spec: MetricSpec, queries: tuple[str, ...], at: float) -> Reading:
        if spec.kind is MetricKind.RATIO:
            bad_query, total_query = queries
            answers = await asyncio.gather(
                self.value(bad_query, at), self.value(total_query, at), return_exceptions=True
            )
            bad, total = answers
            if isinstance(bad, NoData) and bad.outcome == "empty":
                # a counter labelled by error code has no series before its first
                # error: no series of bad events beside a total is zero of them
                bad = 0.0
            for answer, which in ((bad, "bad events"), (total, "total")):
                if isinstance(answer, NoData):
                    return Reading.missing(f"{which}: {answer.reason}")
                if isinstance(answer, BaseException):
                    raise answer
            assert isinstance(bad, float) and isinstance(total, float)
            return ratio_reading(bad, total)
        try:
            return Reading(await self.value(queries[0], at))
        except NoData as exc:
            return Reading.missing(exc.reason)


def ratio_reading(bad: float, total: float) -> Reading:
    """bad/total, or no data when the counts cannot make a ratio."""
    if bad < 0 or total < 0:
        return Reading.missing(f"a negative count (bad {bad:g}, total {total:g})")
    if total == 0:
        return Reading.missing("no events in the window (total 0)")
    if bad > total:
        return Reading.missing(
            f"bad events ({bad:g}) above the total ({total:g}): the two queries disagree"
        )
    return Reading(bad / total, bad=bad, total=total)


def _queries(spec: MetricSpec, variant: str, window_sec: int) -> tuple[str, ...]:
    if spec.kind is MetricKind.RATIO:
        assert spec.total_query is not None  # MetricSpec requires it for a ratio
        return (
            render_query(spec.query, variant, window_sec),
            render_query(spec.total_query, variant, window_sec),
        )
    return (render_query(spec.query, variant, window_sec),)


def _header_safe(token: str) -> str:
    if not token.isascii() or not token.isprintable():
        raise ConfigError("CANARY_PROMETHEUS_BEARER_TOKEN_FILE: the token is not printable ASCII")
    return token


async def _bounded_body(answer: httpx.Response) -> bytes:
    """The body, refused as soon as it passes MAX_ANSWER_BYTES (declared or streamed)."""
    if answer.headers.get("content-encoding", "identity").lower() != "identity":
        raise NoData("bad_answer", "prometheus's answer came compressed though asked not to be")
    declared = answer.headers.get("content-length", "")
    too_large = NoData(
        "too_large",
        f"the answer is larger than {MAX_ANSWER_BYTES} bytes (many series? add a sum()/max())",
    )
    if declared.isdigit() and int(declared) > MAX_ANSWER_BYTES:
        raise too_large
    body = bytearray()
    async for chunk in answer.aiter_raw():
        body += chunk
        if len(body) > MAX_ANSWER_BYTES:
            raise too_large
    return bytes(body)


__all__ = ["PrometheusClient", "ratio_reading", "render_query"]
