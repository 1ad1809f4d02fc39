"""`exp wait`'s loop on its own: the live view on a terminal, the verdict, the timeout."""

from __future__ import annotations

import io
from typing import Any

import pytest
from rich.console import Console

from controlplane.cli.experiments import follow


class ScriptedClient:
    """Answers each poll with the next experiment of a script (the last one repeats)."""

    def __init__(self, *states: tuple[str, int, int]) -> None:
        self.script = [
            {
                "state": state,
                "current_step": step,
                "canary_weight_bp": weight_bp,
                "breaker_state": "open" if state == "rolled_back" else "closed",
                "steps": [{"weight_pct": 5}, {"weight_pct": 50}],
            }
            for state, step, weight_bp in states
        ]
        self.polls = 0

    def get_experiment(self, experiment_id: str) -> dict[str, Any]:
        self.polls += 1
        return self.script[min(self.polls, len(self.script)) - 1]

    def latest_event(self, experiment_id: str) -> dict[str, Any] | None:
        state = self.script[min(self.polls, len(self.script)) - 1]["state"]
        return {"kind": "step", "from_state": "running", "to_state": state, "reason": "held"}


def terminal() -> tuple[Console, io.StringIO]:
    out = io.StringIO()
    return Console(file=out, force_terminal=True, width=100, markup=False), out


def test_live_view_on_a_terminal_ends_with_the_verdict() -> None:
    client = ScriptedClient(("running", 0, 500), ("running", 1, 5000), ("promoted", 1, 10000))
    console, out = terminal()
    state = follow(client, "7", timeout=10, interval=0.01, console=console)
    assert (state, client.polls) == ("promoted", 3)
    screen = out.getvalue()
    assert "canary weight" in screen and "50%" in screen and "100%" in screen
    assert "step running → promoted: held" in screen


def test_times_out_instead_of_waiting_forever() -> None:
    client = ScriptedClient(("running", 0, 500))
    console, _ = terminal()
    with pytest.raises(TimeoutError, match=r"still running after 0\.05 s"):
        follow(client, "7", timeout=0.05, interval=0.01, console=console)


class RouteScript(ScriptedClient):
    """A promoted experiment whose route reaches etcd only on the third look."""

    def __init__(self, applied: list[bool | None]) -> None:
        super().__init__(*[("promoted", 1, 10000)] * len(applied))
        for experiment, value in zip(self.script, applied, strict=True):
            experiment["route_applied"] = value
            experiment["route_note"] = None if value is not None else "etcd unavailable"


def test_a_verdict_waits_for_its_route_to_reach_etcd() -> None:
    client = RouteScript([False, False, True])
    console, out = terminal()
    state = follow(client, "7", timeout=10, interval=0.01, console=console)
    assert (state, client.polls) == ("promoted", 3)
    assert "pending" in out.getvalue() and "applied" in out.getvalue()


def test_a_route_never_applied_times_out_naming_the_state() -> None:
    client = RouteScript([False])
    console, _ = terminal()
    with pytest.raises(TimeoutError, match=r"promoted, but etcd does not hold its route after"):
        follow(client, "7", timeout=0.05, interval=0.01, console=console)


def test_an_unknown_route_does_not_hold_the_verdict_and_says_why() -> None:
    client = RouteScript([None])
    out = io.StringIO()
    console = Console(file=out, force_terminal=False, width=200, markup=False)
    assert follow(client, "7", timeout=10, interval=0.01, console=console) == "promoted"
    assert "route unknown (etcd unavailable)" in out.getvalue()
