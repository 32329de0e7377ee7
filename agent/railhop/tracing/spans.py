"""Span descriptions: what the failover assembler produces and the sinks consume.

Times are wall-clock ns since the epoch, converted from the events' ``CLOCK_MONOTONIC`` with one
offset (:func:`epoch_offset_ns`); ids are the OTLP ones (128-bit trace, 64-bit span).
"""

from __future__ import annotations

import errno as errno_mod
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

AttrValue = str | bool | int | float | tuple[str, ...] | tuple[int, ...] | tuple[float, ...]
Attrs = dict[str, AttrValue]
StatusCode = Literal["unset", "ok", "error"]

SCOPE_NAME = "railhop"
SERVICE_NAME_DEFAULT = "railhop-agent"

# span names
FAILOVER = "railhop.failover"
DETECTION = "railhop.detection"
DECISION = "railhop.decision"
MIGRATION = "railhop.migration"
ESCALATION = "railhop.escalation"
FAILBACK = "railhop.failback"
FAIR_SHARE = "railhop.fair_share"


class TracingError(Exception):
    """Base class of tracing errors (bad configuration)."""


# ---------------------------------------------------------------------------------------------
# span descriptions (what the assembler produces and the sinks consume)


@dataclass(frozen=True)
class SpanEvent:
    name: str
    time_ns: int  # wall clock, ns since the epoch
    attributes: Attrs = field(default_factory=dict)


@dataclass(frozen=True)
class SpanDesc:
    """One finished span. Times are wall-clock ns since the epoch; ids are the OTLP ones."""

    name: str
    trace_id: int  # 128 bits
    span_id: int  # 64 bits
    parent_id: int | None
    start_ns: int
    end_ns: int
    attributes: Attrs = field(default_factory=dict)
    events: tuple[SpanEvent, ...] = ()
    status: StatusCode = "unset"
    status_message: str = ""

    @property
    def trace_id_hex(self) -> str:
        return f"{self.trace_id:032x}"

    @property
    def span_id_hex(self) -> str:
        return f"{self.span_id:016x}"


def epoch_offset_ns(
    wall: Callable[[], int] = time.time_ns, mono: Callable[[], int] = time.monotonic_ns
) -> int:
    """``wall - monotonic`` in ns, from the tightest of a few paired reads (one offset for the
    agent's life, so spans keep the events' own spacing)."""
    best: tuple[int, int] | None = None
    for _ in range(5):
        m0 = mono()
        w = wall()
        m1 = mono()
        if best is None or m1 - m0 < best[0]:
            best = (m1 - m0, w - (m0 + m1) // 2)
    assert best is not None
    return best[1]


def errno_name(err: int) -> str:
    """``110`` -> ``"ETIMEDOUT"`` (sign ignored); ``"errno_<n>"`` when unknown."""
    return errno_mod.errorcode.get(abs(err), f"errno_{abs(err)}")
