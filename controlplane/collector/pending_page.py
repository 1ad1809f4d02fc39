"""The per-stream pending gauge as /metrics text, written when the counts change.

`canary_collector_pending_entries{service=…}` has a series per stream the collector
reads: 1,000 at N = 1,000. As a prometheus_client Gauge, every scrape rendered every
series again (~5 ms of the admin thread's CPU, which shares the GIL with ingest), and
every claim look set each child under its lock. The counts change only at a claim
look (once a second): the look writes the page (`set_all`), a scrape sends it
(`text`), byte for byte what prometheus_client writes for the same gauge. A stream
the collector no longer reads leaves the page, where a Gauge kept its last value.

The page is one bytes object, replaced whole: the admin thread reads either the page
before a look or the one after it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from prometheus_client.utils import floatToGoString

# the library's own number format (Go's float formatting), untyped where it is defined
_number: Callable[[float], str] = floatToGoString

NAME = "canary_collector_pending_entries"
HELP = "entries pending in the group, per stream"


def _escaped(value: str) -> str:
    """A label value as the text format writes it (prometheus_client's escaping)."""
    return value.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")


def pending_text(counts: Mapping[str, int]) -> bytes:
    """The gauge's family: HELP, TYPE, and a line per stream in the order given."""
    lines = [f"# HELP {NAME} {HELP}\n", f"# TYPE {NAME} gauge\n"]
    lines += [f'{NAME}{{service="{_escaped(service)}"}} {_number(count)}\n'
              for service, count in counts.items()]  # fmt: skip
    return "".join(lines).encode("utf-8")


class PendingPage:
    """The page the last claim look wrote (an empty family before the first)."""

    def __init__(self) -> None:
        self._counts: dict[str, int] = {}
        self._page = pending_text({})
        self.written = 0  # pages written (a look whose counts did not change writes none)

    def set_all(self, counts: Mapping[str, int]) -> None:
        """A claim look's counts, every stream it looked at (on the collector's loop)."""
        if counts == self._counts:
            return
        self._counts = dict(counts)
        self._page = pending_text(self._counts)
        self.written += 1

    def text(self) -> bytes:
        """For a scrape (any thread)."""
        return self._page
