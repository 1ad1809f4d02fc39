"""One webhook request: signed, bounded in time and in what is read back, and never
following a redirect.

The receiver is untrusted: its answer is reduced to a status code (and a
`Retry-After` in seconds); at most RESPONSE_READ_MAX bytes of its body are read and
none is kept, so nothing it sends reaches the API, the logs or the database. The
whole exchange, slow answers included, is cut after `timeout_sec`. The URL's host is
checked against the notification policy again at each attempt, since the allow-list
may have changed since the subscription was made (host names are not resolved;
docs/security.md).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Final

import httpx

from controlplane.kernel.values import UpstreamPolicy, split_upstream, unprintable
from controlplane.notify.backoff import AttemptResult, parse_retry_after
from controlplane.notify.signing import (
    ATTEMPT_HEADER,
    DELIVERY_HEADER,
    EVENT_HEADER,
    signed_headers,
)

RESPONSE_READ_MAX: Final = 4096
USER_AGENT: Final = "canary-notify/1"


@dataclass(frozen=True)
class Outgoing:
    url: str
    secret: str
    body: bytes
    event_id: int
    delivery_id: int | None
    attempt: int


def _describe(exc: BaseException) -> str:
    # the class says what went wrong; the text may carry bytes of the peer's: keep it
    # short and printable
    text = str(exc)
    if unprintable(text) is not None:
        text = ""
    return f"{type(exc).__name__}: {text}"[:200] if text else type(exc).__name__


@dataclass
class WebhookSender:
    policy: UpstreamPolicy = field(default_factory=UpstreamPolicy)
    timeout_sec: float = 10.0
    connect_timeout_sec: float = 5.0
    transport: httpx.AsyncBaseTransport | None = None
    _client: httpx.AsyncClient | None = None

    def _http(self) -> httpx.AsyncClient:
        if self._client is None:
            self._client = httpx.AsyncClient(
                timeout=httpx.Timeout(self.timeout_sec, connect=self.connect_timeout_sec),
                follow_redirects=False,
                transport=self.transport,
                headers={"User-Agent": USER_AGENT},
            )
        return self._client

    async def close(self) -> None:
        if self._client is not None:
            await self._client.aclose()
            self._client = None

    def refusal(self, url: str) -> str | None:
        try:
            host = split_upstream(url).host
        except ValueError as exc:
            return str(exc)
        return self.policy.refusal(host)

    async def send(self, outgoing: Outgoing, *, timestamp: int) -> AttemptResult:
        refused = self.refusal(outgoing.url)
        if refused is not None:
            return AttemptResult(status=None, error=f"not sent: {refused}")
        headers = {
            "Content-Type": "application/json",
            EVENT_HEADER: str(outgoing.event_id),
            ATTEMPT_HEADER: str(outgoing.attempt),
            **signed_headers(outgoing.secret, timestamp, outgoing.body),
        }
        if outgoing.delivery_id is not None:
            headers[DELIVERY_HEADER] = str(outgoing.delivery_id)
        try:
            async with asyncio.timeout(self.timeout_sec):
                return await self._exchange(outgoing, headers)
        except TimeoutError:
            return AttemptResult(
                status=None, error=f"no complete answer within {self.timeout_sec:g}s"
            )
        except httpx.HTTPError as exc:
            return AttemptResult(status=None, error=_describe(exc))

    async def _exchange(self, outgoing: Outgoing, headers: dict[str, str]) -> AttemptResult:
        request = self._http().build_request(
            "POST", outgoing.url, content=outgoing.body, headers=headers
        )
        response = await self._http().send(request, stream=True)
        try:
            read = 0
            async for chunk in response.aiter_raw():
                read += len(chunk)
                if read >= RESPONSE_READ_MAX:
                    break  # what it says beyond this changes nothing
        finally:
            await response.aclose()
        return AttemptResult(
            status=response.status_code,
            retry_after_sec=parse_retry_after(response.headers.get("retry-after")),
        )
