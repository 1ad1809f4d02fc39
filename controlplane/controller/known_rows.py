"""The active experiments as the controller last read or wrote them (decision 0059).

A round lists only (id, version) of the active experiments and reloads the rows whose
version it has not seen; the rest are the records it holds, with their rollout memory
parsed once per version. Every write of an experiment bumps its version, so a row
someone else changed is always reloaded; the controller's own memory commits tell it
the version they wrote, so they cost no reload.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass

from controlplane.decision.model import RolloutState
from controlplane.experiments.rollout_state import stored_rollout_state
from controlplane.experiments.store import ExperimentRecord, ExperimentVersion


@dataclass
class _Known:
    record: ExperimentRecord
    state: RolloutState | None = None
    parsed: bool = False


class KnownRows:
    """Records by id, bounded to the last listing's experiments."""

    def __init__(self) -> None:
        self._rows: dict[int, _Known] = {}

    def __len__(self) -> int:
        return len(self._rows)

    def records(self) -> list[ExperimentRecord]:
        """The records held, in no particular order."""
        return [known.record for known in self._rows.values()]

    def record(self, experiment_id: int) -> ExperimentRecord | None:
        """The record held for `experiment_id`: as last read or written here."""
        known = self._rows.get(experiment_id)
        return None if known is None else known.record

    def stale(self, listed: Iterable[ExperimentVersion]) -> list[int]:
        """The ids listed at a version other than the one held (or not held)."""
        rows = self._rows
        return [
            v.id for v in listed
            if (known := rows.get(v.id)) is None or known.record.version != v.version
        ]

    def refresh(
        self,
        listed: Sequence[ExperimentVersion],
        loaded: Iterable[ExperimentRecord],
        wanted: Collection[object],
    ) -> list[ExperimentRecord]:
        """Take in the rows just `loaded` and forget every id not `listed`; the
        records of the listed, in their order. A row loaded whose state is not among
        `wanted` left the selection between the listing and the load: forgotten."""
        rows = self._rows
        for record in loaded:
            if record.state in wanted:
                rows[record.id] = _Known(record)
            else:
                rows.pop(record.id, None)
        ids = {v.id for v in listed}
        for gone in [i for i in rows if i not in ids]:
            del rows[gone]
        return [known.record for v in listed if (known := rows.get(v.id)) is not None]

    def wrote(self, record: ExperimentRecord, state: RolloutState) -> None:
        """The controller stored `record` (at its new version), its memory `state`."""
        if record.id in self._rows:
            self._rows[record.id] = _Known(record, state, parsed=True)

    def remember(self, experiment: ExperimentRecord, state: RolloutState) -> None:
        """A look's memory kept here and not written (`only_look_time`): the next look
        of the same record starts from it. A record read again (another version) starts
        from what it stores."""
        known = self._rows.get(experiment.id)
        if known is not None and known.record is experiment:
            known.state = state
            known.parsed = True

    def stored_state(self, experiment: ExperimentRecord) -> RolloutState | None:
        """The experiment's rollout memory: as stored, parsed once per record held, or
        as a look `remember`ed it since.
        KeyError, TypeError or ValueError when it is unreadable."""
        known = self._rows.get(experiment.id)
        if known is None or known.record is not experiment:
            return stored_rollout_state(experiment)
        if not known.parsed:
            known.state = stored_rollout_state(experiment)
            known.parsed = True
        return known.state
