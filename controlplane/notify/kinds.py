"""Which events are announced, and under which topic a person would look for them.

Subscriptions name event kinds (the `kind` of the audit trail, architecture §7); only
the kinds below can be subscribed to. Topics group them the way people speak of a
rollout ("tell me about trips and rollbacks"): a subscription may name a topic in
place of its kinds.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Final

TOPICS: Final[dict[str, tuple[str, ...]]] = {
    "trip": ("tripped",),
    "probe": ("half_open", "probe_passed", "probe_failed"),
    "rollback": ("rolled_back", "rollback", "abort"),
    "promotion": ("promoted", "promote"),
    "step": ("step_advanced",),
    "srm": ("srm_detected", "srm_cleared"),
    "no_data": ("no_data",),
    "overload": ("overload_hold", "overload_cleared"),
    "lifecycle": ("start", "pause", "resume"),
    "routes": ("route_reconciled",),
    "rules": ("rule_changed", "rule_rejected", "no_rule", "overload_changed",
              "rule_reconciled", "overload_reconciled", "config_imported"),
}

NOTIFIABLE_KINDS: Final[frozenset[str]] = frozenset(k for kinds in TOPICS.values() for k in kinds)
TOPIC_OF: Final[dict[str, str]] = {k: topic for topic, kinds in TOPICS.items() for k in kinds}


def expand(names: Iterable[str]) -> tuple[str, ...]:
    """Topics and kinds as the sorted kinds they stand for; ValueError names the first
    unknown one."""
    kinds: set[str] = set()
    for name in names:
        if name in TOPICS:
            kinds.update(TOPICS[name])
        elif name in NOTIFIABLE_KINDS:
            kinds.add(name)
        else:
            raise ValueError(
                f"{name!r} is neither a topic ({', '.join(sorted(TOPICS))}) nor an "
                "event kind that is announced"
            )
    return tuple(sorted(kinds))


def topic_of(kind: str) -> str:
    return TOPIC_OF.get(kind, "other")


def wants(kinds: Iterable[str], kind: str) -> bool:
    """Whether a subscription to `kinds` (empty: every announced kind) wants `kind`."""
    if kind not in NOTIFIABLE_KINDS:
        return False
    chosen = tuple(kinds)
    return not chosen or kind in chosen
