"""`canary bench round` and `canary bench memory` at their smallest: they run through
the real controller and store, and their figures have the shape the docs quote.
Figures are sanity-checked, not judged: speed belongs to the recorded runs."""

from __future__ import annotations

import asyncio
import itertools
from pathlib import Path

from controlplane.benchmarks.memory_commit import LOOKS, _measure, _memories
from controlplane.benchmarks.round import _rounds
from controlplane.experiments.memory_parts import same_evidence, split_memory
from controlplane.kernel.json_text import dumps


def test_a_round_with_a_batch_every_tick_finds_every_look_fresh() -> None:
    result = asyncio.run(_rounds(4, 2, 4, every_tick=True))
    assert len(result["cpu_ms_per_experiment_round_each"]) == 4
    assert result["cpu_ms_per_experiment_round_mean"] > 0
    assert result["main_thread_ms_per_experiment_round"] > 0
    assert set(result["gc_pauses"]) == {"generation_0", "generation_1", "generation_2"}
    assert result["partial_cache"]["kb_per_experiment"] > 0


def test_the_memory_looks_move_the_evidence_once_a_window() -> None:
    memories = _memories(3, seed=1)
    assert len(memories) == LOOKS + 1
    kept = [same_evidence(a, b) for a, b in itertools.pairwise(memories)]
    assert kept == [False] + [True] * (LOOKS - 1)


def test_the_memory_commit_writes_the_evidence_once_when_changed(tmp_path: Path) -> None:
    memories = _memories(3, seed=1)
    result = _measure(f"sqlite:///{tmp_path}/m.db", 3, memories)
    look = len(dumps(split_memory(memories[1])[0]))
    evidence = len(dumps(split_memory(memories[1])[1]))
    every = result["json_bytes_per_experiment_look"]["every_look"]
    changed = result["json_bytes_per_experiment_look"]["when_changed"]
    # every look's part (a reason of growing length aside) and the evidence once
    assert abs(every - (look + evidence)) <= 8
    assert abs(changed - (look + evidence / LOOKS)) <= 8
    assert result["wal_bytes_per_experiment_look"] == {"every_look": None, "when_changed": None}
    assert len(result["runs"]["every_look"]) == len(result["runs"]["when_changed"]) == 2
