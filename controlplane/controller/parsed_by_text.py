"""Values parsed once per exact text, kept by key between passes.

A full pass of the reconciler reads every route from etcd and from SQL, and they are
nearly all what they were 5 s before: validating each (pydantic, the upstreams' hosts)
was most of the pass's CPU at N = 1,000 (decision 0078). A parse is a pure function of
its text, so the value parsed from the same key's same text is reused, and only a text
that changed is parsed again. A parse that raises is not kept: it raises again.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from typing import Generic, TypeVar

K = TypeVar("K")
R = TypeVar("R")
T = TypeVar("T")


class ParsedByText(Generic[K, R, T]):
    """`parse(key, raw)`, kept per key for as long as its raw text stays equal."""

    def __init__(self, parse: Callable[[K, R], T]) -> None:
        self._parse = parse
        self._held: dict[K, tuple[R, T]] = {}
        self.parsed = 0
        self.reused = 0

    def __len__(self) -> int:
        return len(self._held)

    def get(self, key: K, raw: R) -> T:
        held = self._held.get(key)
        if held is not None and held[0] == raw:
            self.reused += 1
            return held[1]
        value = self._parse(key, raw)
        self._held[key] = (raw, value)
        self.parsed += 1
        return value

    def keep(self, keys: Collection[K]) -> None:
        """Forget every key not in `keys` (what a full read no longer found)."""
        for key in [k for k in self._held if k not in keys]:
            del self._held[key]
