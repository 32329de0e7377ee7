"""The control plane's one error family."""

from __future__ import annotations


class ControlError(Exception):
    """Base class of every error raised by railhop.control."""


class TableError(ControlError):
    """The health table cannot be written or read (bad input, bad file, corrupt content)."""


class EventDecodeError(ControlError):
    """A lane-event message is malformed. ``reason`` is a short stable code used in counters."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"malformed lane event ({reason}): {detail}")
        self.reason = reason
        self.detail = detail
