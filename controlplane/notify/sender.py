"""One webhook request: signed, bounded in time and in what is read back, and never
following a redirect.

The receiver is untrusted: its answer is reduced to a status code (and a
`Retry-After` in seconds); at most RESPONSE_READ_MAX bytes of its body are read and
none is kept, so nothing it sends reaches the API, the logs or the database. The
whole exchange, slow answers included, is cut after `timeout_sec`. The URL's host is
checked against the notification policy again at each attempt, since the allow-list
may have changed since the subscription was made, and the addresses its name
resolves to are checked when the socket connects (controlplane.notify.connect).

`send` never raises (but for cancellation): whatever goes wrong is a failed attempt
with its reason, which the dispatcher records and retries.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
from dataclasses import dataclass, field
from typing import Final

import httpx

from controlplane.kernel.hosts import Host, IPAddress, parse_host
from controlplane.kernel.values import UpstreamPolicy, split_webhook, unprintable
from controlplane.notify.backoff import AttemptResult, parse_retry_after
from controlplane.notify.connect import (
    CheckedBackend,
    CheckedTransport,
    RefusedAddress,
    Resolver,
    system_resolver,
)
from controlplane.notify.signing import (
    ATTEMPT_HEADER,
    DELIVERY_HEADER,
    EVENT_HEADER,
    signed_headers,
)

log = logging.getLogger(__name__)

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


def _headers(outgoing: Outgoing, timestamp: int) -> dict[str, str]:
    headers = {
        "Content-Type": "application/json",
        EVENT_HEADER: str(outgoing.event_id),
        ATTEMPT_HEADER: str(outgoing.attempt),
        **signed_headers(outgoing.secret, timestamp, outgoing.body),
    }
    if outgoing.delivery_id is not None:
        headers[DELIVERY_HEADER] = str(outgoing.delivery_id)
    return headers


def _same_host(ours: Host, theirs: str) -> bool:
    if ours.address is not None:
        try:
            return ours.address == ipaddress.ip_address(theirs)
        except ValueError:
            return False
    return ours.name == theirs.lower()


def sendable_url(url: str) -> tuple[Host, httpx.URL]:
    """The URL's host, and the URL as the HTTP client will send it, once our parser and
    the client's agree on that host; raises ValueError (never echoing the URL)."""
    host = split_webhook(url).host
    try:
        parsed = httpx.URL(url)
    except (httpx.InvalidURL, ValueError, TypeError, UnicodeError):
        raise ValueError("webhook URL cannot be parsed by the HTTP client") from None
    if not _same_host(host, parsed.host):
        raise ValueError("webhook URL host is read differently by the HTTP client")
    return host, parsed


@dataclass
class WebhookSender:
    policy: UpstreamPolicy = field(
        default_factory=lambda: UpstreamPolicy(what="webhook", setting="CANARY_NOTIFY_ALLOW")
    )
    timeout_sec: float = 10.0
    connect_timeout_sec: float = 5.0
    # where names are looked up: an edge tests replace to control what a name resolves to
    resolve: Resolver = system_resolver
    _client: httpx.AsyncClient | None = None

    def _http(self) -> httpx.AsyncClient:
        if self._client is None:
            backend = CheckedBackend(self._connect_refusal, resolve=self.resolve)
            self._client = httpx.AsyncClient(
                timeout=httpx.Timeout(self.timeout_sec, connect=self.connect_timeout_sec),
                follow_redirects=False,
                transport=CheckedTransport(backend, httpx.create_ssl_context()),
                headers={"User-Agent": USER_AGENT},
            )
        return self._client

    async def close(self) -> None:
        if self._client is not None:
            await self._client.aclose()
            self._client = None

    def refusal(self, url: str) -> str | None:
        """Why `url` may not be sent to, or None: the check the API makes on a
        subscription, and the sender again before each attempt."""
        try:
            host, _ = sendable_url(url)
        except ValueError as exc:
            return str(exc)
        return self.policy.refusal(host)

    def _connect_refusal(self, host: str, address: IPAddress) -> str | None:
        try:
            named = parse_host(host)
        except ValueError as exc:
            return f"{self.policy.what} {exc}"
        return self.policy.address_refusal(named, address)

    async def send(self, outgoing: Outgoing, *, timestamp: int) -> AttemptResult:
        try:
            refused = self.refusal(outgoing.url)
            if refused is not None:
                return AttemptResult(status=None, error=f"not sent: {refused}", refused=True)
            async with asyncio.timeout(self.timeout_sec):
                return await self._exchange(outgoing, _headers(outgoing, timestamp))
        except TimeoutError:
            return AttemptResult(
                status=None, error=f"no complete answer within {self.timeout_sec:g}s"
            )
        except RefusedAddress as exc:
            return AttemptResult(status=None, error=f"not sent: {exc.reason}", refused=True)
        except httpx.HTTPError as exc:
            return AttemptResult(status=None, error=_describe(exc))
        except Exception as exc:
            # a failure no one foresaw is still one failed attempt, retried: never a
            # delivery stuck unrecorded, never a 500 from the test send
            log.warning("webhook send failed unexpectedly", exc_info=True)
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
