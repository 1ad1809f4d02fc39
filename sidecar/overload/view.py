"""`GET /overload` on the admin endpoint: the state of overload protection as JSON.

One sidecar process answers `OverloadGuard.state()` (or `disabled_view()` while protection
is off). A supervisor reads each worker's answer over its admin socket, checks it
against the models below (a worker's bytes are parsed like any other input: strict,
bounded, unknown fields refused) and answers `merge_views()` of them: each worker's view as
it came, and the upstreams and shed counts summed over the workers.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from controlplane.kernel.overload import MAX_SOURCE_CHARS
from sidecar.overload.guard import MAX_GATES
from sidecar.overload.signals import FAILURES, FailureReason

MAX_VIEW_BYTES = 4 * 1024 * 1024
MAX_SHED_ENTRIES = 10_000
_NAME = 4096  # longer than any upstream URL or variant name the route allows

Count = int
LevelName = Literal["normal", "light", "heavy", "severe"]
_LEVELS: tuple[LevelName, ...] = ("normal", "light", "heavy", "severe")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


class UpstreamView(_Strict):
    upstream: str = Field(max_length=_NAME)
    level: LevelName
    limit: Count = Field(ge=0)
    estimate: float = Field(ge=0, allow_inf_nan=False)
    phase: Literal["measuring", "adapting"]
    min_rtt_ms: float | None = Field(ge=0, allow_inf_nan=False)
    sample_rtt_ms: float | None = Field(ge=0, allow_inf_nan=False)
    in_flight: Count = Field(ge=0)
    queued: Count = Field(ge=0)
    admitted: Count = Field(ge=0)
    queued_total: Count = Field(ge=0)
    level_changes: Count = Field(ge=0)
    pressure_level: LevelName = "normal"
    rate_level: LevelName = "normal"
    rate_rps: float | None = Field(default=None, ge=0, allow_inf_nan=False)


class ExternalView(_Strict):
    source: str = Field(max_length=MAX_SOURCE_CHARS)
    value: float | None = Field(allow_inf_nan=False)
    age_s: float | None = Field(ge=0, allow_inf_nan=False)
    fresh: bool
    level: LevelName
    reads: Count = Field(ge=0)
    failing: bool
    last_error: str | None = Field(max_length=_NAME)
    failures: dict[FailureReason, Count] = Field(max_length=len(FAILURES))


class ShedView(_Strict):
    variant: str = Field(max_length=_NAME)
    reason: str = Field(max_length=64)
    priority: Literal["low", "normal"]
    count: Count = Field(ge=0)


class OverloadView(_Strict):
    enabled: bool
    config: dict[str, Any] | None
    upstreams: list[UpstreamView] = Field(max_length=MAX_GATES)
    shed: list[ShedView] = Field(max_length=MAX_SHED_ENTRIES)
    external: ExternalView | None = None
    # how late the worker's event loop ran its timer, last read, in milliseconds
    loop_lag_ms: float | None = Field(default=None, ge=0, allow_inf_nan=False)


def disabled_view() -> dict[str, Any]:
    """The view while protection is off."""
    return {"enabled": False, "config": None, "upstreams": [], "shed": [], "external": None}


def parse_view(body: bytes) -> OverloadView:
    """A worker's answer; ValueError when it is not a view."""
    if len(body) > MAX_VIEW_BYTES:
        raise ValueError(f"overload view larger than {MAX_VIEW_BYTES} bytes")
    try:
        return OverloadView.model_validate(json.loads(body))
    except (json.JSONDecodeError, UnicodeDecodeError, ValidationError) as exc:
        first = str(exc).splitlines()[0]
        raise ValueError(f"not an overload view: {first}") from exc


_SUMMED = ("limit", "in_flight", "queued", "admitted", "queued_total", "level_changes")


def merge_views(views: Sequence[tuple[int, OverloadView | str]]) -> dict[str, Any]:
    """The supervisor's view of (worker index, its view or why it has none).

    Each worker learns its own limit for its share of the traffic, so limits, requests
    in flight and queues add up; the level is the highest any worker is at. Protection
    is `enabled` when every worker that answered has it on (each follows the etcd key
    on its own, so they may differ for a moment)."""
    workers: list[dict[str, Any]] = []
    upstreams: dict[str, dict[str, Any]] = {}
    shed: dict[tuple[str, str, str], int] = {}
    answered = [view for _, view in views if isinstance(view, OverloadView)]
    for index, view in views:
        if isinstance(view, str):
            workers.append({"worker": index, "error": view})
            continue
        workers.append({"worker": index, **view.model_dump(mode="json")})
        for gate in view.upstreams:
            total = upstreams.get(gate.upstream)
            if total is None:
                total = upstreams[gate.upstream] = {
                    "upstream": gate.upstream,
                    "level": gate.level,
                    "pressure_level": gate.pressure_level,
                    "rate_level": gate.rate_level,
                    "rate_rps": None,
                    "estimate": 0.0,
                    "workers": 0,
                    **dict.fromkeys(_SUMMED, 0),
                }
            for name in _SUMMED:
                total[name] += getattr(gate, name)
            total["estimate"] = round(total["estimate"] + gate.estimate, 3)
            total["workers"] += 1
            if _LEVELS.index(gate.level) > _LEVELS.index(total["level"]):
                total["level"] = gate.level
            for name in ("pressure_level", "rate_level"):
                if _LEVELS.index(getattr(gate, name)) > _LEVELS.index(total[name]):
                    total[name] = getattr(gate, name)
            if gate.rate_rps is not None:
                total["rate_rps"] = round((total["rate_rps"] or 0.0) + gate.rate_rps, 1)
        for entry in view.shed:
            key = (entry.variant, entry.reason, entry.priority)
            shed[key] = shed.get(key, 0) + entry.count
    config = next((v.config for v in answered if v.enabled), None)
    # each worker probes on its own: the merged view shows the one at the highest level
    externals = [v.external for v in answered if v.external is not None]
    external = max(externals, key=lambda e: _LEVELS.index(e.level), default=None)
    return {
        "enabled": bool(answered) and all(v.enabled for v in answered),
        "config": config,
        "upstreams": [upstreams[name] for name in sorted(upstreams)],
        "shed": [
            {"variant": v, "reason": r, "priority": p, "count": n}
            for (v, r, p), n in sorted(shed.items())
        ],
        "workers": workers,
        "external": None if external is None else external.model_dump(mode="json"),
    }
