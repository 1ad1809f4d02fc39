"""/metrics pages: a registry's families, then the text of parts that write their own.

A part with thousands of series (the leader's per-experiment board) writes them in the
text format itself, at a tenth of what building and rendering them through
prometheus_client costs (decision 0069); `TextRegistry` holds such writers beside its
collectors, and `render` is what every /metrics of the API answers with.
"""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import CollectorRegistry, generate_latest

TextWriter = Callable[[], str]


class TextRegistry(CollectorRegistry):
    """A CollectorRegistry that also holds writers of ready text-format families."""

    def __init__(self, auto_describe: bool = True) -> None:
        super().__init__(auto_describe=auto_describe)
        self._writers: list[TextWriter] = []

    def add_text(self, writer: TextWriter) -> None:
        """`writer` returns whole families (HELP, TYPE, samples) whose names no
        collector of this registry uses."""
        self._writers.append(writer)

    def writers(self) -> list[TextWriter]:
        return list(self._writers)


def render(registry: CollectorRegistry) -> bytes:
    """The registry's page: its collectors as prometheus_client renders them, then
    its writers' text. A collector's dict changed while it was read raises
    RuntimeError, as generate_latest does."""
    page = generate_latest(registry)
    if isinstance(registry, TextRegistry):
        page += "".join(writer() for writer in registry.writers()).encode()
    return page
