"""Instruction counts from callgrind, the same on a loaded machine as on a quiet one."""

from __future__ import annotations

import re
from collections.abc import Callable


def instructions_per(count: int, output: Callable[[int], str]) -> int:
    """User-space instructions per item: a run of `count` items minus a run of none.
    `output(n)` runs n items under `valgrind --tool=callgrind` and returns what it
    printed (callgrind's summary included)."""

    def collected(n: int) -> int:
        out = output(n)
        match = re.search(r"Collected : (\d+)", out)
        if match is None:
            raise RuntimeError(f"no instruction count from callgrind:\n{out[-2000:]}")
        return int(match.group(1))

    return round((collected(count) - collected(0)) / count)
