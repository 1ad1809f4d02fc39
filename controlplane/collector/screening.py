"""What a collector lets into its windows: a verified, decoded, plausible batch.

`screen_entry` is the one gate between a stream entry (anyone with Redis write access
can add one) and the windows: bounded size, then the signature (when keys are
configured), then the codec's strict decode, then the batch's times against the
collector's clock. Anything else is a CodecError whose `reason` labels the drop
counter. `DropLog` says so in the log, at most once per reason per interval, and
never with more than a bounded, printable excerpt of what the entry carried.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from controlplane.kernel.clock import Clock
from controlplane.kernel.codec import (
    MAX_PAYLOAD,
    OVERSIZED,
    REASONS,
    BatchMeta,
    RawBatch,
    check_times,
    parse_entry_raw,
)
from controlplane.kernel.errors import CodecError
from controlplane.kernel.keys import is_experiment_id
from controlplane.kernel.sample_auth import (
    BAD_SIGNATURE,
    UNKNOWN_KEY,
    UNSIGNED,
    SampleVerifier,
)
from controlplane.kernel.streams import StreamEntry

TOO_MANY_VARIANTS = "too_many_variants"
INTERNAL_ERROR = "internal_error"
DROP_REASONS = (*REASONS, UNSIGNED, UNKNOWN_KEY, BAD_SIGNATURE, TOO_MANY_VARIANTS, INTERNAL_ERROR)
# an experiment has two variants; a few more are allowed, not one ring per forged name
MAX_VARIANTS_PER_EXPERIMENT = 16
_EXCERPT = 160


def screen_entry(
    entry: StreamEntry, now: float, verifier: SampleVerifier | None
) -> tuple[BatchMeta, RawBatch]:
    """The entry's batch if it may be counted; CodecError(reason) if not."""
    data = entry.fields.get("data")
    if isinstance(data, bytes) and len(data) > MAX_PAYLOAD:
        # before the MAC: hashing megabytes of junk is work an attacker chose
        raise CodecError(f"sample payload of {len(data)} bytes is too large", OVERSIZED)
    if verifier is not None:
        verifier.verify(entry.service, entry.fields)
    meta, batch = parse_entry_raw(entry.fields)
    check_times(batch, now)
    return meta, batch


def experiment_of(entry: StreamEntry) -> str | None:
    """The entry's experiment id if it is a well-formed one (for a look-up by id)."""
    raw = entry.fields.get("exp")
    if not isinstance(raw, bytes) or len(raw) > 64:
        return None
    text = raw.decode("ascii", "replace")
    return text if is_experiment_id(text) else None


def excerpt(text: str) -> str:
    """At most _EXCERPT printable characters of a message that may carry input."""
    clean = "".join(c if c.isprintable() else "?" for c in text[: _EXCERPT + 1])
    return clean if len(clean) <= _EXCERPT else clean[:_EXCERPT] + "…"


@dataclass
class DropLog:
    """One warning per reason per `interval` seconds; the others are summed into it."""

    logger: logging.Logger
    clock: Clock
    interval: float = 10.0
    _last: dict[str, float] = field(default_factory=dict)
    _suppressed: dict[str, int] = field(default_factory=dict)

    def dropped(self, reason: str, service: str, entry_id: str, detail: str) -> None:
        now = self.clock.monotonic()
        last = self._last.get(reason)
        if last is not None and now - last < self.interval:
            self._suppressed[reason] = self._suppressed.get(reason, 0) + 1
            return
        self._last[reason] = now
        more = self._suppressed.pop(reason, 0)
        self.logger.warning(
            "sample entry %s on %s dropped and acked (%s): %s%s",
            excerpt(entry_id),
            excerpt(service),
            reason,
            excerpt(detail),
            f" (and {more} more since the last such line)" if more else "",
        )
