"""One access-log line → one sample (architecture §5), for the routers' log parsers.

A router's proxy sends one datagram per request it proxied (`receiver.py`); its
parser (`routers/nginx/log_lines.py`, `routers/haproxy/log_lines.py`) turns it into
the tuple the sidecar's reporter takes, `sidecar.choice.Sample`:

    (ts, experiment, variant, rt_us, outcome, unit_hash, first_byte_us)

A line carries the route's salt and the raw sticky unit; the parser hashes the unit
at once with the sidecar's function (`sidecar.assignment.unit_hash`), so a unit has
the same id in router samples as in sidecar samples, and the raw id is never kept,
stored or sent. A line that does not parse is counted under a reason and dropped;
nothing a proxy sends can raise out of `parse`.
"""

from __future__ import annotations

from collections import Counter
from typing import Protocol

from sidecar.choice import Sample

# A line longer than this is not ours (ours are ~300 bytes plus the unit, whose
# header the proxies bound far lower): refused unread.
MAX_LINE = 16_384


class LineParser(Protocol):
    """Parses one datagram of a proxy's access log."""

    @property
    def rejected(self) -> Counter[str]:
        """Lines refused, by reason (`malformed`, `too_long`, `forged`, `other_service`, …)."""
        ...

    def parse(self, datagram: bytes) -> Sample | None:
        """The sample of one line; None when it is refused (counted in `rejected`)
        or carries no experiment (counted as `unattributed`)."""
        ...


__all__ = ["MAX_LINE", "LineParser"]
