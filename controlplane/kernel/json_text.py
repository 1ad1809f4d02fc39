"""JSON text that costs what changed: dicts built once from a frozen value keep their
encoding, and `dumps` reuses it.

A controller writes each running experiment's rollout memory at every fresh look, yet
most of it (the step's tally, its unit sums and sketches) changes once a window, not
once a look. The frozen values that own those parts hand out a `FrozenDict`, built
once per value; `dumps` encodes everything else and splices the kept text in. The text
is exactly `json.dumps(value)`'s, so what is stored reads back as before, and
`json.dumps`'s own rules (non-string keys, NaN) hold unchanged.
"""

from __future__ import annotations

import json
from typing import Any, NoReturn


class FrozenDict(dict[str, Any]):
    """A JSON-ready dict that is never changed once built, so its text can be kept.

    Built by a frozen value's cached `to_dict`, shared by every caller: changing it
    would change every later write of that value, so it refuses to be changed.
    """

    __slots__ = ("_text",)
    _text: str

    def _refuse(self, *args: Any, **kwargs: Any) -> NoReturn:
        raise TypeError("a FrozenDict is shared and never changed; copy it with dict()")

    __setitem__ = __delitem__ = __ior__ = _refuse
    clear = pop = popitem = setdefault = update = _refuse

    def json_text(self) -> str:
        """`json.dumps(self)`, encoded once."""
        try:
            return self._text
        except AttributeError:
            text = _encode_dict(self)
            self._text = text
            return text


def dumps(value: Any) -> str:
    """`json.dumps(value)`, reusing the kept text of the FrozenDicts inside dicts."""
    if isinstance(value, FrozenDict):
        return value.json_text()
    if type(value) is dict:
        return _encode_dict(value)
    return json.dumps(value)


def _encode_dict(value: dict[Any, Any]) -> str:
    if not any(isinstance(v, dict) for v in value.values()):
        return json.dumps(value)
    if not all(type(k) is str for k in value):
        # json.dumps turns such keys into strings its own way: leave it all to it
        return json.dumps(value)
    # runs of plain items encoded in one call, dicts (kept or not) in between
    parts: list[str] = []
    run: dict[str, Any] = {}
    for key, item in value.items():
        if isinstance(item, dict):
            if run:
                parts.append(json.dumps(run)[1:-1])
                run = {}
            parts.append(f"{json.dumps(key)}: {dumps(item)}")
        else:
            run[key] = item
    if run:
        parts.append(json.dumps(run)[1:-1])
    return "{" + ", ".join(parts) + "}"
