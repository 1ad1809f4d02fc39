"""Two releases of one service in a row, end to end, with no hand edit in between.

    `canary serve` (PostgreSQL + etcd + Redis), two collectors, the sidecar, three
    upstream versions of `shop`: v1, v2 and v3, and ~150 requests/s of load

v2 is released over v1 and promoted by the controller: the route becomes v2 alone
and v2 the stable version. The next release names only its canary (v3, slow): it
starts from v2, trips, and is rolled back by the controller, and v2 stays in force
and stable. The release history says so, and the sidecar sends every user to v2.
"""

from __future__ import annotations

import asyncio
import sys
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.e2e.helpers import (
    HOLD,
    RULE,
    SERVICE,
    Launch,
    Stack,
    Upstream,
    controller_events,
    http_ok,
    new_port,
    poll,
)
from tests.support.auth import ADMIN_ACTOR
from tests.support.processes import wait_port

pytestmark = [pytest.mark.e2e, pytest.mark.real, pytest.mark.timeout(240)]

USERS = [f"user-{i}" for i in range(60)]


async def start_upstream(stack: Stack, tmp_path: Path, name: str) -> Upstream:
    """One more upstream version, as the launch starts the first two."""
    port = new_port()
    control = tmp_path / f"{name}.control.json"
    proc = stack.procs.start(
        f"upstream-{name}",
        [sys.executable, "-m", "tests.e2e.upstream", "--name", name, "--port", str(port),
         "--control", str(control), "--median-ms", "50", "--seed", "3"],
        stack.env,
    )  # fmt: skip
    upstream = Upstream(proc, port, control)
    await asyncio.to_thread(wait_port, port, timeout=30)
    await poll(partial(http_ok, stack.http, upstream.url), timeout=10,
               what=f"{proc.name} answering", procs=[proc])  # fmt: skip
    return upstream


async def create_and_start(
    stack: Stack, name: str, variants: dict[str, Any], **more: Any
) -> dict[str, Any]:
    created: dict[str, Any] = await stack.api("POST", "/v1/experiments", {
        "name": name,
        "service": SERVICE,
        "variants": variants,
        "steps": [{"weight_pct": 50, "hold_sec": HOLD}, {"weight_pct": 100, "hold_sec": HOLD}],
        "sticky": {"header": "x-user-id"},
        **more,
    })  # fmt: skip
    await stack.api("POST", f"/v1/experiments/{created['id']}/start", {"reason": "e2e"})
    return created


async def served_by(stack: Stack) -> set[tuple[str, str]]:
    """(variant, upstream version) of each user's answer through the sidecar."""
    seen = set()
    async with httpx.AsyncClient(
        base_url=f"http://127.0.0.1:{stack.sidecar_port}", timeout=10.0, trust_env=False
    ) as client:
        for user in USERS:
            response = await client.get("/", headers={"x-user-id": user})
            assert response.status_code == 200, (user, response.status_code, response.text)
            seen.add((response.headers["x-canary-variant"], response.headers["x-upstream"]))
    return seen


async def everyone_on_v2(stack: Stack) -> bool:
    """Every user answered by v2 (its process is named "canary"), as the baseline."""
    return await served_by(stack) == {("baseline", "canary")}


async def only_stable(stack: Stack, upstream: Upstream) -> bool:
    route = await stack.route()
    return route is not None and [(v.name, v.upstream, v.weight) for v in route.variants] == [
        ("baseline", upstream.url, 10_000)
    ]


async def test_two_releases_in_a_row_the_second_from_the_first_ones_promoted_version(
    launch: Launch, tmp_path: Path
) -> None:
    stack = await launch()
    await stack.put_rule(RULE)
    v1, v2 = stack.baseline, stack.canary  # their answers say "baseline", "canary"
    v3 = await start_upstream(stack, tmp_path, "next")
    stack.start_load()

    # release 1: v2 over v1, healthy, promoted by the controller
    first = await create_and_start(stack, "shop v2", {
        "baseline": {"upstream": v1.url, "version": "v1"},
        "canary": {"upstream": v2.url, "version": "v2"},
    })  # fmt: skip
    final = await stack.run_to_end(first["id"], timeout=90)
    assert final["state"] == "promoted", final
    await poll(partial(only_stable, stack, v2), timeout=10, what="v2 alone in the route")
    await poll(partial(everyone_on_v2, stack), timeout=10, what="every user on v2")

    # release 2: only its canary named; it starts from v2, is slow, and is rolled back
    v3.set_factor(5.0)
    # (rolled back at its first trip: the breaker's own story is test_rollouts')
    second = await create_and_start(
        stack, "shop v3", {"canary": {"upstream": v3.url, "version": "v3"}},
        rule={**RULE, "max_trips": 1},
    )  # fmt: skip
    assert second["baseline_follows_stable"], second
    assert second["variants"]["baseline"] == {"upstream": v2.url, "version": "v2"}, second
    running = await stack.experiment(second["id"])
    assert running["variants"]["baseline"]["upstream"] == v2.url
    final = await stack.run_to_end(second["id"], timeout=120)
    assert final["state"] == "rolled_back", final
    await poll(partial(only_stable, stack, v2), timeout=10, what="v2 alone again")
    assert await everyone_on_v2(stack)

    history = await stack.api("GET", f"/v1/services/{SERVICE}/releases")
    stable = history["stable"]
    assert (stable["upstream"], stable["version"], stable["experiment_id"]) == (
        v2.url, "v2", first["id"]
    )
    labelled = {v1.url: "v1", v2.url: "v2"}
    assert [
        (r["kind"], r["experiment_id"], r["actor"],
         r["stable_before"] and labelled[r["stable_before"]["upstream"]],
         labelled[r["stable_after"]["upstream"]])
        for r in history["items"]
    ] == [
        ("rolled_back", second["id"], "controller", "v2", "v2"),
        ("promoted", first["id"], "controller", "v1", "v2"),
        ("seeded", first["id"], ADMIN_ACTOR, None, "v1"),
    ]  # fmt: skip
    events = await stack.events(first["id"])
    promoted = controller_events(events, "promoted")[0]
    assert promoted["payload"]["release"]["kind"] == "promoted"
    load = stack.load
    assert load is not None
    assert load.stats.sidecar_failed == 0, dict(load.stats.sidecar_reasons)
