"""Which events are announced, and under which topic a person would look for them.

Subscriptions name event kinds (the `kind` of the audit trail, architecture §7); only
the kinds that have a topic (`EventKind.topic`, experiments/events.py) can be
subscribed to. Topics group them the way people speak of a rollout ("tell me about
trips and rollbacks"): a subscription may name a topic in place of its kinds.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Final

from controlplane.experiments.events import EventKind


def _topics() -> dict[str, tuple[str, ...]]:
    topics: dict[str, list[str]] = {}
    for kind in EventKind:
        if kind.topic is not None:
            topics.setdefault(kind.topic, []).append(kind.value)
    return {topic: tuple(kinds) for topic, kinds in topics.items()}


TOPICS: Final[dict[str, tuple[str, ...]]] = _topics()
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
