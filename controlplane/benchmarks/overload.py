"""`canary bench overload`: goodput of an overloaded upstream behind the sidecar, with
overload protection on and off.

The upstream (`capacity_upstream`, its own process) serves 8 requests at once for
10 ms each and queues the rest without a bound: its capacity is 800 requests/s. The
whole sidecar (`canary sidecar --workers 1`, its default upstream, protection from
`<prefix>/overload/<service>` in etcd with the shipped defaults) stands in front of
it. An open-loop generator (`open_loop`, its own process; clients give up after 1 s)
offers 0.5x, 1x, 2x and 4x the capacity, each run with protection off and then on
(a fresh guard each time, learning during the warm-up). Per run:

- goodput: answers 200 within the 100 ms SLO per second, and as a share of capacity;
- P50/P99 of the admitted requests (answered 200), from the scheduled send time;
- what the sidecar shed, by reason (its `/overload` view, warm-up excluded);
- the generator's own achieved rate and send lag.

Then the unloaded P99 (0.1x, protection off) for reference, and a step change: at 1x,
protection on, the upstream's concurrency halves mid-run (8 -> 4); the sidecar's limit
is read from `/overload` every 100 ms. Reported: when the limit's mean over the second
before each sample stays within 20% of the new sustainable concurrency to the end of
the run (the target), and when every single sample does. A limit learned from latency
has to try one more than the upstream serves to find that it is too many, so a limit
settled at 4 visits 5 for an interval now and then: the second's mean says whether it
settled, a single sample whether it ever probes.
"""

from __future__ import annotations

import asyncio
import contextlib
import http.client
import json
import os
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from controlplane.benchmarks.sidecar import (
    HOST,
    _free_port,
    _process,
    _raise_priority,
    _say,
    _wait_ready,
)

CONCURRENCY = 8
SERVICE_MS = 10.0
CAPACITY_RPS = CONCURRENCY * 1000 / SERVICE_MS
HALVED = CONCURRENCY // 2
SLO_S = 0.1
CLIENT_TIMEOUT_S = 1.0
LOADS = (0.5, 1.0, 2.0, 4.0)
UNLOADED = 0.1
POLL_S = 0.1
GENERATOR_START_S = 1.5  # the generator's process starts (imports) within this
SERVICE = "bench-overload"
PROTECTION: dict[str, Any] = {}  # the shipped defaults (controlplane.kernel.overload)

TARGET_GOODPUT_SHARE = 0.9  # at 2x and 4x, protection on
TARGET_P99_VS_UNLOADED = 2.0  # P99 of admitted at 4x, protection on
TARGET_ADDED_P99_MS = 1.0  # protection on vs off at 0.5x (the sidecar's own budget)
TARGET_ADAPT_S = 5.0
ADAPT_BAND = 0.2
ADAPT_WINDOW_S = 1.0  # the limit's mean over this long, for the adapt target


@dataclass(frozen=True)
class Durations:
    warmup_s: float
    measure_s: float
    step_before_s: float
    step_after_s: float


QUICK = Durations(warmup_s=0.5, measure_s=1.0, step_before_s=1.0, step_after_s=1.5)
FULL = Durations(warmup_s=2.0, measure_s=8.0, step_before_s=5.0, step_after_s=10.0)


@dataclass(frozen=True)
class Stack:
    upstream_port: int
    proxy_port: int
    admin_port: int
    etcd: str
    key: str


# --- talking to the parts -------------------------------------------------------


def _get_json(port: int, path: str, method: str = "GET") -> Any:
    conn = http.client.HTTPConnection(HOST, port, timeout=5)
    try:
        conn.request(method, path)
        answer = conn.getresponse()
        body = answer.read()
        if answer.status != 200:
            raise RuntimeError(f"{method} {path}: {answer.status} {body[:200]!r}")
        return json.loads(body) if body.startswith((b"{", b"[")) else None
    finally:
        conn.close()


def _overload(stack: Stack) -> dict[str, Any]:
    view: dict[str, Any] = _get_json(stack.admin_port, "/overload")
    return view


def _until(check: Callable[[], bool], what: str, timeout: float = 30) -> float:
    """Seconds waited until `check()`."""
    started = time.monotonic()
    while not check():
        if time.monotonic() - started > timeout:
            raise TimeoutError(f"not within {timeout} s: {what}")
        time.sleep(0.02)
    return time.monotonic() - started


def _protection(stack: Stack, on: bool) -> None:
    """Protection off; and when `on`, on again with a fresh guard (nothing learned)."""
    from controlplane.kernel.kv_etcd import EtcdKV

    async def write(value: bytes | None) -> None:
        kv = EtcdKV(stack.etcd)
        try:
            if value is None:
                await kv.delete(stack.key)
            else:
                await kv.put(stack.key, value)
        finally:
            await kv.close()

    asyncio.run(write(None))
    _until(lambda: not _overload(stack)["enabled"], "protection off")
    if on:
        asyncio.run(write(json.dumps(PROTECTION).encode()))
        _until(lambda: bool(_overload(stack)["enabled"]), "protection on")


def _idle(stack: Stack) -> float:
    """Until the upstream serves and queues nothing (abandoned requests are dropped)."""

    def idle() -> bool:
        stats = _get_json(stack.upstream_port, "/stats")
        return bool(stats["active"] == 0 and stats["queued"] == 0)

    return round(_until(idle, "the upstream idle", timeout=120), 2)


def _shed_by_reason(view: dict[str, Any]) -> dict[str, int]:
    totals: dict[str, int] = {}
    for entry in view["shed"]:
        totals[entry["reason"]] = totals.get(entry["reason"], 0) + entry["count"]
    return totals


def _limit_of(view: dict[str, Any]) -> dict[str, Any] | None:
    gates = view["upstreams"]
    if not gates:
        return None
    gate = gates[0]
    return {k: gate[k] for k in ("limit", "estimate", "phase", "min_rtt_ms", "level")}


def _leftover(stack: Stack) -> dict[str, int]:
    """Once the upstream is idle, what the sidecar still counts in flight and queued:
    anything but 0 is a leak of its accounting."""
    _idle(stack)
    gates = _overload(stack)["upstreams"]
    return {
        "in_flight": sum(g["in_flight"] for g in gates),
        "queued": sum(g["queued"] for g in gates),
    }


# --- one run --------------------------------------------------------------------


def _load(
    stack: Stack,
    tmp: Path,
    *,
    rate: float,
    warmup: float,
    duration: float,
    trace: bool = False,
    at: tuple[float, Callable[[], None]] | None = None,
) -> tuple[dict[str, Any], list[dict[str, Any]], dict[str, int]]:
    """The generator's summary, the /overload trace (seconds from the end of the
    warm-up), and what the sidecar shed after the warm-up, by reason."""
    start_at = time.time() + GENERATOR_START_S
    args = [sys.executable, "-m", "controlplane.benchmarks.open_loop", str(stack.proxy_port),
            str(rate), str(duration), str(warmup), str(CLIENT_TIMEOUT_S), str(SLO_S),
            repr(start_at)]  # fmt: skip
    out = tmp / f"load-{uuid.uuid4().hex[:8]}.json"
    samples: list[dict[str, Any]] = []
    with out.open("wb") as sink:
        # its priority raised from here, not in a preexec_fn: that forks this process,
        # whose etcd client runs gRPC threads, and gRPC's poller in the fork can fail
        # before the exec (seen: "epoll_wait error: Bad file descriptor")
        proc = subprocess.Popen(args, stdout=sink, stderr=subprocess.PIPE)
    _raise_priority(proc.pid)
    # the generator's schedule starts at `start_at` (wall clock); on this clock:
    measure_from = time.monotonic() + (start_at - time.time()) + 0.01 + warmup
    shed_before: dict[str, int] | None = None
    last: dict[str, Any] = {"shed": []}
    pending = at
    while proc.poll() is None:
        now = time.monotonic()
        if shed_before is None and now >= measure_from:
            last = _overload(stack)
            shed_before = _shed_by_reason(last)
        if pending is not None and now >= measure_from + pending[0]:
            pending[1]()
            pending = None
        if trace and now >= measure_from:
            last = _overload(stack)
            limit = _limit_of(last)
            if limit is not None:
                samples.append({"t": round(time.monotonic() - measure_from, 3), **limit})
        time.sleep(POLL_S if trace or pending is not None else 0.05)
    _, err = proc.communicate()
    if proc.returncode != 0:
        raise RuntimeError(f"load generator failed: {err.decode(errors='replace')[-2000:]}")
    result: dict[str, Any] = json.loads(out.read_text())
    last = _overload(stack)
    after = _shed_by_reason(last)
    before = shed_before or {}
    shed = {reason: n - before.get(reason, 0) for reason, n in sorted(after.items())}
    result["sidecar_limit_at_end"] = _limit_of(last)
    return result, samples, {k: v for k, v in shed.items() if v}


def _figures(result: dict[str, Any], shed: dict[str, int]) -> dict[str, Any]:
    duration = result["duration_s"]
    goodput = result["ok_within_slo"] / duration
    return {
        "load": round(result["offered_rps"] / CAPACITY_RPS, 2),
        "goodput_rps": round(goodput, 1),
        "goodput_share": round(goodput / CAPACITY_RPS, 3),
        "admitted_p50_ms": result["ok_p50_ms"],
        "admitted_p99_ms": result["ok_p99_ms"],
        "shed_by_reason": shed,
        "shed": sum(shed.values()),
        **result,
    }


# --- the step change of capacity ------------------------------------------------


def _settled(times: list[float], inside: list[bool], step_at: float) -> float | None:
    """From when (seconds after `step_at`) every point is inside to the end."""
    for index in range(len(times)):
        if all(inside[index:]):
            return round(times[index] - step_at, 2)
    return None


def _adapt(trace: list[dict[str, Any]], step_at: float, target: float) -> dict[str, Any]:
    """When the limit came within the band around `target` after `step_at`; from when
    its mean over the `ADAPT_WINDOW_S` before each sample stayed there to the end of
    the run (a window counts from its end, so it is never earlier than the window
    after the step); and from when every sample did."""
    low, high = target * (1 - ADAPT_BAND), target * (1 + ADAPT_BAND)
    after = [s for s in trace if s["t"] >= step_at]
    before = [s["limit"] for s in trace if step_at - 1.0 <= s["t"] < step_at]
    times = [s["t"] for s in after]
    inside = [low <= s["limit"] <= high for s in after]
    first = next((s["t"] - step_at for s, ok in zip(after, inside, strict=True) if ok), None)
    windows = [
        (t, float(np.mean([w["limit"] for w in after if t - ADAPT_WINDOW_S < w["t"] <= t])))
        for t in times
        if t >= step_at + ADAPT_WINDOW_S
    ]
    tail = [s["limit"] for s in after if s["t"] >= after[-1]["t"] - 2.0] if after else []
    return {
        "band": [round(low, 2), round(high, 2)],
        "limit_before_median": float(np.median(before)) if before else None,
        "limit_after_median_last_2s": float(np.median(tail)) if tail else None,
        "limit_after_share": {
            str(v): round(sum(s["limit"] == v for s in after) / len(after), 3)
            for v in sorted({s["limit"] for s in after})
        },
        "first_in_band_s": None if first is None else round(first, 2),
        "settled_mean_in_band_s": _settled(
            [t for t, _ in windows], [low <= m <= high for _, m in windows], step_at
        ),
        "settled_in_band_s": _settled(times, inside, step_at),
    }


def _step(stack: Stack, tmp: Path, durations: Durations, progress: bool) -> dict[str, Any]:
    _say(progress, f"[step] 1x, protection on; concurrency {CONCURRENCY} -> {HALVED} ...")
    _protection(stack, True)

    def halve() -> None:
        _get_json(stack.upstream_port, f"/capacity/{HALVED}", "PUT")

    try:
        result, trace, shed = _load(
            stack, tmp, rate=CAPACITY_RPS, warmup=durations.warmup_s,
            duration=durations.step_before_s + durations.step_after_s, trace=True,
            at=(durations.step_before_s, halve),
        )  # fmt: skip
    finally:
        _get_json(stack.upstream_port, f"/capacity/{CONCURRENCY}", "PUT")
    adapt = _adapt(trace, durations.step_before_s, HALVED)
    if adapt["limit_before_median"]:
        # the limit the sidecar held at the full capacity, halved: the same ratio of
        # limit to the upstream's concurrency (its own latency is in the limit)
        proportional = _adapt(trace, durations.step_before_s, adapt["limit_before_median"] / 2)
        adapt["half_of_before"] = proportional
    _say(progress, f"[step] {json.dumps(adapt)}")
    return {
        "offered_rps": CAPACITY_RPS,
        "step_at_s": durations.step_before_s,
        "concurrency": [CONCURRENCY, HALVED],
        "new_sustainable_concurrency": HALVED,
        **adapt,
        "goodput_per_second": result["goodput_per_second"],
        "shed_by_reason": shed,
        "achieved_rps": result["achieved_rps"],
        "trace": trace,
    }


# --- the run --------------------------------------------------------------------


@contextlib.contextmanager
def _stack(tmp: Path) -> Iterator[Stack]:
    etcd = os.environ.get("CANARY_BENCH_ETCD", f"{HOST}:2379")
    from controlplane.kernel.keys import EtcdKeys

    prefix = f"/bench-{uuid.uuid4().hex[:10]}"
    upstream_port, proxy_port, admin_port = _free_port(), _free_port(), _free_port()
    python = sys.executable
    with contextlib.ExitStack() as stack:
        stack.enter_context(
            _process(
                [python, "-m", "controlplane.benchmarks.capacity_upstream", str(upstream_port),
                 str(CONCURRENCY), str(SERVICE_MS)],
                cpu=None, port=upstream_port, log=tmp / "upstream.log",
            )
        )  # fmt: skip
        sidecar = stack.enter_context(
            _process(
                [python, "-m", "controlplane.cli.main", "sidecar", "--service", SERVICE,
                 "--listen", f"{HOST}:{proxy_port}", "--admin", f"{HOST}:{admin_port}",
                 "--etcd", etcd, "--etcd-prefix", prefix, "--redis", "memory://",
                 "--default-upstream", f"http://{HOST}:{upstream_port}", "--workers", "1",
                 # the load generator is one client of up to 4000 connections
                 "--max-connections-per-client", "0"],
                cpu=None, port=proxy_port, log=tmp / "sidecar.log",
                env={**os.environ, "PYTHONUNBUFFERED": "1"},
            )
        )  # fmt: skip
        _wait_ready(admin_port, sidecar)
        yield Stack(upstream_port, proxy_port, admin_port, etcd, EtcdKeys(prefix).overload(SERVICE))


def run(*, quick: bool, progress: bool, durations: Durations | None = None) -> dict[str, Any]:
    """`durations` (for tests) overrides the quick or full ones."""
    durations = durations or (QUICK if quick else FULL)
    result: dict[str, Any] = {
        "benchmark": "overload",
        "quick": quick,
        "setup": {
            "upstream": f"asyncio, {CONCURRENCY} at once x {SERVICE_MS:g} ms (a timer), FIFO "
            "queue without a bound beyond; a queued request whose connection closed is dropped",
            "capacity_rps": CAPACITY_RPS,
            "sidecar": "canary sidecar --workers 1, default upstream, etcd config",
            "protection_config": PROTECTION or "defaults",
            "load": "python open loop (own process, fixed schedule, keep-alive, new "
            f"connections as needed), clients give up after {CLIENT_TIMEOUT_S:g} s; latency "
            "from the scheduled send time",
            "slo_ms": SLO_S * 1000,
            "warmup_s": durations.warmup_s,
            "measure_s": durations.measure_s,
            "pinned": "nothing: the upstream, the sidecar and the generator share every CPU",
        },
        "notes": [],
    }
    with contextlib.suppress(OSError):
        result["loadavg_at_start"] = [round(x, 2) for x in os.getloadavg()]
    _raise_priority()
    runs: dict[str, dict[str, Any]] = {"off": {}, "on": {}}
    with tempfile.TemporaryDirectory(prefix="canary-bench-overload-") as tmp_name:
        tmp = Path(tmp_name)
        with _stack(tmp) as stack:
            _say(progress, "[unloaded] 0.1x, protection off ...")
            _protection(stack, False)
            unloaded, _, _ = _load(
                stack, tmp, rate=UNLOADED * CAPACITY_RPS, warmup=durations.warmup_s,
                duration=durations.measure_s,
            )  # fmt: skip
            result["unloaded"] = _figures(unloaded, {})
            for load in LOADS:
                for mode in ("off", "on"):
                    waited = _idle(stack)
                    _protection(stack, mode == "on")
                    _say(progress, f"[{mode} {load:g}x] {load * CAPACITY_RPS:g} req/s ...")
                    measured, _, shed = _load(
                        stack, tmp, rate=load * CAPACITY_RPS, warmup=durations.warmup_s,
                        duration=durations.measure_s,
                    )  # fmt: skip
                    figures = _figures(measured, shed)
                    figures["idle_wait_before_s"] = waited
                    if mode == "on":
                        figures["after_idle"] = _leftover(stack)
                    runs[mode][f"{load:g}x"] = figures
                    _say(progress, f"[{mode} {load:g}x] goodput {figures['goodput_share']:.2f}, "
                         f"P99 {figures['admitted_p99_ms']} ms, shed {figures['shed']}, "
                         f"sent {figures['achieved_rps']}/s")  # fmt: skip
            _idle(stack)
            result["step"] = _step(stack, tmp, durations, progress)
    with contextlib.suppress(OSError):
        result["loadavg_at_end"] = [round(x, 2) for x in os.getloadavg()]
    result["runs"] = runs
    result["targets"] = _targets(result)
    short = [
        f"{mode} {name}: {r['achieved_rps']}/{r['offered_rps']:g}"
        for mode, by_load in runs.items()
        for name, r in by_load.items()
        if r["achieved_rps"] < 0.95 * r["offered_rps"]
    ]
    late = [
        f"{mode} {name}: {r['started_late_s']} s"
        for mode, by_load in runs.items()
        for name, r in by_load.items()
        if r["started_late_s"] > 0.05
    ]
    if late:
        result["notes"].append(
            "the generator started late (its warm-up and the sidecar's shed counts are "
            "misaligned by as much) in: " + ", ".join(late)
        )
    if short:
        result["notes"].append(
            "the generator sent less than 95% of the offered rate in: " + ", ".join(short)
        )
    return result


def _targets(result: dict[str, Any]) -> dict[str, Any]:
    on, off = result["runs"]["on"], result["runs"]["off"]
    unloaded_p99 = result["unloaded"]["admitted_p99_ms"]
    p99_4x = on["4x"]["admitted_p99_ms"]
    added_p50 = _minus(on["0.5x"]["admitted_p50_ms"], off["0.5x"]["admitted_p50_ms"])
    added_p99 = _minus(on["0.5x"]["admitted_p99_ms"], off["0.5x"]["admitted_p99_ms"])
    settled = result["step"]["settled_mean_in_band_s"]
    every = result["step"]["settled_in_band_s"]
    proportional = result["step"].get("half_of_before", {}).get("settled_in_band_s")
    ratio = None if p99_4x is None or not unloaded_p99 else round(p99_4x / unloaded_p99, 2)
    return {
        "goodput_share_min": TARGET_GOODPUT_SHARE,
        "goodput_share_on": {k: on[k]["goodput_share"] for k in on},
        "goodput_share_off": {k: off[k]["goodput_share"] for k in off},
        "goodput_ok": all(on[k]["goodput_share"] >= TARGET_GOODPUT_SHARE for k in ("2x", "4x")),
        "unloaded_p99_ms": unloaded_p99,
        "admitted_p99_4x_on_ms": p99_4x,
        "admitted_p99_4x_vs_unloaded": ratio,
        "admitted_p99_4x_vs_unloaded_max": TARGET_P99_VS_UNLOADED,
        "admitted_p99_ok": ratio is not None and ratio <= TARGET_P99_VS_UNLOADED,
        "shed_at_half_load_on": on["0.5x"]["shed"],
        "protection_added_p50_ms_at_half_load": added_p50,
        "protection_added_p99_ms_at_half_load": added_p99,
        "protection_added_p99_ms_max": TARGET_ADDED_P99_MS,
        "half_load_ok": on["0.5x"]["shed"] == 0
        and added_p99 is not None
        and added_p99 <= TARGET_ADDED_P99_MS,
        "accounting_leak": any(
            r["after_idle"]["in_flight"] or r["after_idle"]["queued"] for r in on.values()
        ),
        "adapt_settled_s": settled,
        "adapt_window_s": ADAPT_WINDOW_S,
        "adapt_s_max": TARGET_ADAPT_S,
        "adapt_ok": settled is not None and settled <= TARGET_ADAPT_S,
        # every 100 ms sample in the band: a limit that never probes above 4
        "adapt_every_sample_settled_s": every,
        "adapt_every_sample_ok": every is not None and every <= TARGET_ADAPT_S,
        # the same band around half the limit held before the step: the sidecar's own
        # time per request is in the limit (decision 0026), so its limit for a
        # concurrency of 4 is not 4
        "adapt_settled_half_of_before_s": proportional,
        "adapt_half_of_before_ok": proportional is not None and proportional <= TARGET_ADAPT_S,
    }


def _minus(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else round(a - b, 3)
