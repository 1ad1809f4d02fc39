"""Values parsed once per exact text (controller/parsed_by_text.py): what the
reconciler's full pass reuses of the routes and configs it read 5 s before."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from controlplane.controller.parsed_by_text import ParsedByText
from controlplane.kernel.errors import ValidationFailed
from controlplane.kernel.routes import RouteState, parse_route
from tests.support.routes import two_way_route


def test_the_same_text_is_parsed_once_and_a_changed_one_again() -> None:
    calls: list[tuple[str, bytes]] = []

    def parse(key: str, raw: bytes) -> int:
        calls.append((key, raw))
        return len(raw)

    parsed = ParsedByText(parse)
    assert parsed.get("a", b"xx") == 2
    assert parsed.get("a", b"xx") == 2
    assert parsed.get("b", b"xx") == 2  # another key: its own parse
    assert parsed.get("a", b"xyz") == 3
    assert calls == [("a", b"xx"), ("b", b"xx"), ("a", b"xyz")]
    assert (parsed.parsed, parsed.reused) == (3, 1)


def test_a_parse_that_raises_is_not_kept() -> None:
    def parse(_key: str, raw: bytes) -> object:
        return parse_route(raw)

    parsed = ParsedByText(parse)
    for _ in range(2):
        with pytest.raises(ValidationFailed):
            parsed.get("checkout", b"{not json")
    assert len(parsed) == 0


def test_keys_no_longer_read_are_forgotten() -> None:
    parsed = ParsedByText(lambda _key, raw: raw)
    for key in ("a", "b", "c"):
        parsed.get(key, key)
    parsed.keep({"b"})
    assert len(parsed) == 1


@given(st.lists(st.tuples(st.sampled_from("abc"), st.integers(0, 3)), max_size=40))
def test_every_answer_is_the_parse_of_the_text_given(reads: list[tuple[str, int]]) -> None:
    """Whatever the order of keys and texts, a cached answer equals a fresh parse."""
    texts = [
        two_way_route(r + 1, experiment=7, canary_bp=500 * r, state=RouteState.RUNNING)
        .to_json().encode()
        for r in range(4)
    ]
    parsed = ParsedByText(lambda _key, raw: parse_route(raw))
    for key, which in reads:
        assert parsed.get(key, texts[which]) == parse_route(texts[which])
