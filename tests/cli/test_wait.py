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
