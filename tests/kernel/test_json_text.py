"""JSON text that reuses the kept encoding of frozen parts: always json.dumps's text."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from controlplane.kernel.json_text import FrozenDict, dumps

_scalars = st.one_of(
    st.none(), st.booleans(), st.integers(), st.floats(), st.text(max_size=8)
)
_keys = st.one_of(st.text(max_size=6), st.integers(), st.floats(allow_nan=False), st.booleans())


def _values(frozen: bool) -> st.SearchStrategy[Any]:
    def extend(inner: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
        dicts: st.SearchStrategy[Any] = st.dictionaries(st.text(max_size=6), inner, max_size=5)
        options = [st.lists(inner, max_size=4), dicts, st.dictionaries(_keys, inner, max_size=3)]
        if frozen:
            options.append(dicts.map(FrozenDict))
        return st.one_of(*options)

    return st.recursive(_scalars, extend, max_leaves=30)


@given(_values(frozen=True))
def test_the_text_is_json_dumps_text(value: Any) -> None:
    assert dumps(value) == json.dumps(value)


@given(_values(frozen=True))
def test_kept_text_is_reused_and_stays_right(value: Any) -> None:
    first = dumps(value)
    assert dumps(value) == first == json.dumps(value)


def test_a_kept_part_is_encoded_once() -> None:
    part = FrozenDict(a=[1.5, 2], b="x")
    expected = '{"x": 1, "part": {"a": [1.5, 2], "b": "x"}, "y": null}'
    assert dumps({"x": 1, "part": part, "y": None}) == expected
    part._text = '"kept"'  # the kept text is what is spliced in
    assert dumps({"x": 1, "part": part}) == '{"x": 1, "part": "kept"}'


def test_nan_and_infinity_are_written_as_json_dumps_writes_them() -> None:
    value = {"a": FrozenDict(n=math.nan, i=math.inf), "b": -math.inf}
    assert dumps(value) == json.dumps(value) == '{"a": {"n": NaN, "i": Infinity}, "b": -Infinity}'


@pytest.mark.parametrize(
    "change",
    [
        lambda d: d.__setitem__("a", 2),
        lambda d: d.__delitem__("a"),
        lambda d: d.update(a=2),
        lambda d: d.pop("a"),
        lambda d: d.popitem(),
        lambda d: d.setdefault("b", 1),
        lambda d: d.clear(),
    ],
)
def test_a_frozen_dict_refuses_to_change(change: Any) -> None:
    frozen = FrozenDict(a=1)
    with pytest.raises(TypeError):
        change(frozen)
    assert frozen == {"a": 1}
    copy = dict(frozen)
    copy["a"] = 2
    assert copy == {"a": 2}
