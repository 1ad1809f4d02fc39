"""The rollout memory in two parts: what a look changes, and the step's evidence.

A look changes a few fields of the memory (the last snapshot's time, the breach
streak, the reason); the step's evidence (the tally of its windows, the sample-ratio
tally, the ramp's ledger) changes when a settled window is added, once every
`window_sec`, and is most of the memory's bytes: up to ~240 KB per experiment late in
a step. Stored together, every look rewrote all of it (decision 0068). The store
keeps the two parts apart and writes the evidence only when it changed; readers see
one memory, merged.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

# the memory's keys that make up the step's evidence (decision.model.RolloutState)
EVIDENCE_KEYS = ("tally", "srm_tally", "ramp_split")


def split_memory(
    memory: Mapping[str, Any] | None,
) -> tuple[dict[str, Any] | None, dict[str, Any] | None]:
    """(the look's part, the evidence part) of a memory; (None, None) for none."""
    if memory is None:
        return None, None
    look = {k: v for k, v in memory.items() if k not in EVIDENCE_KEYS}
    evidence = {k: memory[k] for k in EVIDENCE_KEYS if k in memory}
    return look, evidence


def merged_memory(
    look: Mapping[str, Any] | None, evidence: Mapping[str, Any] | None
) -> dict[str, Any] | None:
    """The memory as one dict. The look's part wins a key both hold: a memory written
    whole (before the split, or by a writer that does not split) is read as written."""
    if look is None:
        return None
    if not evidence:
        return dict(look)
    return {**evidence, **look}


def same_evidence(before: Mapping[str, Any] | None, after: Mapping[str, Any] | None) -> bool:
    """Whether `after`'s evidence is, part for part, the very objects of `before`'s.

    Identity, not equality: the parts are frozen values (a step's tally keeps its dict
    until a window is added, decision 0064), so the same object means the same stored
    text, and comparing ~240 KB of numbers at every look would cost what not writing
    them saves. A memory read from the store never shares an object with a decided
    one, so the first write after a read always writes the evidence.
    """
    if before is None or after is None:
        return False
    return all(before.get(k) is after.get(k) for k in EVIDENCE_KEYS)
