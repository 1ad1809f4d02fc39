"""CanaryMiddleware around a tiny Starlette app: one sample per request."""

from __future__ import annotations

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response
from starlette.routing import Route

from controlplane.kernel.clock import FakeClock
from sidecar.asgi import CanaryMiddleware, Receive, Scope, Send


class Recorded:
    def __init__(self) -> None:
        self.samples: list[tuple[float, str | None, str, int, int, int]] = []
        self.first_bytes: list[int | None] = []

    def record(self, ts: float, experiment: str | None, variant: str, rt_us: int,
               outcome: int, unit_hash: int, first_byte_us: int | None = None) -> None:
        self.samples.append((ts, experiment, variant, rt_us, outcome, unit_hash))
        self.first_bytes.append(first_byte_us)


def make_app(clock: FakeClock) -> Starlette:
    async def ok(request: Request) -> Response:
        clock.advance(0.0123)  # the app "takes" 12.3 ms on the injected clock
        return PlainTextResponse("ok")

    async def missing(request: Request) -> Response:
        return PlainTextResponse("no", status_code=404)

    async def boom(request: Request) -> Response:
        raise RuntimeError("boom")

    return Starlette(routes=[Route("/ok", ok), Route("/missing", missing), Route("/boom", boom)])


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def recorded() -> Recorded:
    return Recorded()


@pytest.fixture
async def client(clock: FakeClock, recorded: Recorded) -> httpx.AsyncClient:
    app = CanaryMiddleware(make_app(clock), reporter=recorded, service="svc", clock=clock)
    return httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app, raise_app_exceptions=False),
        base_url="http://app",
    )


async def test_times_the_app_and_reads_variant_and_experiment(
    client: httpx.AsyncClient, recorded: Recorded, clock: FakeClock
) -> None:
    async with client:
        response = await client.get(
            "/ok", headers={"X-Canary-Variant": "canary", "X-Canary-Experiment": "7"}
        )
    assert response.text == "ok"
    assert recorded.samples == [(clock.now() - 0.0123, "7", "canary", 12300, 200, 0)]
    assert recorded.first_bytes == [12300]  # the head went out after the app's 12.3 ms


async def test_a_stream_records_its_first_byte_apart_from_its_total(
    clock: FakeClock, recorded: Recorded
) -> None:
    async def stream(scope: Scope, receive: Receive, send: Send) -> None:
        clock.advance(0.004)
        await send({"type": "http.response.start", "status": 200, "headers": []})
        for _ in range(3):
            clock.advance(0.5)  # the body trickles out, as events or tokens do
            await send({"type": "http.response.body", "body": b"data: x\n\n", "more_body": True})
        await send({"type": "http.response.body", "body": b""})

    app = CanaryMiddleware(stream, reporter=recorded, service="svc", clock=clock)
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://app") as client:
        await client.get("/events", headers={"X-Canary-Variant": "canary"})
    assert [s[3] for s in recorded.samples] == [1_504_000]
    assert recorded.first_bytes == [4_000]


async def test_the_status_comes_from_the_response_start(
    client: httpx.AsyncClient, recorded: Recorded
) -> None:
    async with client:
        await client.get("/missing", headers={"X-Canary-Variant": "baseline"})
    [(_, experiment, variant, _, outcome, _)] = recorded.samples
    assert (experiment, variant, outcome) == (None, "baseline", 404)


async def test_an_app_exception_records_a_500_and_propagates(
    clock: FakeClock, recorded: Recorded
) -> None:
    app = CanaryMiddleware(make_app(clock), reporter=recorded, service="svc", clock=clock)
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://app") as client:
        with pytest.raises(RuntimeError, match="boom"):
            await client.get("/boom", headers={"X-Canary-Variant": "canary"})
    assert [(s[2], s[4]) for s in recorded.samples] == [("canary", 500)]


async def test_untagged_requests_are_recorded_under_a_default_variant(
    client: httpx.AsyncClient, recorded: Recorded
) -> None:
    async with client:
        await client.get("/ok")
    assert recorded.samples[0][1:3] == (None, "untagged")


async def test_lifespan_and_other_scopes_pass_through(recorded: Recorded) -> None:
    seen: list[str] = []

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        seen.append(scope["type"])

    middleware = CanaryMiddleware(app, reporter=recorded, service="svc")
    await middleware({"type": "lifespan"}, None, None)  # type: ignore[arg-type]
    assert seen == ["lifespan"] and recorded.samples == []
