"""OpenTelemetry traces of failovers: one trace per failover, assembled from the agent's inputs.

Two layers (deciding is separate from acting):

* :class:`FailoverAssembler` is pure: health signals, NIC state transitions, plans and plugin lane
  events go in (each with its own ``CLOCK_MONOTONIC`` timestamp), finished :class:`SpanDesc` come
  out. No SDK, no clock, no I/O; ids come from an injected random source, wall-clock times from
  one monotonic -> epoch offset fixed at construction (:func:`epoch_offset_ns`).
* Sinks send span descriptions away: :class:`OtelSink` hands them, as SDK ``ReadableSpan``, to a
  ``BatchSpanProcessor`` per exporter chosen by the standard ``OTEL_*`` variables
  (:func:`sinks_from_env`); :class:`OtlpJsonFileSink` appends OTLP/JSON lines to a file;
  :func:`write_otlp_json` writes one OTLP/JSON document. Sinks never raise into the caller and
  their shutdown is bounded.

A failover of NIC ``n`` (see docs/tracing.md for a picture)::

    railhop.failover                 first bad signal .. fail-back done (or escalation, or stop)
    ├── railhop.detection            first bad signal .. NIC declared DOWN (or plugin failover)
    ├── railhop.decision             the plan computed for n (policy, candidates, pairs, weights)
    ├── railhop.migration  (x conns) FAILOVER_START .. FAILOVER_END of one connection: the first
    │   │                            request completed after the move (replay included)
    │   └── railhop.fair_share       FAILOVER_END .. the connection's rate back within 90 % of its
    │                                share of the NICs left (FAIR_SHARE)
    ├── railhop.escalation           no backup pair, or a migration that did not finish in time
    └── railhop.failback             link back / RECOVERING .. NIC UP and every connection back

Child spans are emitted as soon as they end (a backend shows them before the root arrives: ids
are chosen here, not by the SDK); the root when the failover is over.

Modules: ``spans`` (the span description), ``assembler`` (pure), ``otlp`` (resource attributes,
OTLP/JSON files), ``export`` (sinks, ``OTEL_*`` configuration, :class:`FailoverTracer`).
"""

from railhop.tracing.assembler import (
    AssemblerConfig,
    Decision,
    FailoverAssembler,
    Pair,
    Signal,
    StateChange,
)
from railhop.tracing.export import (
    FailoverTracer,
    OtelSink,
    OtlpJsonFileSink,
    TraceSink,
    exporter_names,
    resource_attributes,
    sampler_from_env,
    sinks_from_env,
)
from railhop.tracing.otlp import (
    K8S_ENV,
    default_resource_attributes,
    otlp_json,
    read_otlp_json,
    write_otlp_json,
)
from railhop.tracing.spans import (
    DECISION,
    DETECTION,
    ESCALATION,
    FAILBACK,
    FAILOVER,
    FAIR_SHARE,
    MIGRATION,
    SCOPE_NAME,
    SERVICE_NAME_DEFAULT,
    AttrValue,
    SpanDesc,
    SpanEvent,
    TracingError,
    epoch_offset_ns,
    errno_name,
)

__all__ = [
    "DECISION",
    "DETECTION",
    "ESCALATION",
    "FAILBACK",
    "FAILOVER",
    "FAIR_SHARE",
    "K8S_ENV",
    "MIGRATION",
    "SCOPE_NAME",
    "SERVICE_NAME_DEFAULT",
    "AssemblerConfig",
    "AttrValue",
    "Decision",
    "FailoverAssembler",
    "FailoverTracer",
    "OtelSink",
    "OtlpJsonFileSink",
    "Pair",
    "Signal",
    "SpanDesc",
    "SpanEvent",
    "StateChange",
    "TraceSink",
    "TracingError",
    "default_resource_attributes",
    "epoch_offset_ns",
    "errno_name",
    "exporter_names",
    "otlp_json",
    "read_otlp_json",
    "resource_attributes",
    "sampler_from_env",
    "sinks_from_env",
    "write_otlp_json",
]
