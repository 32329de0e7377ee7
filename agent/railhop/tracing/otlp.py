"""The agent's resource attributes (from the standard environment) and the OTLP/JSON encoding
of span descriptions (pure), with a writer and a reader for files.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from railhop.tracing.spans import SCOPE_NAME, SERVICE_NAME_DEFAULT, SpanDesc

# ---------------------------------------------------------------------------------------------
# resource attributes (pure)

# downward-API / common env names -> semantic-convention keys (first set one wins)
K8S_ENV: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("k8s.node.name", ("K8S_NODE_NAME", "NODE_NAME")),
    ("k8s.pod.name", ("K8S_POD_NAME", "POD_NAME")),
    ("k8s.pod.uid", ("K8S_POD_UID", "POD_UID")),
    ("k8s.namespace.name", ("K8S_NAMESPACE_NAME", "POD_NAMESPACE")),
    ("k8s.container.name", ("K8S_CONTAINER_NAME", "CONTAINER_NAME")),
)


def default_resource_attributes(
    env: Mapping[str, str], hostname: str, pid: int
) -> dict[str, str | int]:
    """railhop's own defaults for the resource: ``service.*``, ``host.name``, ``process.pid``
    and ``k8s.*`` from the downward-API variables. The standard variables
    (``OTEL_RESOURCE_ATTRIBUTES``, ``OTEL_SERVICE_NAME``) override these; the SDK applies them
    (``railhop.tracing.export.resource_attributes``)."""
    from railhop import __version__

    attrs: dict[str, str | int] = {
        "service.name": SERVICE_NAME_DEFAULT,
        "service.version": __version__,
        "host.name": hostname,
        "process.pid": pid,
    }
    for key, names in K8S_ENV:
        for n in names:
            if env.get(n):
                attrs[key] = env[n]
                break
    return attrs


# ---------------------------------------------------------------------------------------------
# OTLP/JSON (pure encoding; https://opentelemetry.io/docs/specs/otlp/#json-protobuf-encoding)

_STATUS = {"unset": 0, "ok": 1, "error": 2}


def _any_value(v: object) -> dict[str, Any]:
    if isinstance(v, bool):
        return {"boolValue": v}
    if isinstance(v, int):
        return {"intValue": str(v)}
    if isinstance(v, float):
        return {"doubleValue": v}
    if isinstance(v, tuple | list):
        return {"arrayValue": {"values": [_any_value(x) for x in v]}}
    return {"stringValue": str(v)}


def _kv(attrs: Mapping[str, object]) -> list[dict[str, Any]]:
    return [{"key": k, "value": _any_value(v)} for k, v in attrs.items()]


def otlp_json(
    spans: Sequence[SpanDesc], resource: Mapping[str, object] | None = None
) -> dict[str, Any]:
    """An ``ExportTraceServiceRequest`` as OTLP/JSON (ids hex, enums as numbers, 64-bit
    integers as strings)."""
    out_spans = []
    for s in spans:
        d: dict[str, Any] = {
            "traceId": s.trace_id_hex,
            "spanId": s.span_id_hex,
            "name": s.name,
            "kind": 1,  # SPAN_KIND_INTERNAL
            "startTimeUnixNano": str(s.start_ns),
            "endTimeUnixNano": str(s.end_ns),
            "attributes": _kv(s.attributes),
            "events": [
                {"timeUnixNano": str(e.time_ns), "name": e.name, "attributes": _kv(e.attributes)}
                for e in s.events
            ],
            "status": {"code": _STATUS[s.status]}
            | ({"message": s.status_message} if s.status_message else {}),
        }
        if s.parent_id is not None:
            d["parentSpanId"] = f"{s.parent_id:016x}"
        out_spans.append(d)
    from railhop import __version__

    return {
        "resourceSpans": [
            {
                "resource": {"attributes": _kv(resource or {})},
                "scopeSpans": [
                    {"scope": {"name": SCOPE_NAME, "version": __version__}, "spans": out_spans}
                ],
            }
        ]
    }


def write_otlp_json(
    spans: Sequence[SpanDesc], path: Path | str, resource: Mapping[str, object] | None = None
) -> None:
    """Writes one OTLP/JSON document (temp file + rename)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(otlp_json(spans, resource), f, indent=1)
            f.write("\n")
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def read_otlp_json(path: Path | str) -> list[dict[str, Any]]:
    """The spans (OTLP/JSON dicts) of a file written by :func:`write_otlp_json` or
    :class:`OtlpJsonFileSink` (one document, or one per line)."""
    text = Path(path).read_text()
    docs: list[dict[str, Any]] = []
    try:
        docs = [json.loads(text)]
    except json.JSONDecodeError:
        docs = [json.loads(line) for line in text.splitlines() if line.strip()]
    return [
        span
        for doc in docs
        for rs in doc.get("resourceSpans", [])
        for ss in rs.get("scopeSpans", [])
        for span in ss.get("spans", [])
    ]
