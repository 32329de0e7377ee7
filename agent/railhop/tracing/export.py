"""Sinks for span descriptions and the tracer the daemon holds.

:class:`OtelSink` hands spans, as SDK ``ReadableSpan``, to a ``BatchSpanProcessor`` per exporter
chosen by the standard ``OTEL_*`` variables (:func:`sinks_from_env`); :class:`OtlpJsonFileSink`
appends OTLP/JSON lines to a file. :class:`FailoverTracer` = the assembler + its sinks: it never
raises into the agent and its shutdown is bounded.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

from railhop.control.lane_events import LaneEvent
from railhop.tracing.assembler import (
    AssemblerConfig,
    Decision,
    FailoverAssembler,
    Signal,
    StateChange,
)
from railhop.tracing.export_health import ExportHealth, TrackedExporter, throttle_sdk_logs
from railhop.tracing.otlp import default_resource_attributes, otlp_json
from railhop.tracing.spans import SCOPE_NAME, SpanDesc, TracingError, epoch_offset_ns

log = logging.getLogger("railhop.tracing")


# ---------------------------------------------------------------------------------------------
# sinks


class TraceSink(Protocol):
    def emit(self, spans: Sequence[SpanDesc]) -> None:
        """Never blocks on the network, never raises."""

    def shutdown(self, timeout_s: float) -> None:
        """Flushes what it can within ``timeout_s``; never raises."""


class OtlpJsonFileSink:
    """Appends one OTLP/JSON ``ExportTraceServiceRequest`` per line (the format of the
    Collector's ``file`` exporter and ``otlpjsonfile`` receiver)."""

    def __init__(self, path: Path | str, resource: Mapping[str, object]) -> None:
        self.path = Path(path)
        self.resource = dict(resource)
        self.errors = 0

    def emit(self, spans: Sequence[SpanDesc]) -> None:
        if not spans:
            return
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            line = json.dumps(otlp_json(spans, self.resource), separators=(",", ":"))
            with open(self.path, "a") as f:
                f.write(line + "\n")
        except OSError as e:
            self.errors += 1
            log.warning("trace file %s: %s", self.path, e)

    def shutdown(self, timeout_s: float) -> None:
        return None


def resource_attributes(
    env: Mapping[str, str], hostname: str, pid: int
) -> dict[str, str | int | float | bool]:
    """The agent's resource, built by the SDK's ``Resource.create()``: railhop's defaults
    (:func:`railhop.tracing.otlp.default_resource_attributes`, from ``env``), then what the
    SDK's environment detector reads from the process environment as the specification says
    (``OTEL_RESOURCE_ATTRIBUTES``, percent-decoded; ``OTEL_SERVICE_NAME`` above it), plus the
    SDK's ``telemetry.sdk.*``. A variable always beats a default."""
    from opentelemetry.sdk.resources import OTELResourceDetector, Resource

    from_env = OTELResourceDetector().detect().attributes
    attrs = {**default_resource_attributes(env, hostname, pid), **from_env}
    res = Resource.create(attrs)
    return {k: v for k, v in res.attributes.items() if isinstance(v, str | int | float | bool)}


def sampler_from_env() -> Any:
    """The sampler ``OTEL_TRACES_SAMPLER`` / ``OTEL_TRACES_SAMPLER_ARG`` name (the SDK parses
    them; default ``parentbased_always_on``). TracingError for an unknown name."""
    import warnings

    from opentelemetry.sdk.trace import TracerProvider

    name = os.environ.get("OTEL_TRACES_SAMPLER", "").strip()
    with warnings.catch_warnings(record=True):
        sampler = TracerProvider(shutdown_on_exit=False).sampler
    known = {
        "always_on",
        "always_off",
        "traceidratio",
        "parentbased_always_on",
        "parentbased_always_off",
        "parentbased_traceidratio",
    }
    if name and name.lower() not in known:
        raise TracingError(
            f"OTEL_TRACES_SAMPLER={name!r}: supported are {', '.join(sorted(known))}"
        )
    return sampler


class OtelSink:
    """Feeds span descriptions to SDK span processors (``BatchSpanProcessor`` per exporter).

    Spans are built here, not by an SDK tracer, so the sampler is applied here: each span is
    kept when ``sampler`` samples its trace as a root (``parent_context=None``): with the
    standard samplers every span of one failover gets the same decision (trace-id ratio is
    a function of the trace id)."""

    def __init__(
        self,
        processors: Sequence[Any],
        resource_attrs: Mapping[str, object],
        sampler: Any = None,
    ) -> None:
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.util.instrumentation import InstrumentationScope

        from railhop import __version__

        self.processors = list(processors)
        self.resource = Resource(dict(resource_attrs))  # type: ignore[arg-type]
        self.scope = InstrumentationScope(SCOPE_NAME, __version__)
        self.sampler = sampler
        self.errors = 0
        self.dropped_by_sampler = 0

    def _sampled(self, s: SpanDesc) -> bool:
        if self.sampler is None:
            return True
        from opentelemetry.sdk.trace.sampling import Decision as SamplingDecision

        r = self.sampler.should_sample(None, s.trace_id, s.name)
        return bool(r.decision == SamplingDecision.RECORD_AND_SAMPLE)

    def _readable(self, s: SpanDesc) -> Any:
        from opentelemetry.sdk.trace import Event, ReadableSpan
        from opentelemetry.trace import SpanContext, Status, StatusCode, TraceFlags

        flags = TraceFlags(TraceFlags.SAMPLED)
        ctx = SpanContext(s.trace_id, s.span_id, is_remote=False, trace_flags=flags)
        parent = (
            SpanContext(s.trace_id, s.parent_id, is_remote=False, trace_flags=flags)
            if s.parent_id is not None
            else None
        )
        code = {"unset": StatusCode.UNSET, "ok": StatusCode.OK, "error": StatusCode.ERROR}
        return ReadableSpan(
            name=s.name,
            context=ctx,
            parent=parent,
            resource=self.resource,
            attributes=dict(s.attributes),
            events=[Event(e.name, dict(e.attributes), e.time_ns) for e in s.events],
            status=Status(code[s.status], s.status_message or None),
            start_time=s.start_ns,
            end_time=s.end_ns,
            instrumentation_scope=self.scope,
        )

    def emit(self, spans: Sequence[SpanDesc]) -> None:
        for s in spans:
            try:
                if not self._sampled(s):
                    self.dropped_by_sampler += 1
                    continue
                rs = self._readable(s)
            except Exception as e:  # a bad span must not reach the loop
                self.errors += 1
                log.warning("span %s not exported: %s", s.name, e)
                continue
            for p in self.processors:
                try:
                    p.on_end(rs)  # BatchSpanProcessor: enqueue (drops when full), no I/O
                except Exception as e:
                    self.errors += 1
                    log.warning("span processor: %s", e)

    def shutdown(self, timeout_s: float) -> None:
        """force_flush + shutdown of every processor in a daemon thread, waited for at most
        ``timeout_s`` (an unreachable collector cannot hold the agent up)."""

        def body() -> None:
            for p in self.processors:
                try:
                    p.force_flush(int(timeout_s * 1000))
                    p.shutdown()
                except Exception as e:
                    log.warning("span processor shutdown: %s", e)

        t = threading.Thread(target=body, name="railhop-trace-shutdown", daemon=True)
        t.start()
        t.join(timeout_s)
        if t.is_alive():
            log.warning("trace export did not finish within %.1f s; giving up", timeout_s)


def _otlp_exporter(env: Mapping[str, str]) -> Any:
    proto = (
        env.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
        or env.get("OTEL_EXPORTER_OTLP_PROTOCOL")
        or "http/protobuf"
    ).strip()
    if proto == "grpc":
        try:
            from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import (
                OTLPSpanExporter as GrpcExporter,
            )
        except ImportError as e:
            raise TracingError(
                "OTEL_EXPORTER_OTLP_PROTOCOL=grpc needs the gRPC exporter: install "
                f"railhop[grpc] (opentelemetry-exporter-otlp-proto-grpc); {e}"
            ) from e
        return GrpcExporter()
    if proto == "http/protobuf":
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import (
            OTLPSpanExporter as HttpExporter,
        )

        return HttpExporter()
    raise TracingError(
        f"OTEL_EXPORTER_OTLP_PROTOCOL={proto!r}: supported are 'grpc' and 'http/protobuf'"
    )


def exporter_names(env: Mapping[str, str]) -> list[str]:
    """``OTEL_TRACES_EXPORTER`` (default ``otlp``) as a list; ``none`` alone means no export."""
    names = [n.strip() for n in env.get("OTEL_TRACES_EXPORTER", "otlp").split(",") if n.strip()]
    if names == ["none"] or not names:
        return []
    bad = [n for n in names if n not in ("otlp", "console")]
    if bad:
        raise TracingError(f"OTEL_TRACES_EXPORTER: unsupported {bad} (otlp, console, none)")
    return names


def _otlp_endpoint(env: Mapping[str, str]) -> str:
    return (
        env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
        or env.get("OTEL_EXPORTER_OTLP_ENDPOINT")
        or "http://localhost:4318 (the SDK's default)"
    ).strip()


def sinks_from_env(
    env: Mapping[str, str] | None = None,
    *,
    trace_file: Path | str | None = None,
    hostname: str | None = None,
    health: list[ExportHealth] | None = None,
) -> tuple[list[TraceSink], dict[str, str | int | float | bool]]:
    """The sinks the standard variables ask for (plus an OTLP/JSON file when ``trace_file`` is
    given) and the resource attributes (:func:`resource_attributes`); the OTLP sink samples as
    ``OTEL_TRACES_SAMPLER`` says, the file keeps every span. TracingError for a bad
    configuration. Each OTLP
    exporter is wrapped to record its results: one :class:`ExportHealth` per exporter is
    appended to ``health``; the SDK's failure messages are throttled (once, then once a
    minute)."""
    env = os.environ if env is None else env
    resource = resource_attributes(env, hostname or socket.gethostname(), os.getpid())
    sinks: list[TraceSink] = []
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() != "true":
        processors: list[Any] = []
        for name in exporter_names(env):
            from opentelemetry.sdk.trace.export import BatchSpanProcessor

            if name == "console":
                from opentelemetry.sdk.trace.export import ConsoleSpanExporter

                processors.append(BatchSpanProcessor(ConsoleSpanExporter()))
            else:
                throttle_sdk_logs()
                h = ExportHealth("otlp", _otlp_endpoint(env))
                if health is not None:
                    health.append(h)
                tracked: Any = TrackedExporter(_otlp_exporter(env), h)  # duck-types SpanExporter
                processors.append(BatchSpanProcessor(tracked))
        if processors:
            sinks.append(OtelSink(processors, resource, sampler_from_env()))
    if trace_file is not None:
        sinks.append(OtlpJsonFileSink(trace_file, resource))
    return sinks, resource


class FailoverTracer:
    """The assembler plus its sinks: what the daemon holds. Every call is non-blocking and
    never raises (a tracing bug is logged, counted, and the agent goes on)."""

    def __init__(
        self,
        sinks: Iterable[TraceSink],
        *,
        offset_ns: int | None = None,
        host: str | None = None,
        config: AssemblerConfig | None = None,
        observers: Iterable[Callable[[Sequence[SpanDesc]], None]] = (),
        enrich: Callable[[Sequence[SpanDesc]], Sequence[SpanDesc]] | None = None,
    ) -> None:
        self.sinks = list(sinks)
        self.assembler = FailoverAssembler(
            epoch_offset_ns() if offset_ns is None else offset_ns,
            host=socket.gethostname() if host is None else host,
            config=config,
        )
        self.observers = list(observers)
        # adds attributes to finished spans before observers and sinks see them (the job of
        # the process: railhop.jobs.JobCache.enrich)
        self.enrich = enrich
        self.errors = 0
        self.spans = 0

    def _do(self, fn: Callable[[], list[SpanDesc]]) -> None:
        try:
            spans = fn()
        except Exception:
            self.errors += 1
            log.exception("failover tracing failed (ignored)")
            return
        if not spans:
            return
        if self.enrich is not None:
            try:
                spans = list(self.enrich(spans))
            except Exception:
                self.errors += 1
                log.exception("span enrichment failed (spans kept as they were)")
        self.spans += len(spans)
        for obs in self.observers:
            try:
                obs(spans)
            except Exception:
                self.errors += 1
                log.exception("span observer failed (ignored)")
        for sink in self.sinks:
            try:
                sink.emit(spans)
            except Exception:
                self.errors += 1
                log.exception("trace sink failed (ignored)")

    def signal(self, sig: Signal) -> None:
        self._do(lambda: self.assembler.signal(sig))

    def transition(self, tr: StateChange) -> None:
        self._do(lambda: self.assembler.transition(tr))

    def decision(self, d: Decision) -> None:
        self._do(lambda: self.assembler.decision(d))

    def lane_event(self, ev: LaneEvent, peer_pid: int, handled_ns: int) -> None:
        self._do(lambda: self.assembler.lane_event(ev, peer_pid, handled_ns))

    def tick(self, now_ns: int) -> None:
        self._do(lambda: self.assembler.tick(now_ns))

    def shutdown(self, now_ns: int, timeout_s: float) -> None:
        """Ends open failovers, then flushes every sink within ``timeout_s`` in all."""
        self._do(lambda: self.assembler.close_all(now_ns))
        t0 = time.monotonic()
        for sink in self.sinks:
            left = max(0.05, timeout_s - (time.monotonic() - t0))
            try:
                sink.shutdown(left)
            except Exception:
                log.exception("trace sink shutdown failed (ignored)")
