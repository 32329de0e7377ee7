"""Export health: whether the OTLP exporter reaches its endpoint, for ``railhop status``, and
the SDK's own failure messages kept to one at once and then one a minute.

With no ``OTEL_*`` variable set the SDK's exporter sends to ``localhost:4318``; where no
collector listens, every batch failed with a connection-refused warning (every few seconds).
The exporter stays the SDK's (it is what the variables configure); :class:`TrackedExporter`
only watches its results, and :class:`ThrottleFilter` on the SDK's loggers lets the first
failure through and then at most one record a minute, with the number held back.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

log = logging.getLogger("railhop.tracing")

# the loggers the OTLP exporters and the batch processor report failures on
SDK_LOGGERS = (
    "opentelemetry.exporter.otlp.proto.http.trace_exporter",
    "opentelemetry.exporter.otlp.proto.http._common",
    "opentelemetry.exporter.otlp.proto.grpc.exporter",
    "opentelemetry.sdk.trace.export",
    "opentelemetry.sdk._shared_internal",
)


class ThrottleFilter(logging.Filter):
    """Passes a logger's first WARNING-or-worse record, then at most one per ``interval_s``
    (the one that passes says how many were held back). Lower levels pass untouched."""

    def __init__(
        self, interval_s: float = 60.0, clock: Callable[[], float] = time.monotonic
    ) -> None:
        super().__init__()
        self.interval_s = interval_s
        self._clock = clock
        self._next = 0.0
        self.suppressed = 0
        self._lock = threading.Lock()

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno < logging.WARNING:
            return True
        with self._lock:
            now = self._clock()
            if now < self._next:
                self.suppressed += 1
                return False
            self._next = now + self.interval_s
            held, self.suppressed = self.suppressed, 0
        if held:
            record.msg = f"{record.msg} ({held} similar messages in the last minute not shown)"
        return True


_installed: dict[str, ThrottleFilter] = {}


def throttle_sdk_logs(interval_s: float = 60.0) -> None:
    """Puts a :class:`ThrottleFilter` on each SDK logger (once per process)."""
    for name in SDK_LOGGERS:
        if name not in _installed:
            f = ThrottleFilter(interval_s)
            logging.getLogger(name).addFilter(f)
            _installed[name] = f


@dataclass
class ExportHealth:
    """What ``railhop status`` shows under "export"."""

    exporter: str
    endpoint: str
    ok_batches: int = 0
    failed_batches: int = 0
    last_ok_unix: float | None = None
    last_failure_unix: float | None = None
    last_error: str = ""

    @property
    def healthy(self) -> bool:
        """No failure since the last success (or nothing exported yet)."""
        if self.last_failure_unix is None:
            return True
        return self.last_ok_unix is not None and self.last_ok_unix > self.last_failure_unix

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "healthy": self.healthy}


class TrackedExporter:
    """A span exporter that forwards to ``inner`` (the SDK's) and records each result in
    ``health``; our own line about a failing endpoint is throttled like the SDK's."""

    def __init__(
        self,
        inner: Any,
        health: ExportHealth,
        *,
        interval_s: float = 60.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.inner = inner
        self.health = health
        self._clock = clock
        self._throttle = ThrottleFilter(interval_s, clock=time.monotonic)

    def export(self, spans: Sequence[Any]) -> Any:
        from opentelemetry.sdk.trace.export import SpanExportResult

        try:
            result = self.inner.export(spans)
        except Exception as e:  # an exporter must not raise into the processor thread
            result, err = SpanExportResult.FAILURE, f"{type(e).__name__}: {e}"
        else:
            err = "" if result is SpanExportResult.SUCCESS else "export failed"
        h = self.health
        if result is SpanExportResult.SUCCESS:
            recovered = not h.healthy
            h.ok_batches += 1
            h.last_ok_unix = self._clock()
            if recovered:
                log.info("trace export to %s works again", h.endpoint)
        else:
            h.failed_batches += 1
            h.last_failure_unix = self._clock()
            h.last_error = err
            rec = logging.LogRecord(
                log.name,
                logging.WARNING,
                __file__,
                0,
                "trace export to %s failing (%d batches so far): %s",
                (h.endpoint, h.failed_batches, err),
                None,
            )
            if self._throttle.filter(rec):
                log.handle(rec)
        return result

    def shutdown(self) -> None:
        self.inner.shutdown()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return bool(self.inner.force_flush(timeout_millis))
