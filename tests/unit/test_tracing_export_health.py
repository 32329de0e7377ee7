"""Issue 19, 10: with no collector the SDK's exporter warned at every batch; now a failing
endpoint is logged once and then at most once a minute, and its health reaches status.json."""

from __future__ import annotations

import logging
import socket
import time
from collections.abc import Sequence
from typing import Any

import pytest

from railhop.control.status import format_agent
from railhop.tracing import sinks_from_env
from railhop.tracing.export_health import ExportHealth, ThrottleFilter, TrackedExporter


def test_throttle_filter_passes_the_first_then_one_a_minute() -> None:
    now = [100.0]
    f = ThrottleFilter(60.0, clock=lambda: now[0])

    def rec() -> logging.LogRecord:
        return logging.LogRecord("x", logging.WARNING, __file__, 1, "refused", None, None)

    assert f.filter(rec())
    assert not any(f.filter(rec()) for _ in range(50))
    now[0] += 61
    r = rec()
    assert f.filter(r) and "50 similar messages" in str(r.msg)
    info = logging.LogRecord("x", logging.INFO, __file__, 1, "fine", None, None)
    assert f.filter(info)  # below WARNING: untouched


class Failing:
    def __init__(self) -> None:
        self.ok = False

    def export(self, spans: Sequence[Any]) -> Any:
        from opentelemetry.sdk.trace.export import SpanExportResult

        if self.ok:
            return SpanExportResult.SUCCESS
        raise ConnectionRefusedError(111, "Connection refused")

    def shutdown(self) -> None:
        pass

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return True


def test_tracked_exporter_records_health_and_logs_once(caplog: pytest.LogCaptureFixture) -> None:
    inner = Failing()
    h = ExportHealth("otlp", "http://127.0.0.1:9")
    ex = TrackedExporter(inner, h)
    with caplog.at_level(logging.INFO, logger="railhop.tracing"):
        for _ in range(20):
            ex.export([])
        assert h.failed_batches == 20 and not h.healthy
        assert "Connection refused" in h.last_error
        warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
        assert len(warnings) == 1 and "127.0.0.1:9" in warnings[0].getMessage()
        inner.ok = True
        ex.export([])
    assert h.healthy and h.ok_batches == 1
    assert any("works again" in r.getMessage() for r in caplog.records)
    lines = format_agent({"export": [h.as_dict()], "privileges": {}})
    assert lines == [
        "trace export otlp to http://127.0.0.1:9: ok; 1 batches sent, 20 failed",
    ]
    h.failed_batches += 1
    h.last_failure_unix = time.time() + 1
    assert "FAILING" in format_agent({"export": [h.as_dict()]})[0]
    assert format_agent({"export": []}) == ["trace export: off"]


def test_sdk_exporter_to_a_dead_endpoint_is_logged_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The SDK's own OTLP/HTTP exporter and batch processor, pointed at a closed port."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: connection refused
    env = {
        "OTEL_TRACES_EXPORTER": "otlp",
        "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{port}",
        "OTEL_EXPORTER_OTLP_TIMEOUT": "0.2",
    }
    health: list[ExportHealth] = []
    sinks, _ = sinks_from_env(env, hostname="h", health=health)
    (sink,) = sinks
    (h,) = health
    assert h.endpoint == f"http://127.0.0.1:{port}"
    from railhop.tracing.spans import SpanDesc

    span = SpanDesc(
        name="railhop.failover",
        trace_id=1,
        span_id=1,
        parent_id=None,
        start_ns=1,
        end_ns=2,
        attributes={},
    )
    with caplog.at_level(logging.INFO):
        deadline = time.monotonic() + 60
        for _ in range(4):
            sink.emit([span])
            for p in getattr(sink, "processors", []):
                p.force_flush(5000)
        while h.failed_batches < 3:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        sink.shutdown(5.0)
    warnings = [r for r in caplog.records if r.levelno >= logging.WARNING]
    by_logger: dict[str, int] = {}
    for r in warnings:
        by_logger[r.name] = by_logger.get(r.name, 0) + 1
    assert all(n == 1 for n in by_logger.values()), by_logger
    assert not h.healthy
