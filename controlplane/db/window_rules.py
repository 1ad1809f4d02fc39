"""The window rules the experiments in SQL call for (kernel.window_rules).

A running or paused experiment with a valid rule of its own gets one, made of that
rule; every other experiment none (the collectors use its service's rule, as the
controller does when the experiment's rule is absent or unreadable).
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from controlplane.db.models import ACTIVE_STATES, Experiment
from controlplane.kernel.errors import ValidationFailed
from controlplane.kernel.rules import parse_rule
from controlplane.kernel.window_rules import WindowRule


def window_rule_of(service: str, rule: dict[str, Any] | None) -> WindowRule | None:
    """The window rule of an experiment's own rule; None without a valid one."""
    if not rule:
        return None
    data = dict(rule)
    data.setdefault("service", service)
    try:
        return WindowRule.of(parse_rule(data))
    except ValidationFailed:
        return None


def desired_window_rules(*, session: Session) -> dict[str, WindowRule]:
    """By experiment id: the window rule of every live experiment with its own rule."""
    query = select(Experiment.id, Experiment.service, Experiment.rule).where(
        Experiment.state.in_(ACTIVE_STATES), Experiment.rule.is_not(None)
    )
    found: dict[str, WindowRule] = {}
    for experiment_id, service, rule in session.execute(query):
        window = window_rule_of(service, rule)
        if window is not None:
            found[str(experiment_id)] = window
    return found
