"""The agent's log lines: ISO 8601 UTC timestamps with milliseconds, as text or JSON.

``text``: ``2026-12-05T06:09:29.123Z INFO railhop.agent: message``.
``json``: one object per line, ``{"ts", "level", "logger", "msg", ...}`` plus every field the
caller passed with ``extra=`` (values that JSON cannot carry are written with ``str``) and
``exc`` when the record carries an exception.
"""

from __future__ import annotations

import json
import logging
import time
from typing import Any

FORMATS = ("text", "json")

# the attributes every LogRecord has: anything else on a record came from ``extra=``
_RESERVED = frozenset(vars(logging.LogRecord("", 0, "", 0, "", (), None))) | {
    "message",
    "asctime",
    "taskName",
}


def iso_utc(created: float) -> str:
    """``created`` (seconds since the epoch) as ``YYYY-MM-DDTHH:MM:SS.mmmZ``."""
    secs = int(created)
    ms = int((created - secs) * 1000)
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(secs)) + f".{ms:03d}Z"


class TextFormatter(logging.Formatter):
    """``TS LEVEL LOGGER: MESSAGE`` (traceback on the following lines)."""

    def __init__(self) -> None:
        super().__init__("%(levelname)s %(name)s: %(message)s")

    def formatTime(self, record: logging.LogRecord, datefmt: str | None = None) -> str:
        return iso_utc(record.created)

    def format(self, record: logging.LogRecord) -> str:
        return f"{self.formatTime(record)} {super().format(record)}"


class JsonFormatter(logging.Formatter):
    """One JSON object per record, on one line."""

    def format(self, record: logging.LogRecord) -> str:
        doc: dict[str, Any] = {
            "ts": iso_utc(record.created),
            "level": record.levelname,
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for k, v in vars(record).items():
            if k not in _RESERVED and k not in doc and not k.startswith("_"):
                doc[k] = v
        if record.exc_info:
            doc["exc"] = self.formatException(record.exc_info)
        elif record.exc_text:
            doc["exc"] = record.exc_text
        return json.dumps(doc, default=str)


def make_formatter(fmt: str) -> logging.Formatter:
    if fmt == "text":
        return TextFormatter()
    if fmt == "json":
        return JsonFormatter()
    raise ValueError(f"unknown log format {fmt!r} (choose from {', '.join(FORMATS)})")


def configure(level: int, fmt: str) -> None:
    """Send the root logger's records to stderr in ``fmt`` (replacing earlier handlers)."""
    handler = logging.StreamHandler()
    handler.setFormatter(make_formatter(fmt))
    root = logging.getLogger()
    for h in list(root.handlers):
        root.removeHandler(h)
    root.addHandler(handler)
    root.setLevel(level)
