"""Process logging: text lines for people, or one JSON object per line for collectors.

`configure_logging(level, "json")` makes every record one line holding `time` (UTC,
ISO 8601 with milliseconds), `level`, `logger`, `message`, `exception` (the formatted
traceback, when there is one) and the static `fields` given (a worker's index).

A record logged with `extra={"structured": {...}}` (the decision log,
experiments/decision_log.py) has those fields as keys of its object too, and its
`summary` as the message: the text format's `key=value` line is for people.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Literal

LogFormat = Literal["text", "json"]
LOG_FORMATS: tuple[LogFormat, ...] = ("text", "json")
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


class JsonFormatter(logging.Formatter):
    """One JSON object per record, on one line (newlines in values are escaped)."""

    def __init__(self, fields: Mapping[str, str | int] | None = None) -> None:
        super().__init__()
        self._fields = dict(fields or {})

    def format(self, record: logging.LogRecord) -> str:
        stamp = datetime.fromtimestamp(record.created, UTC)
        entry: dict[str, object] = {
            "time": stamp.isoformat(timespec="milliseconds").replace("+00:00", "Z"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        entry.update(self._fields)
        structured = getattr(record, "structured", None)
        if isinstance(structured, Mapping):
            for key, value in structured.items():
                if key == "summary":
                    entry["message"] = value
                elif key not in entry:
                    entry[key] = value
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        elif record.exc_text:
            entry["exception"] = record.exc_text
        if record.stack_info:
            entry["stack"] = self.formatStack(record.stack_info)
        # default=str: a message argument that is no JSON type is already text here;
        # only a static field could be one
        return json.dumps(entry, ensure_ascii=False, default=str)


def log_formatter(
    fmt: LogFormat, *, text_format: str = TEXT_FORMAT, fields: Mapping[str, str | int] | None = None
) -> logging.Formatter:
    if fmt == "json":
        return JsonFormatter(fields)
    return logging.Formatter(text_format)


def configure_logging(
    level: str,
    fmt: LogFormat = "text",
    *,
    text_format: str = TEXT_FORMAT,
    fields: Mapping[str, str | int] | None = None,
) -> None:
    """Send the root logger's records to stderr in `fmt`.

    As `logging.basicConfig`: nothing changes when the root logger has handlers already
    (a host process, or a test harness capturing the logs, configured it)."""
    handler = logging.StreamHandler()
    handler.setFormatter(log_formatter(fmt, text_format=text_format, fields=fields))
    logging.basicConfig(level=level.upper(), handlers=[handler])
