"""A small synchronous client of the REST API v1, one method per endpoint.

Errors come back as one type, so the CLI prints one line for any of them:

    ClientError(status, title, detail, errors)    the API answered with an error
    └── ApiUnreachable                              no answer at all (status 0)

problem+json bodies (RFC 7807) are read field by field; any other error body (a proxy's
HTML page, say) still becomes a ClientError with the HTTP reason as its title.
"""

from __future__ import annotations

import contextlib
import re
import ssl
from collections.abc import Mapping, Sequence
from types import TracebackType
from typing import Any, Self
from urllib.parse import quote

import httpx

from controlplane.kernel.errors import CanaryError, ConfigError

Json = dict[str, Any]

DEFAULT_TIMEOUT_SEC = 10.0
EVENTS_PAGE = 500  # the API's largest page
WRITES = frozenset({"POST", "PUT", "PATCH", "DELETE"})
ACTIONS = ("start", "pause", "resume", "promote", "rollback", "abort")


class ClientError(CanaryError):
    """An error answer of the API, or no answer (status 0, see ApiUnreachable)."""

    def __init__(
        self,
        status: int,
        title: str,
        detail: str = "",
        errors: Sequence[Mapping[str, Any]] = (),
    ) -> None:
        self.status = status
        self.title = title
        self.detail = detail
        self.errors = list(errors)
        super().__init__(self.one_line())

    def one_line(self) -> str:
        text = self.title
        if self.errors:
            # the field errors say it all; the detail only summarises them
            fields = "; ".join(
                f"{'.'.join(str(p) for p in e.get('loc') or ())}: {e.get('msg', '')}"
                for e in self.errors
            )
            text = f"{text}: {fields}"
        elif self.detail and self.detail.lower() != self.title.lower():
            text = f"{text}: {self.detail}"
        return f"{text} [HTTP {self.status}]" if self.status else text


class ApiUnreachable(ClientError):
    def __init__(self, url: str, reason: str) -> None:
        super().__init__(0, f"cannot reach the canary API at {url}", reason)


def _problem(response: httpx.Response) -> ClientError:
    body: Any = None
    with contextlib.suppress(ValueError):
        body = response.json()
    if isinstance(body, dict):
        errors = body.get("errors")
        return ClientError(
            int(body.get("status") or response.status_code),
            str(body.get("title") or response.reason_phrase),
            str(body.get("detail") or ""),
            [e for e in errors if isinstance(e, dict)] if isinstance(errors, list) else (),
        )
    # not problem+json: keep the start of the text so the user sees what answered
    snippet = " ".join(response.text.split())[:200]
    return ClientError(response.status_code, response.reason_phrase or "error", snippet)


class CanaryClient:
    """REST API v1.

    token: the bearer token (an API token or an OIDC JWT); the API records who it
        names in the audit trail. `transport` lets tests route requests in-process.
    tls: the context for https:// (a private CA, a client certificate for mTLS);
        None verifies against the system's CAs.
    """

    def __init__(
        self,
        base_url: str,
        *,
        token: str | None = None,
        timeout: float = DEFAULT_TIMEOUT_SEC,
        transport: httpx.BaseTransport | None = None,
        tls: ssl.SSLContext | None = None,
    ) -> None:
        if not re.match(r"^https?://[^/\s]+", base_url):
            raise ConfigError(f"the API URL must be http(s)://HOST[:PORT], got {base_url!r}")
        self.base_url = base_url.rstrip("/")
        headers = {"Accept": "application/json, application/problem+json"}
        if token:
            headers["Authorization"] = f"Bearer {token}"
        self._http = httpx.Client(
            base_url=self.base_url, timeout=timeout, transport=transport, headers=headers,
            verify=tls if tls is not None else True,
        )

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def _request(
        self,
        method: str,
        path: str,
        *,
        json: Any = None,
        params: Mapping[str, str | int] | None = None,
    ) -> Any:
        # writes are always JSON, even without a body: the API refuses anything else
        headers = {"Content-Type": "application/json"} if method in WRITES else None
        try:
            response = self._http.request(method, path, json=json, params=params, headers=headers)
        except httpx.TimeoutException as exc:
            raise ApiUnreachable(self.base_url, f"no answer within {self._timeout()} s") from exc
        except httpx.TransportError as exc:
            raise ApiUnreachable(self.base_url, str(exc) or type(exc).__name__) from exc
        if response.is_error:
            raise _problem(response)
        if response.status_code == 204 or not response.content:
            return None
        try:
            return response.json()
        except ValueError as exc:
            raise ClientError(
                response.status_code, "the API answered with something other than JSON"
            ) from exc

    def _timeout(self) -> float | None:
        return self._http.timeout.read

    # experiments

    def create_experiment(self, body: Mapping[str, Any]) -> Json:
        result: Json = self._request("POST", "/v1/experiments", json=body)
        return result

    def list_experiments(
        self,
        *,
        service: str | None = None,
        state: str | None = None,
        limit: int | None = None,
        offset: int | None = None,
    ) -> Json:
        """One page: the API's `{items, total, limit, offset}`."""
        params = {
            key: value
            for key, value in (
                ("service", service),
                ("state", state),
                ("limit", limit),
                ("offset", offset),
            )
            if value is not None
        }
        result: Json = self._request("GET", "/v1/experiments", params=params)
        return result

    def get_experiment(self, experiment_id: int | str) -> Json:
        result: Json = self._request("GET", _experiment(experiment_id))
        return result

    def update_experiment(self, experiment_id: int | str, patch: Mapping[str, Any]) -> Json:
        result: Json = self._request("PATCH", _experiment(experiment_id), json=patch)
        return result

    def delete_experiment(self, experiment_id: int | str) -> None:
        self._request("DELETE", _experiment(experiment_id))

    def act(self, experiment_id: int | str, action: str, *, reason: str | None = None) -> Json:
        """POST one lifecycle action (start, pause, resume, promote, rollback, abort).

        The reason, when given, is recorded in the transition's event.
        """
        if action not in ACTIONS:
            raise ValueError(f"unknown action {action!r}")
        body = {"reason": reason} if reason else None
        result: Json = self._request("POST", f"{_experiment(experiment_id)}/{action}", json=body)
        return result

    def start(self, experiment_id: int | str, *, reason: str | None = None) -> Json:
        return self.act(experiment_id, "start", reason=reason)

    def pause(self, experiment_id: int | str, *, reason: str | None = None) -> Json:
        return self.act(experiment_id, "pause", reason=reason)

    def resume(self, experiment_id: int | str, *, reason: str | None = None) -> Json:
        return self.act(experiment_id, "resume", reason=reason)

    def promote(self, experiment_id: int | str, *, reason: str | None = None) -> Json:
        return self.act(experiment_id, "promote", reason=reason)

    def rollback(self, experiment_id: int | str, *, reason: str | None = None) -> Json:
        return self.act(experiment_id, "rollback", reason=reason)

    def abort(self, experiment_id: int | str, *, reason: str | None = None) -> Json:
        return self.act(experiment_id, "abort", reason=reason)

    def events_page(
        self, experiment_id: int | str, *, limit: int | None = None, offset: int | None = None
    ) -> Json:
        """One page of the audit trail, oldest first: `{items, total, limit, offset}`."""
        params = {k: v for k, v in (("limit", limit), ("offset", offset)) if v is not None}
        result: Json = self._request("GET", f"{_experiment(experiment_id)}/events", params=params)
        return result

    def events(self, experiment_id: int | str) -> list[Json]:
        """The whole audit trail, oldest first, page after page."""
        events: list[Json] = []
        while True:
            page = self.events_page(experiment_id, limit=EVENTS_PAGE, offset=len(events))
            items: list[Json] = page.get("items", [])
            events.extend(items)
            if not items or len(events) >= int(page.get("total", 0)):
                return events

    def latest_event(self, experiment_id: int | str) -> Json | None:
        """The newest event: two small reads (the total, then the last item)."""
        total = int(self.events_page(experiment_id, limit=1).get("total", 0))
        if total == 0:
            return None
        items: list[Json] = self.events_page(experiment_id, limit=1, offset=total - 1)["items"]
        return items[-1] if items else None

    # rules

    def put_rule(self, service: str, rule: Mapping[str, Any]) -> Json:
        result: Json = self._request("PUT", _rule(service), json=rule)
        return result

    def get_rule(self, service: str) -> Json:
        result: Json = self._request("GET", _rule(service))
        return result

    def recommend_rule(self, service: str) -> Json:
        result: Json = self._request("GET", f"{_rule(service)}/recommendation")
        return result

    # releases

    def releases(self, service: str, *, limit: int = 50, offset: int = 0) -> Json:
        result: Json = self._request(
            "GET", f"/v1/services/{quote(service, safe='')}/releases",
            params={"limit": limit, "offset": offset},
        )  # fmt: skip
        return result

    # overload protection

    def put_overload(self, service: str, config: Mapping[str, Any]) -> Json:
        result: Json = self._request("PUT", _overload(service), json=config)
        return result

    def get_overload(self, service: str) -> Json:
        result: Json = self._request("GET", _overload(service))
        return result

    def delete_overload(self, service: str) -> None:
        self._request("DELETE", _overload(service))

    # notifications

    def test_subscription(self, subscription_id: int) -> Json:
        """Have the API send a sample to the subscription: `{delivered, status, error}`."""
        result: Json = self._request("POST", f"{SUBSCRIPTIONS}/{int(subscription_id)}/test")
        return result

    def create_subscription(self, subscription: Mapping[str, Any]) -> Json:
        """Subscribe a webhook; the answer carries its full URL and secret, once."""
        result: Json = self._request("POST", SUBSCRIPTIONS, json=subscription)
        return result

    def delete_subscription(self, subscription_id: int) -> None:
        self._request("DELETE", f"{SUBSCRIPTIONS}/{int(subscription_id)}")

    def list_subscriptions(self, *, limit: int = 500) -> Json:
        result: Json = self._request("GET", SUBSCRIPTIONS, params={"limit": limit})
        return result

    def deliveries(
        self, *, experiment: int | None = None, status: str | None = None, limit: int = 50
    ) -> Json:
        """One page of deliveries, newest first."""
        params: dict[str, str | int] = {"limit": limit}
        if experiment is not None:
            params["experiment"] = experiment
        if status is not None:
            params["status"] = status
        result: Json = self._request("GET", "/v1/notifications/deliveries", params=params)
        return result


SUBSCRIPTIONS = "/v1/notifications/subscriptions"


def _experiment(experiment_id: int | str) -> str:
    return f"/v1/experiments/{quote(str(experiment_id), safe='')}"


def _rule(service: str) -> str:
    return f"/v1/services/{quote(service, safe='')}/rule"


def _overload(service: str) -> str:
    return f"/v1/services/{quote(service, safe='')}/overload"
