"""Latency samples from a file: one number per line, or one named column of a CSV.

Files come from anywhere, so every value is checked (a finite, non-negative number
of milliseconds), the size is bounded, and the first bad line is named as
`file:line: what is wrong`.
"""

from __future__ import annotations

import csv
import math
from pathlib import Path

from controlplane.kernel.errors import ValidationFailed

MAX_FILE_BYTES = 64 * 1024 * 1024
MAX_SAMPLES = 1_000_000
MAX_LATENCY_MS = 1e9
MAX_LINE_CHARS = 4096


class SampleFileError(ValidationFailed):
    """A sample file that cannot be read; the message names file and line."""


def _number(text: str, where: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise SampleFileError(f"{where}: not a number: {text[:40]!r}") from None
    if not math.isfinite(value) or value < 0 or value > MAX_LATENCY_MS:
        raise SampleFileError(f"{where}: {text[:40]!r} is not a latency in [0, {MAX_LATENCY_MS:g}]")
    return value


def read_samples(path: Path, *, column: str | None = None) -> list[float]:
    """The latencies in `path`; blank lines are skipped."""
    try:
        size = path.stat().st_size
        if size > MAX_FILE_BYTES:
            raise SampleFileError(f"{path}: {size} bytes, more than {MAX_FILE_BYTES}")
        with path.open(encoding="utf-8", newline="") as handle:
            lines = handle.read().splitlines()
    except UnicodeDecodeError:
        raise SampleFileError(f"{path}: not UTF-8 text") from None
    except OSError as exc:
        raise SampleFileError(f"{path}: {exc.strerror or exc}") from None
    return _from_csv(path, lines, column) if column is not None else _from_lines(path, lines)


def _check_line(path: Path, number: int, line: str) -> None:
    if len(line) > MAX_LINE_CHARS:
        raise SampleFileError(f"{path}:{number}: a line of more than {MAX_LINE_CHARS} characters")


def _bounded(path: Path, values: list[float]) -> list[float]:
    if len(values) > MAX_SAMPLES:
        raise SampleFileError(f"{path}: more than {MAX_SAMPLES} samples")
    return values


def _from_lines(path: Path, lines: list[str]) -> list[float]:
    values: list[float] = []
    for number, line in enumerate(lines, start=1):
        _check_line(path, number, line)
        text = line.strip()
        if not text:
            continue
        if number == 1 and "," in text:
            raise SampleFileError(f"{path}:1: looks like CSV: name the column with --column")
        values.append(_number(text, f"{path}:{number}"))
        _bounded(path, values)
    return values


def _from_csv(path: Path, lines: list[str], column: str) -> list[float]:
    for number, line in enumerate(lines, start=1):
        _check_line(path, number, line)
    rows = csv.reader(lines)
    header = next(rows, None)
    if header is None:
        raise SampleFileError(f"{path}: empty, no header with a {column!r} column")
    names = [h.strip() for h in header]
    if column not in names:
        raise SampleFileError(f"{path}:1: no column {column!r} (columns: {', '.join(names)})")
    index = names.index(column)
    values: list[float] = []
    for number, row in enumerate(rows, start=2):
        if not row or all(not cell.strip() for cell in row):
            continue
        if index >= len(row):
            raise SampleFileError(f"{path}:{number}: no value in column {column!r}")
        values.append(_number(row[index].strip(), f"{path}:{number}"))
        _bounded(path, values)
    return values
