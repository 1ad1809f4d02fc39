"""The two scenarios, driven through the REST API as a release manager would.

    PUT the service's rule → POST the experiment → POST start → watch until it ends

A scenario only ever talks to the API (and, to show what users see, reads the
collector's snapshots and the routes in the KV store). The canary's degradation is
the one thing it does behind the control plane's back: it slows the upstream down.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import httpx

from controlplane.collector.sharding import read_merged_snapshots
from controlplane.demo.load import LoadGenerator
from controlplane.demo.upstreams import UpstreamServer
from controlplane.kernel.errors import CanaryError, ValidationFailed
from controlplane.kernel.keys import EtcdKeys
from controlplane.kernel.kv import EventKind, KeyValueStore
from controlplane.kernel.routes import CANARY, Route, RouteState, parse_route
from controlplane.kernel.snapshots import WindowSnapshot
from controlplane.kernel.streams import SnapshotBoard

SERVICE = "demo-shop"
ACTOR = "release-manager"  # the name of the demo's API token, as the trail shows it
TERMINAL = frozenset({"promoted", "rolled_back", "aborted"})
POLL_SEC = 0.25
THRESHOLD_MS = 500
# after the route cut, wait this long before reading the last request that reached
# the canary: by then every request sent before the cut has been answered
CUT_SETTLE_SEC = 1.0


class DemoError(CanaryError):
    """The demo could not drive the API (an error answer or none)."""


@dataclass(frozen=True)
class Timing:
    """The knobs that set how long a scenario takes."""

    hold_sec: int
    window_sec: int
    cooldown_sec: float
    min_samples: int
    timeout_sec: float

    @classmethod
    def for_mode(cls, *, quick: bool) -> Timing:
        if quick:
            return cls(hold_sec=4, window_sec=3, cooldown_sec=3, min_samples=40, timeout_sec=60)
        return cls(hold_sec=9, window_sec=5, cooldown_sec=5, min_samples=50, timeout_sec=150)


def rule_body(timing: Timing) -> dict[str, Any]:
    """The breaker rule for demo-shop.

    The healthy profiles' P95 is about 130 ms and x5 puts it near 650 ms (a quarter of
    the degraded responses above 500 ms, against the 5 % P95 allows), so 500 ms
    separates them clearly. The half-open probe sends 10 %: at 200 requests/s that
    is enough for min_samples within one window, so the probe is judged promptly.
    consecutive_breaches stays at the decision core's default.
    """
    return {
        "threshold_ms": THRESHOLD_MS,
        "percentile": 95,
        "window_sec": timing.window_sec,
        "failure_ratio": 0.3,
        "cooldown_sec": timing.cooldown_sec,
        "min_samples": timing.min_samples,
        "max_trips": 2,
        "half_open_weight": 1000,
        "action": "stop",
    }


@dataclass
class ScenarioSpec:
    key: str
    title: str
    expected: str
    baseline: UpstreamServer
    canary: UpstreamServer
    steps: tuple[float, ...] = (10, 25, 50, 100)
    # the canary slows down when the experiment reaches this step index (None: never)
    degrade_at_step: int | None = None
    degrade_factor: float = 5.0


@dataclass
class EventLine:
    at: float
    kind: str
    reason: str


@dataclass
class ScenarioProgress:
    """What the view shows of one scenario, updated by its runner."""

    spec: ScenarioSpec
    status: str = "waiting"
    experiment_id: int | None = None
    state: str | None = None
    current_step: int = -1
    canary_weight_bp: int = 0
    breaker_state: str = "closed"
    trips: int = 0
    snapshots: dict[str, WindowSnapshot] = field(default_factory=dict)
    events: list[EventLine] = field(default_factory=list)
    started_at: float | None = None
    finished_at: float | None = None
    degraded_at: float | None = None
    tripped_at: float | None = None
    cut_at: float | None = None
    last_canary_request_at: float | None = None
    error: str | None = None

    @property
    def elapsed(self) -> float | None:
        if self.started_at is None:
            return None
        return (self.finished_at or time.time()) - self.started_at

    @property
    def as_expected(self) -> bool:
        return self.state == self.spec.expected


class ReleaseManager:
    """The few REST calls a release manager makes, on an async HTTP client."""

    def __init__(self, http: httpx.AsyncClient) -> None:
        self.http = http

    async def _call(self, method: str, path: str, body: Any = None, **params: Any) -> Any:
        try:
            response = await self.http.request(
                method, path, json=body, params=params or None,
            )  # fmt: skip
        except httpx.HTTPError as exc:
            raise DemoError(f"{method} {path}: no answer from the API ({exc})") from exc
        if response.is_error:
            detail = response.text[:300]
            with contextlib.suppress(ValueError):
                problem = response.json()
                detail = problem.get("detail") or problem.get("title") or detail
            raise DemoError(f"{method} {path}: HTTP {response.status_code}: {detail}")
        return response.json() if response.content else None

    async def put_rule(self, service: str, rule: dict[str, Any]) -> Any:
        return await self._call("PUT", f"/v1/services/{service}/rule", rule)

    async def create(self, body: dict[str, Any]) -> dict[str, Any]:
        created: dict[str, Any] = await self._call("POST", "/v1/experiments", body)
        return created

    async def act(self, experiment_id: int, action: str, reason: str = "") -> dict[str, Any]:
        done: dict[str, Any] = await self._call(
            "POST", f"/v1/experiments/{experiment_id}/{action}", {"reason": reason}
        )
        return done

    async def get(self, experiment_id: int) -> dict[str, Any]:
        got: dict[str, Any] = await self._call("GET", f"/v1/experiments/{experiment_id}")
        return got

    async def events(self, experiment_id: int, offset: int) -> list[dict[str, Any]]:
        page = await self._call(
            "GET", f"/v1/experiments/{experiment_id}/events", limit=100, offset=offset
        )
        items: list[dict[str, Any]] = page["items"]
        return items


class RouteLog:
    """Every route written for the service, with the wall-clock time it was seen."""

    def __init__(self, kv: KeyValueStore, keys: EtcdKeys, service: str) -> None:
        self.kv = kv
        self.key = keys.route(service)
        self.seen: list[tuple[float, Route]] = []
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> None:
        items, revision = await self.kv.get_prefix(self.key)
        for item in items:
            if item.key == self.key:
                self._add(item.value)
        self._task = asyncio.create_task(self._follow(revision), name="demo-routes")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    def _add(self, value: bytes) -> None:
        with contextlib.suppress(ValidationFailed):
            self.seen.append((time.time(), parse_route(value)))

    async def _follow(self, revision: int) -> None:
        # events after `revision`: the read above covers everything up to it
        while True:
            try:
                async for event in self.kv.watch_prefix(self.key, start_revision=revision):
                    revision = max(revision, event.mod_revision)
                    if event.key == self.key and event.kind == EventKind.PUT and event.value:
                        self._add(event.value)
            except asyncio.CancelledError:
                raise
            except Exception:  # a broken watch (etcd restart): follow again shortly
                await asyncio.sleep(0.5)

    def first_cut(self, experiment_id: int, after: float) -> float | None:
        """When the experiment's route first sent the canary nothing, after `after`."""
        for at, route in self.seen:
            ours = str(route.experiment) == str(experiment_id)
            # a promoted route has no canary either: the canary is the stable version
            cut = route.weight_of(CANARY) == 0 and route.state is not RouteState.PROMOTED
            if at >= after and ours and cut:
                return at
        return None


def _epoch(text: str) -> float:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


class ScenarioRunner:
    """Runs one scenario to its end, keeping `progress` current for the view."""

    def __init__(
        self,
        spec: ScenarioSpec,
        *,
        api: ReleaseManager,
        board: SnapshotBoard | None,
        routes: RouteLog,
        load: LoadGenerator,
        timing: Timing,
        service: str = SERVICE,
        say: Callable[[str], None] = lambda line: None,
    ) -> None:
        self.spec = spec
        self.service = service
        self.api = api
        self.board = board
        self.routes = routes
        self.load = load
        self.timing = timing
        self.say = say
        self.progress = ScenarioProgress(spec)

    def experiment_body(self) -> dict[str, Any]:
        spec = self.spec
        return {
            "name": f"demo: {spec.canary.name} ({spec.title})",
            "service": self.service,
            "variants": {
                "baseline": {"upstream": spec.baseline.url},
                "canary": {"upstream": spec.canary.url},
            },
            "steps": [{"weight_pct": w, "hold_sec": self.timing.hold_sec} for w in spec.steps],
            "sticky": {"header": "x-user-id"},
        }

    async def run(self) -> ScenarioProgress:
        progress = self.progress
        spec = self.spec
        progress.status = "running"
        progress.started_at = time.time()
        try:
            await self.api.put_rule(self.service, rule_body(self.timing))
            created = await self.api.create(self.experiment_body())
            progress.experiment_id = int(created["id"])
            self.say(
                f"[{spec.key}] experiment {progress.experiment_id}: {spec.baseline.name} → "
                f"{spec.canary.name}, steps {' / '.join(f'{w:g}%' for w in spec.steps)}"
            )
            await self.api.act(progress.experiment_id, "start", "demo")
            await self._watch(progress.experiment_id)
        except DemoError as exc:
            progress.error = str(exc)
            self.say(f"[{spec.key}] {exc}")
        except asyncio.CancelledError:
            # interrupted: end the experiment as a release manager would, so it does
            # not stay active (on real backends it would block the next run)
            await self._abort_quietly("demo interrupted")
            raise
        finally:
            progress.finished_at = time.time()
            progress.status = "done"
            spec.canary.profile.restore()
        return progress

    async def _abort_quietly(self, reason: str) -> None:
        experiment_id = self.progress.experiment_id
        if experiment_id is None or self.progress.state in TERMINAL:
            return
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self.api.act(experiment_id, "abort", reason), timeout=3)

    async def _watch(self, experiment_id: int) -> None:
        progress = self.progress
        deadline = time.monotonic() + self.timing.timeout_sec
        while True:
            await self.refresh(experiment_id)
            self._maybe_degrade()
            self._track_cut(experiment_id)
            if progress.state in TERMINAL:
                self.say(f"[{self.spec.key}] finished: {progress.state}")
                return
            if time.monotonic() > deadline:
                progress.error = f"no verdict within {self.timing.timeout_sec:g}s"
                self.say(f"[{self.spec.key}] {progress.error}: aborting it")
                await self._abort_quietly("demo timed out")
                await self.refresh(experiment_id)
                return
            await asyncio.sleep(POLL_SEC)

    async def refresh(self, experiment_id: int) -> None:
        progress = self.progress
        data = await self.api.get(experiment_id)
        before = (progress.state, progress.current_step, progress.breaker_state)
        progress.state = data["state"]
        progress.current_step = int(data["current_step"])
        progress.canary_weight_bp = int(data["canary_weight_bp"])
        progress.breaker_state = data["breaker_state"]
        progress.trips = int(data["trips"])
        after = (progress.state, progress.current_step, progress.breaker_state)
        if after != before:
            step = f"step {progress.current_step + 1}/{len(self.spec.steps)}"
            self.say(
                f"[{self.spec.key}] {progress.state}, {step}, canary "
                f"{progress.canary_weight_bp / 100:g}%, breaker {progress.breaker_state}"
            )
        for item in await self.api.events(experiment_id, len(progress.events)):
            # the event in words, when the API says it (decision 0052)
            told = item.get("summary") or item["reason"]
            line = EventLine(_epoch(item["at"]), item["kind"], told)
            progress.events.append(line)
            if line.kind == "tripped" and progress.tripped_at is None:
                progress.tripped_at = line.at
            self.say(f"[{self.spec.key}] event {line.kind}: {line.reason}")
        if self.board is not None:
            with contextlib.suppress(CanaryError):
                progress.snapshots = await read_merged_snapshots(
                    self.board, str(experiment_id), time.time()
                )

    def _maybe_degrade(self) -> None:
        spec, progress = self.spec, self.progress
        if (
            spec.degrade_at_step is not None
            and progress.degraded_at is None
            and progress.state == "running"
            and progress.current_step >= spec.degrade_at_step
        ):
            spec.canary.profile.degrade(spec.degrade_factor)
            progress.degraded_at = time.time()
            self.say(f"[{spec.key}] {spec.canary.name} degrades: latency x{spec.degrade_factor:g}")

    def _track_cut(self, experiment_id: int) -> None:
        progress = self.progress
        if progress.degraded_at is None:
            return
        if progress.cut_at is None:
            progress.cut_at = self.routes.first_cut(experiment_id, progress.degraded_at)
        if (
            progress.cut_at is not None
            and progress.last_canary_request_at is None
            and time.time() >= progress.cut_at + CUT_SETTLE_SEC
        ):
            progress.last_canary_request_at = self.load.last_sent_to.get(CANARY)
