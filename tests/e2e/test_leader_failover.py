"""Leader failover: two `canary serve` replicas, the leader SIGKILLed mid-rollout.

The other replica leads within the lease TTL (5 s) + 1 s, measured from the kill to
the election key naming it, and every route written after the kill is fenced by the
new leader's term: each controller event carries `leader_fence` (the create revision
of the election key its route write was fenced by), and the route's own revision
ties the event to the write.
"""

from __future__ import annotations

import signal
import time
from typing import Any

import pytest

from tests.e2e.helpers import HOLD, RULE, Launch, Serve, is_subsequence, kinds_of, poll

pytestmark = [pytest.mark.e2e, pytest.mark.real, pytest.mark.timeout(240)]

LEASE_TTL_SEC = 5.0  # the controller's default lease TTL


def pid_of(identity: bytes) -> int:
    """Controller identities are `<host>-<pid>`."""
    return int(identity.decode().rsplit("-", 1)[1])


async def test_the_other_replica_leads_within_ttl_and_the_dead_leader_never_writes(
    launch: Launch,
) -> None:
    stack = await launch(serves=2, collectors=1)
    first = await poll(stack.election, timeout=20, what="a controller leads")
    by_pid = {serve.proc.pid: serve for serve in stack.serves}
    leader: Serve = by_pid[pid_of(first.value)]
    follower = next(s for s in stack.serves if s is not leader)

    await stack.put_rule(RULE)
    routes = await stack.follow_routes()
    experiment = await stack.create_and_start("failover", [(10, HOLD), (50, HOLD), (100, HOLD)])
    stack.start_load()
    killed: dict[str, Any] = {}

    async def kill_the_leader_after_its_first_step(data: dict[str, Any]) -> None:
        if killed or data["state"] != "running" or data["current_step"] < 1:
            return
        election = await stack.election()
        assert election is not None
        assert pid_of(election.value) == leader.proc.pid, "leadership moved before the kill"
        leader.proc.signal(signal.SIGKILL)
        killed_at = time.monotonic()
        leader.proc.wait_exit(5)
        # read once the leader is gone: a write of its own in flight has landed or never will
        route = await stack.route()
        assert route is not None
        killed.update(at=killed_at, route_revision=route.revision,
                      fence=election.create_revision)  # fmt: skip

        async def new_leader() -> Any:
            now = await stack.election()
            if now is not None and now.create_revision != election.create_revision:
                return now
            return None

        taken = await poll(new_leader, timeout=LEASE_TTL_SEC + 10, every=0.05,
                           what="another controller leads")  # fmt: skip
        killed.update(taken_after=time.monotonic() - killed_at, new=taken)

    final = await stack.run_to_end(
        experiment, timeout=120, on_poll=kill_the_leader_after_its_first_step
    )

    assert killed, "the rollout ended before the leader could be killed"
    new = killed["new"]
    assert pid_of(new.value) == follower.proc.pid, new
    assert killed["taken_after"] <= LEASE_TTL_SEC + 1.0, (
        f"the follower led {killed['taken_after']:.2f} s after the kill"
    )
    assert final["state"] == "promoted", final

    events = await stack.events(experiment)
    kinds = kinds_of(events)
    assert is_subsequence(["start", "step_advanced", "step_advanced", "promoted"], kinds), kinds
    writes = [e for e in events if e["actor"] == "controller" and "route_revision" in e["payload"]]
    before = [e for e in writes if e["payload"]["route_revision"] <= killed["route_revision"]]
    after = [e for e in writes if e["payload"]["route_revision"] > killed["route_revision"]]
    assert before and after, [(e["kind"], e["payload"]["route_revision"]) for e in writes]
    assert {e["payload"]["leader_fence"]["revision"] for e in before} == {killed["fence"]}
    assert {e["payload"]["leader_fence"]["revision"] for e in after} == {new.create_revision}, [
        (e["kind"], e["payload"]["route_revision"], e["payload"]["leader_fence"]) for e in after
    ]
    # every route written after the kill is one the new leader recorded, under its fence
    by_new_leader = {e["payload"]["route_revision"] for e in after}
    written_after = {r.revision for _, r in routes.seen if r.revision > killed["route_revision"]}
    assert written_after and written_after <= by_new_leader, (written_after, by_new_leader)
    route = await stack.route()
    assert route is not None and route.state.value == "promoted"
    assert route.revision == max(by_new_leader)
    assert stack.load is not None and stack.load.stats.sidecar_failed == 0, stack.load.stats
