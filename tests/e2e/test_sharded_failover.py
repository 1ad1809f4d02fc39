"""Sharded controllers: three `canary serve` replicas share the experiments' shards;
the one judging a rollout is SIGKILLed mid-rollout.

Another replica holds the dead one's shard within the lease TTL (2 s here) + 1 s,
measured from the kill to the shard's owner key naming it; the rollout goes on under
it to the end; the survivors keep their own shards throughout; and the audit trail
in SQL has no decision twice: every controller event is fenced by the shard key of
whoever held it (`leader_fence`), and no transition appears twice.
"""

from __future__ import annotations

import signal
import time
from collections import Counter
from typing import Any

import psycopg
import pytest
from sqlalchemy.engine import make_url

from controlplane.controller.shards import assign, shard_of
from tests.e2e.helpers import HOLD, RULE, Launch, is_subsequence, kinds_of, poll

pytestmark = [pytest.mark.e2e, pytest.mark.real, pytest.mark.timeout(240)]

SHARDS = 32
LEASE_TTL_SEC = 2
SHARDED = {"CANARY_CONTROLLER_SHARDS": str(SHARDS),
           "CANARY_CONTROLLER_LEASE_TTL": str(LEASE_TTL_SEC)}  # fmt: skip


def pid_of(identity: bytes) -> int:
    """Controller identities are `<host>-<pid>`."""
    return int(identity.decode().rsplit("-", 1)[1])


def sql_fence(pg_url: str, shard: int) -> tuple[int, str]:
    url = make_url(pg_url).set(drivername="postgresql").render_as_string(hide_password=False)
    with psycopg.connect(url) as conn:
        row = conn.execute(
            "SELECT fence, owner FROM controller_shards WHERE shard = %s", (shard,)
        ).fetchone()
    assert row is not None, f"shard {shard} has no fence in SQL"
    return int(row[0]), str(row[1])


async def test_a_killed_replicas_rollout_goes_on_under_another_with_no_decision_twice(
    launch: Launch, pg_url: str
) -> None:
    stack = await launch(serves=3, collectors=1, env=SHARDED)
    shards_prefix = stack.keys.controller_shards_prefix

    async def owners() -> dict[int, Any]:
        items, _ = await stack.kv.get_prefix(shards_prefix)
        return {int(kv.key.rsplit("/", 1)[1]): kv for kv in items}

    async def all_held_by_three() -> dict[int, Any] | None:
        held = await owners()
        full = len(held) == SHARDS and len({kv.value for kv in held.values()}) == 3
        return held if full else None

    await poll(all_held_by_three, timeout=30, what="three replicas hold every shard")
    await stack.put_rule(RULE)
    experiment = await stack.create_and_start("sharded", [(10, HOLD), (50, HOLD), (100, HOLD)])
    shard = shard_of(experiment, SHARDS)
    shard_key = stack.keys.controller_shard(shard)
    stack.start_load()
    killed: dict[str, Any] = {}

    async def kill_the_owner_after_its_first_step(data: dict[str, Any]) -> None:
        if killed or data["state"] != "running" or data["current_step"] < 1:
            return
        before = await owners()
        owner = before[shard]
        victim = next(s for s in stack.serves if s.proc.pid == pid_of(owner.value))
        victim.proc.signal(signal.SIGKILL)
        killed_at = time.monotonic()
        victim.proc.wait_exit(5)

        async def new_owner() -> Any:
            now = (await owners()).get(shard)
            return now if now is not None and now.value != owner.value else None

        taken = await poll(new_owner, timeout=LEASE_TTL_SEC + 10, every=0.02,
                           what="another replica holds the shard")  # fmt: skip
        killed.update(at=killed_at, taken_after=time.monotonic() - killed_at, old=owner,
                      new=taken, before=before)  # fmt: skip

    final = await stack.run_to_end(
        experiment, timeout=120, on_poll=kill_the_owner_after_its_first_step
    )

    assert killed, "the rollout ended before its owner could be killed"
    old, new = killed["old"], killed["new"]
    assert killed["taken_after"] <= LEASE_TTL_SEC + 1.0, (
        f"the shard was held again {killed['taken_after']:.2f} s after the kill"
    )
    assert final["state"] == "promoted", final

    # the survivors kept the shards the assignment still gives them (same keys, same
    # fences) through the kill; the bounded loads may move a few more (decision 0063)
    after = await owners()
    survivors = {kv.value.decode() for kv in after.values()}
    now_assigned = assign(SHARDS, survivors)
    kept = {s: kv for s, kv in killed["before"].items()
            if kv.value != old.value and now_assigned[s] == kv.value.decode()}  # fmt: skip
    assert kept and all(after[s].create_revision == kv.create_revision for s, kv in kept.items())
    assert all(after[s].value.decode() == owner for s, owner in now_assigned.items())
    assert old.value not in {kv.value for kv in after.values()}

    events = await stack.events(experiment)
    kinds = kinds_of(events)
    assert is_subsequence(["start", "step_advanced", "step_advanced", "promoted"], kinds), kinds
    decided = [e for e in events if e["actor"] == "controller"]
    fences = [e["payload"]["leader_fence"] for e in decided]
    assert {f["key"] for f in fences} == {shard_key}
    revisions = [f["revision"] for f in fences]
    assert set(revisions) == {old.create_revision, new.create_revision}, revisions
    # the old owner's decisions all come before the new owner's: none after the takeover
    assert revisions == sorted(revisions), revisions
    # no decision twice: each transition (kind, from, to, step) once
    transitions = Counter(
        (e["kind"], e["from_state"], e["to_state"], e["payload"].get("step"))
        for e in decided
    )
    assert all(n == 1 for n in transitions.values()), transitions
    assert kinds.count("promoted") == 1
    # SQL fences the shard by its new owner's key
    assert sql_fence(pg_url, shard) == (new.create_revision, new.value.decode())
