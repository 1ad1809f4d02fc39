"""Prometheus's answer to an instant query, parsed strictly into one number.

The answer is untrusted bytes (a proxy in front of Prometheus, a wrong URL, a
Prometheus under load): every shape is checked, and anything but one finite value —
a scalar, or an instant vector of exactly one series — is no data with a reason a
person can act on. Several series are not summed here: which aggregation is right is
the rule author's call (`sum()` for counts, `max()` for a worst case).
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

MAX_ANSWER_BYTES = 256 * 1024
_MAX_REASON = 200
# Prometheus formats sample values with Go's strconv: decimals, exponents, ±Inf, NaN
_NUMBER = re.compile(r"[+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?|[+-]?Inf|NaN")


class NoData(Exception):
    """The query gave nothing usable: `outcome` is a short word for counters and
    log-state, `reason` the one line shown in events and logs."""

    def __init__(self, outcome: str, reason: str) -> None:
        super().__init__(reason)
        self.outcome = outcome
        self.reason = reason


def one_line(text: str, limit: int = _MAX_REASON) -> str:
    """Untrusted text made fit for a log line: printable, one line, bounded."""
    cleaned = "".join(c if c.isprintable() else " " for c in text)
    cleaned = " ".join(cleaned.split())
    return cleaned if len(cleaned) <= limit else cleaned[: limit - 1] + "…"


def parse_answer(status: int, body: bytes) -> float:
    """The query's one value, or NoData saying why there is none."""
    try:
        doc = json.loads(body)
    except (ValueError, RecursionError):
        if status != 200:
            raise NoData("http_error", f"prometheus answered HTTP {status}") from None
        raise NoData("bad_answer", "prometheus's answer is not JSON") from None
    if not isinstance(doc, dict):
        raise NoData("bad_answer", "prometheus's answer is not a JSON object")
    if doc.get("status") == "error":
        kind = doc.get("errorType")
        error = doc.get("error")
        detail = f"{kind}: {error}" if isinstance(kind, str) and isinstance(error, str) else "?"
        raise NoData("refused", f"prometheus refused the query (HTTP {status}): {one_line(detail)}")
    if status != 200:
        raise NoData("http_error", f"prometheus answered HTTP {status}")
    if doc.get("status") != "success":
        raise NoData("bad_answer", "prometheus's answer has no status success")
    data = doc.get("data")
    if not isinstance(data, dict):
        raise NoData("bad_answer", "prometheus's answer has no data object")
    kind = data.get("resultType")
    result = data.get("result")
    if kind == "scalar":
        return _finite(_sample_value(result))
    if kind != "vector":
        shown = one_line(kind, 20) if isinstance(kind, str) else "?"
        raise NoData(
            "bad_answer",
            f"the query returns a {shown}, expected one instant-vector series or a scalar",
        )
    if not isinstance(result, list):
        raise NoData("bad_answer", "prometheus's vector is not a list")
    if not result:
        raise NoData("empty", "no series matched (an empty answer)")
    if len(result) > 1:
        raise NoData(
            "several_series", f"{len(result)} series, expected one: add a sum()/max()"
        )
    series = result[0]
    if not isinstance(series, dict) or not isinstance(series.get("metric", {}), dict):
        raise NoData("bad_answer", "prometheus's series is not an object")
    return _finite(_sample_value(series.get("value")))


def _sample_value(pair: Any) -> float:
    """[<unix time>, "<value>"], as Prometheus writes a sample."""
    if (
        not isinstance(pair, list)
        or len(pair) != 2
        or isinstance(pair[0], bool)
        or not isinstance(pair[0], int | float)
        or not isinstance(pair[1], str)
        or len(pair[1]) > 64
        or not _NUMBER.fullmatch(pair[1])
    ):
        raise NoData("bad_answer", "prometheus's sample is not [time, \"value\"]")
    return float(pair[1])


def _finite(value: float) -> float:
    if math.isnan(value):
        raise NoData("not_finite", "the value is NaN (a division by zero?)")
    if math.isinf(value):
        raise NoData("not_finite", f"the value is {'+' if value > 0 else '-'}Inf")
    return value


__all__ = ["MAX_ANSWER_BYTES", "NoData", "one_line", "parse_answer"]
