"""The workers' metrics as one sidecar's: Prometheus text in, merged families out.

Each sample (a name and its labels) is summed across workers: requests, samples and
histogram buckets add up, and so do gauges of quantities (open connections, buffered
samples). Gauges that are a state rather than a quantity take the minimum instead:
the route revision every worker has reached, ready only if every worker is. A
`_created` timestamp takes the earliest.

A worker that exits takes its counters with it, and the sum would go down, which
Prometheus reads as a reset. So the supervisor folds what it last read of an exited
worker's counters and histograms (`lasting`) into that worker's slot, and the sums
only grow.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families

MIN_GAUGES = frozenset({"canary_sidecar_route_revision", "canary_sidecar_ready"})
_LASTING_TYPES = frozenset({"counter", "histogram", "summary"})

Families = Sequence[Metric]


def parse(text: str) -> list[Metric]:
    """A worker's /metrics text; ValueError when it does not parse."""
    try:
        return list(text_string_to_metric_families(text))
    except (ValueError, IndexError, TypeError) as exc:  # the parser's ways of refusing
        raise ValueError(f"metrics text does not parse: {exc}") from exc


def lasting(families: Families) -> list[Metric]:
    """What outlives a worker: its counters and histograms (gauges die with it)."""
    return [family for family in families if family.type in _LASTING_TYPES]


def merge(groups: Iterable[Families], *, skip: frozenset[str] = frozenset()) -> list[Metric]:
    """One family per name over every group; a family whose type differs from the
    first seen under its name is left out (a worker of another version)."""
    merged: dict[str, Metric] = {}
    values: dict[str, dict[tuple[str, tuple[tuple[str, str], ...]], float]] = {}
    for families in groups:
        for family in families:
            if family.name in skip:
                continue
            first = merged.get(family.name)
            if first is None:
                first = merged[family.name] = Metric(
                    family.name, family.documentation, family.type, family.unit
                )
                values[family.name] = {}
            elif first.type != family.type:
                continue
            take_min = family.type == "gauge" and family.name in MIN_GAUGES
            table = values[family.name]
            for sample in family.samples:
                key = (sample.name, tuple(sorted(sample.labels.items())))
                old = table.get(key)
                if old is None:
                    table[key] = sample.value
                elif take_min or sample.name.endswith("_created"):
                    table[key] = min(old, sample.value)
                else:
                    table[key] = old + sample.value
    for name, family in merged.items():
        for (sample_name, labels), value in values[name].items():
            family.add_sample(sample_name, dict(labels), value)
    return list(merged.values())


def total(families: Families, sample_name: str) -> float:
    """The sum of every sample called `sample_name` (over all its labels)."""
    return sum(
        sample.value
        for family in families
        for sample in family.samples
        if sample.name == sample_name
    )


def value(families: Families, sample_name: str) -> float | None:
    """The first sample called `sample_name`, or None."""
    for family in families:
        for sample in family.samples:
            if sample.name == sample_name:
                return sample.value
    return None
