"""End to end: the agent, driven by real lane events from the plugin's C sender (plugin/src/ctl.c)
on its socket, exports the trace of a failover with the standard OTLP exporter to a real OTLP
receiver in another process (OTLP/HTTP: http.server; OTLP/gRPC: grpc), which decodes the payloads
with the official proto package. The test checks the span tree, the attributes and the timings
(against the sender's own timestamps), and scrapes the Prometheus endpoint during the failover.

This file is also the receiver: ``python test_tracing_otlp.py --serve http|grpc PORTFILE OUT``
appends one JSON line per received span to OUT (tests/privileged/test_tracing_fabric.py uses it).
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
DGX = REPO / "tests" / "fixtures" / "sys" / "dgx-h100"
POLICY = REPO / "policies" / "rail-optimized-8nic.yaml"
ME = Path(__file__).resolve()


# ---------------------------------------------------------------------------------------------
# the receiver (runs in a child process)


def _value(v: Any) -> Any:
    kind = v.WhichOneof("value")
    if kind == "array_value":
        return [_value(x) for x in v.array_value.values]
    if kind == "int_value":
        return int(v.int_value)
    return getattr(v, kind) if kind else None


def _decode(body: bytes) -> list[dict[str, Any]]:
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
        ExportTraceServiceRequest,
    )

    req = ExportTraceServiceRequest()
    req.ParseFromString(body)
    return _spans(req)


def _spans(req: Any) -> list[dict[str, Any]]:
    out = []
    for rs in req.resource_spans:
        res = {kv.key: _value(kv.value) for kv in rs.resource.attributes}
        for ss in rs.scope_spans:
            for s in ss.spans:
                out.append(
                    {
                        "trace_id": s.trace_id.hex(),
                        "span_id": s.span_id.hex(),
                        "parent_id": s.parent_span_id.hex() or None,
                        "name": s.name,
                        "start": s.start_time_unix_nano,
                        "end": s.end_time_unix_nano,
                        "attributes": {kv.key: _value(kv.value) for kv in s.attributes},
                        "events": [{"name": e.name, "t": e.time_unix_nano} for e in s.events],
                        "status": s.status.code,
                        "scope": ss.scope.name,
                        "resource": res,
                    }
                )
    return out


def serve(proto: str, port_file: Path, out: Path) -> None:
    def record(spans: list[dict[str, Any]]) -> None:
        with open(out, "a") as f:
            for s in spans:
                f.write(json.dumps(s) + "\n")

    if proto == "grpc":
        from concurrent import futures

        import grpc
        from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc

        class Servicer(trace_service_pb2_grpc.TraceServiceServicer):
            def Export(self, request: Any, context: Any) -> Any:
                record(_spans(request))
                return trace_service_pb2.ExportTraceServiceResponse()

        server = grpc.server(futures.ThreadPoolExecutor(2))
        trace_service_pb2_grpc.add_TraceServiceServicer_to_server(Servicer(), server)  # type: ignore[no-untyped-call]
        port = server.add_insecure_port("127.0.0.1:0")
        server.start()
        port_file.write_text(str(port))
        server.wait_for_termination()
        return

    import gzip
    from http.server import BaseHTTPRequestHandler, HTTPServer

    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
        ExportTraceServiceResponse,
    )

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
            if self.headers.get("Content-Encoding") == "gzip":
                body = gzip.decompress(body)
            if self.path != "/v1/traces":
                self.send_response(404)
                self.end_headers()
                return
            record(_decode(body))
            payload = ExportTraceServiceResponse().SerializeToString()
            self.send_response(200)
            self.send_header("Content-Type", "application/x-protobuf")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        def log_message(self, format: str, *args: Any) -> None:
            return

    httpd = HTTPServer(("127.0.0.1", 0), Handler)
    port_file.write_text(str(httpd.server_address[1]))
    httpd.serve_forever()


class Receiver:
    """The receiver child process: start(), endpoint, spans()."""

    def __init__(self, proto: str, tmp: Path, popen: Callable[..., subprocess.Popen[Any]]) -> None:
        self.proto = proto
        self.port_file = tmp / f"otlp-{proto}.port"
        self.out = tmp / f"otlp-{proto}.jsonl"
        self.port_file.unlink(missing_ok=True)
        self.out.touch()
        self.proc = popen(
            [sys.executable, str(ME), "--serve", proto, str(self.port_file), str(self.out)]
        )
        deadline = time.monotonic() + 30
        while not self.port_file.exists() or not self.port_file.read_text():
            assert self.proc.poll() is None, "OTLP receiver died"
            assert time.monotonic() < deadline, "OTLP receiver did not start"
            time.sleep(0.02)
        self.port = int(self.port_file.read_text())

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def spans(self) -> list[dict[str, Any]]:
        return [json.loads(line) for line in self.out.read_text().splitlines() if line.strip()]

    def stop(self) -> None:
        self.proc.kill()
        self.proc.wait(10)


# ---------------------------------------------------------------------------------------------
# the C sender: rh_ctl_send_event() of the plugin, driven line by line from stdin

SENDER_C = r"""
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include "ctl.h"

static uint64_t start_ns[64];

int main(int argc, char **argv)
{
    struct rh_ctl *ctl;
    char line[256];

    if (argc != 2 || rh_ctl_open(argv[1], NULL, &ctl) != 0)
        return 2;
    setvbuf(stdout, NULL, _IOLBF, 0);
    /* each line: type nic remote_nic conn lane epoch error  (remote "-" = none) */
    while (fgets(line, sizeof(line), stdin)) {
        unsigned type, conn, lane, epoch;
        int err, rc = -1;
        char nic[16], rnic[16];
        struct rh_lane_event ev;

        if (sscanf(line, "%u %15s %15s %u %u %u %d", &type, nic, rnic, &conn, &lane, &epoch,
               &err) != 7 || conn >= 64)
            return 3;
        rh_lane_event_init(&ev, (uint16_t)type);
        snprintf(ev.nic, sizeof(ev.nic), "%s", nic);
        if (strcmp(rnic, "-") != 0)
            snprintf(ev.remote_nic, sizeof(ev.remote_nic), "%s", rnic);
        ev.conn_id = conn;
        ev.lane = lane;
        ev.epoch = epoch;
        ev.error = err;
        if (type == RH_EV_FAILOVER_START)
            start_ns[conn] = ev.t_ns;
        if (type == RH_EV_FAILOVER_END && start_ns[conn])
            ev.duration_ns = ev.t_ns - start_ns[conn];
        for (int i = 0; i < 200 && rc != 0; i++) {
            rc = rh_ctl_send_event(ctl, &ev);
            if (rc != 0)
                usleep(10000);
        }
        printf("{\"rc\": %d, \"pid\": %d, \"t_ns\": %llu, \"duration_ns\": %llu}\n", rc,
               (int)getpid(), (unsigned long long)ev.t_ns,
               (unsigned long long)ev.duration_ns);
    }
    rh_ctl_close(ctl);
    return 0;
}
"""


def build_sender(out_dir: Path) -> Path:
    from conftest import require  # not at the top: this file also runs as the receiver script

    cc = shutil.which("cc") or shutil.which("gcc")
    require(cc is not None, "no C compiler (make setup installs gcc)")
    src = out_dir / "sender.c"
    src.write_text(SENDER_C)
    exe = out_dir / "rh-sender"
    subprocess.run(
        [
            cc,
            "-std=gnu11",
            "-O1",
            "-Wall",
            "-Wextra",
            "-Werror",
            f"-I{REPO / 'plugin/include'}",
            f"-I{REPO / 'plugin/src'}",
            str(REPO / "plugin/src/ctl.c"),
            str(src),
            "-o",
            str(exe),
            "-pthread",
        ],
        check=True,
        timeout=120,
    )
    return exe


class Sender:
    """The C sender as a child process; ``send()`` returns what it reported for the event."""

    def __init__(self, exe: Path, run_dir: Path) -> None:
        self.proc = subprocess.Popen(
            [str(exe), str(run_dir)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )

    def send(
        self,
        etype: int,
        nic: str,
        conn: int,
        *,
        rnic: str = "-",
        lane: int = 0,
        epoch: int = 0,
        error: int = 0,
    ) -> dict[str, int]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(f"{etype} {nic} {rnic} {conn} {lane} {epoch} {error}\n")
        self.proc.stdin.flush()
        res: dict[str, int] = json.loads(self.proc.stdout.readline())
        assert res["rc"] == 0, res
        return res

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        self.proc.wait(10)


def wait_for(cond: Callable[[], object], timeout: float = 20.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, f"{what} not met within {timeout} s"
        time.sleep(0.02)


async def until(cond: Callable[[], object], timeout: float = 20.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, f"{what} not met within {timeout} s"
        await asyncio.sleep(0.02)


def scrape(port: int) -> dict[str, float]:
    """The endpoint's samples as {'name{labels}': value} (labels sorted as exposed)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        text = r.read().decode()
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            key, _, val = line.rpartition(" ")
            out[key] = float(val)
    return out


# ---------------------------------------------------------------------------------------------
# the test

FAILED, BACKUP1, BACKUP2 = "ibp76s0", "ibp25s0", "ibp59s0"
LANE_UP, FO_START, FO_END, FAILBACK_EV = 1, 5, 6, 7


@pytest.fixture
def procs() -> Iterator[list[subprocess.Popen[Any]]]:
    started: list[subprocess.Popen[Any]] = []
    yield started
    for p in started:
        if p.poll() is None:
            p.kill()
            p.wait(10)


@pytest.mark.parametrize("proto", ["http/protobuf", "grpc"])
def test_failover_trace_reaches_an_otlp_receiver(
    proto: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    procs: list[subprocess.Popen[Any]],
) -> None:
    from railhop import daemon, tracing
    from railhop.sources import events as sev

    def popen(argv: list[str]) -> subprocess.Popen[Any]:
        p = subprocess.Popen(argv, env={**os.environ, "PYTHONPATH": str(REPO / "agent")})
        procs.append(p)
        return p

    rx = Receiver("grpc" if proto == "grpc" else "http", tmp_path, popen)
    sender_exe = build_sender(tmp_path)
    # only the standard variables configure the export
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", rx.endpoint)
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", proto)
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "otlp")
    monkeypatch.setenv("OTEL_SERVICE_NAME", "railhop-test")
    monkeypatch.setenv(
        "OTEL_RESOURCE_ATTRIBUTES", "k8s.cluster.name=ci,deployment.environment=test"
    )
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "100")
    monkeypatch.setenv("NODE_NAME", "gpu-node-7")
    monkeypatch.setenv("POD_NAME", "railhop-agent-x1")

    policy = tmp_path / "policy.yaml"
    policy.write_text(POLICY.read_text())
    run_dir = tmp_path / "run"
    trace_file = tmp_path / "traces.jsonl"

    class Fake:
        name = "fake"
        emit: Callable[[Any], None] | None = None

        async def start(self, emit: Callable[[Any], None]) -> list[Any]:
            Fake.emit = emit
            return []

        async def stop(self) -> None:
            return None

    cfg = daemon.AgentConfig(
        policy_path=policy,
        run_dir=run_dir,
        sys_root=DGX,
        heartbeat_ms=50,
        traces=True,
        trace_file=trace_file,
        metrics_port=0,
        metrics_addr="127.0.0.1",
    )
    agent = daemon.Agent(cfg, source_factory=lambda c, t, p: [Fake()])

    async def body() -> dict[str, Any]:
        task = asyncio.create_task(agent.run())
        await until(lambda: Fake.emit is not None and agent.metrics_server is not None, what="up")
        assert agent.metrics_server is not None and Fake.emit is not None
        port = agent.metrics_server.port
        before = scrape(port)
        assert before[f'railhop_nic_state{{device="{FAILED}",state="up"}}'] == 1

        # the plugin's lanes exist before the fault
        sender = await asyncio.to_thread(Sender, sender_exe, run_dir)
        sent: dict[str, dict[str, int]] = {}
        for conn in (1, 2):
            sent[f"up{conn}"] = await asyncio.to_thread(
                sender.send, LANE_UP, FAILED, conn, rnic="peer2", lane=0
            )
        await until(lambda: agent.stats.lane_events >= 2, what="lanes seen")

        # carrier loss on FAILED, seen by a source
        t_fault = time.monotonic_ns()
        Fake.emit(sev.CarrierDown(ts_ns=t_fault, source="netlink", hook="netlink", ifname=FAILED))
        # the plugin's connections leave it: start, new lanes on the backups, resumed
        for conn, backup in ((1, BACKUP1), (2, BACKUP2)):
            sent[f"start{conn}"] = await asyncio.to_thread(
                sender.send, FO_START, FAILED, conn, rnic="peer2", lane=0, error=104
            )
            sent[f"lane{conn}"] = await asyncio.to_thread(
                sender.send, LANE_UP, backup, conn, rnic="peer2", lane=2
            )
        await asyncio.sleep(0.02)  # the migration takes a while (the spans must show it)
        for conn in (1, 2):
            sent[f"end{conn}"] = await asyncio.to_thread(
                sender.send, FO_END, FAILED, conn, rnic="peer2", epoch=1
            )
        await until(lambda: agent.stats.lane_events >= 8, what="events in")
        await until(
            lambda: (
                scrape(port).get(f'railhop_failover_completion_seconds_count{{device="{FAILED}"}}')
                == 2
            ),
            what="completions",
        )
        during = scrape(port)

        # the link comes back; after the hold-off the NIC is UP; the connections fail back
        Fake.emit(sev.CarrierUp(ts_ns=time.monotonic_ns(), source="netlink", ifname=FAILED))
        await until(
            lambda: agent.model is not None and agent.model.nics[FAILED].state.value == "up",
            what="NIC up again",
        )
        for conn in (1, 2):
            sent[f"back{conn}"] = await asyncio.to_thread(
                sender.send, FAILBACK_EV, FAILED, conn, rnic="peer2", lane=4
            )
        await until(lambda: any(s["name"] == tracing.FAILOVER for s in rx.spans()), what="root")
        after = scrape(port)
        await asyncio.to_thread(sender.close)
        agent.request_stop()
        assert await asyncio.wait_for(task, 15) == 0
        assert agent.tracer is not None
        return {
            "sent": sent,
            "t_fault": t_fault,
            "before": before,
            "during": during,
            "after": after,
            "offset": agent.tracer.assembler.offset_ns,
        }

    r = asyncio.run(asyncio.wait_for(body(), 90))
    sent, off = r["sent"], r["offset"]

    # ---- metrics during the failover
    d = r["during"]
    assert d[f'railhop_nic_state{{device="{FAILED}",state="down"}}'] == 1
    assert d[f'railhop_nic_up{{device="{FAILED}"}}'] == 0
    assert d[f'railhop_failovers_total{{cause="carrier_down",device="{FAILED}"}}'] == 1
    assert d['railhop_detection_latency_seconds_count{source="netlink"}'] == 1
    assert 0 <= d['railhop_detection_latency_seconds_sum{source="netlink"}'] < 5
    assert d[f'railhop_lanes{{device="{BACKUP1}"}}'] == 1
    assert d[f'railhop_lanes{{device="{BACKUP2}"}}'] == 1
    assert d[f'railhop_lanes{{device="{FAILED}"}}'] == 2  # no LANE_DOWN sent for the dead lanes
    assert d['railhop_lane_events_total{type="failover_start"}'] == 2
    assert d[f'railhop_failover_completion_seconds_count{{device="{FAILED}"}}'] == 2
    assert d[f'railhop_failover_completion_seconds_sum{{device="{FAILED}"}}'] >= 2 * 0.02
    assert d["railhop_control_events_total"] >= 8
    assert d["railhop_trace_spans_total"] == 4  # detection, decision, 2 migrations
    assert d["railhop_trace_errors_total"] == 0
    a = r["after"]
    assert a[f'railhop_nic_state{{device="{FAILED}",state="up"}}'] == 1
    assert a[f'railhop_failbacks_total{{device="{FAILED}"}}'] == 1

    # ---- the trace, as the receiver decoded it
    spans = [s for s in rx.spans() if s["attributes"].get("network.interface.name") == FAILED]
    rx.stop()
    root = next(s for s in spans if s["name"] == tracing.FAILOVER)
    tree = [s for s in spans if s["trace_id"] == root["trace_id"]]
    names = sorted(s["name"] for s in tree)
    assert names == sorted(
        [
            tracing.FAILOVER,
            tracing.DETECTION,
            tracing.DECISION,
            tracing.MIGRATION,
            tracing.MIGRATION,
            tracing.FAILBACK,
        ]
    )
    assert root["parent_id"] is None
    assert all(s["parent_id"] == root["span_id"] for s in tree if s is not root)
    res = root["resource"]
    assert res["service.name"] == "railhop-test"
    assert res["k8s.node.name"] == "gpu-node-7" and res["k8s.pod.name"] == "railhop-agent-x1"
    assert res["k8s.cluster.name"] == "ci" and res["host.name"]
    assert root["scope"] == "railhop"
    ra = root["attributes"]
    assert ra["railhop.failover.outcome"] == "failed_back"
    assert ra["railhop.failover.connections"] == 2
    assert ra["error.type"] == "carrier_down" and ra["hw.state"] == "ok"
    assert ra["host.name"] == res["host.name"]

    # timings: the events' own clocks (+ one offset), not the agent's processing times
    t_fault = r["t_fault"]
    assert root["start"] == t_fault + off
    det = next(s for s in tree if s["name"] == tracing.DETECTION)
    assert det["start"] == t_fault + off == det["end"]
    assert det["attributes"]["railhop.detection.source"] == "netlink"
    assert det["attributes"]["railhop.detection.signal"] == "carrier_down"
    assert 0 <= det["attributes"]["railhop.detection.latency_ms"] < 5000
    dec = next(s for s in tree if s["name"] == tracing.DECISION)
    assert dec["attributes"]["railhop.policy.name"]
    chosen = dec["attributes"]["railhop.decision.pairs"]
    assert chosen and all(not p.startswith(FAILED) for p in chosen)
    assert len(dec["attributes"]["railhop.decision.weights"]) == len(chosen)
    assert abs(sum(dec["attributes"]["railhop.decision.weights"]) - 1.0) < 1e-3
    for conn, backup in ((1, BACKUP1), (2, BACKUP2)):
        mig = next(
            s
            for s in tree
            if s["name"] == tracing.MIGRATION
            and s["attributes"]["railhop.conn.id"] == f"{conn:#018x}"
        )
        start, end = sent[f"start{conn}"], sent[f"end{conn}"]
        assert mig["start"] == start["t_ns"] + off
        assert mig["end"] == end["t_ns"] + off
        assert end["duration_ns"] == end["t_ns"] - start["t_ns"] >= 20_000_000
        ma = mig["attributes"]
        assert ma["error.type"] == "ECONNRESET"
        assert ma["railhop.migration.new_lanes"] == [f"{backup}->peer2"]
        assert ma["railhop.process.pid"] == start["pid"] == ma["process.pid"]
        assert ma["railhop.migration.outcome"] == "resumed"
    fb = next(s for s in tree if s["name"] == tracing.FAILBACK)
    assert fb["end"] == max(sent["back1"]["t_ns"], sent["back2"]["t_ns"]) + off == root["end"]
    assert fb["attributes"]["railhop.failback.connections"] == 2
    assert all(root["start"] <= s["start"] <= s["end"] <= root["end"] for s in tree)

    # the same trace went to the OTLP/JSON file
    filed = tracing.read_otlp_json(trace_file)
    assert {s["spanId"] for s in filed if s["traceId"] == root["trace_id"]} == {
        s["span_id"] for s in tree
    }


def test_unreachable_collector_never_blocks_the_agent(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Collector down (connection refused) and a black hole that accepts and never answers:
    the loop keeps its pace and shutdown stays within its budget."""
    import socket

    from railhop import daemon
    from railhop.sources import events as sev

    hole = socket.socket()
    hole.bind(("127.0.0.1", 0))
    hole.listen(16)  # accepts (kernel backlog) and never answers
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", f"http://127.0.0.1:{hole.getsockname()[1]}")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TIMEOUT", "30000")
    monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "10")
    emitted: list[Callable[[Any], None]] = []

    class Fake:
        name = "fake"

        async def start(self, emit: Callable[[Any], None]) -> list[Any]:
            emitted.append(emit)
            return []

        async def stop(self) -> None:
            return None

    cfg = daemon.AgentConfig(
        run_dir=tmp_path / "run", sys_root=DGX, sources=(), traces=True, shutdown_timeout_s=2.0
    )
    agent = daemon.Agent(cfg, source_factory=lambda c, t, p: [Fake()])

    def handled(n: int) -> Callable[[], bool]:
        return lambda: agent.stats.source_events >= n

    async def body() -> float:
        task = asyncio.create_task(agent.run())
        await until(lambda: bool(emitted), what="agent up")
        for k in range(20):  # 20 failovers, each exported (and stuck) at once
            nic = "ibp76s0" if k % 2 else "ibp93s0"
            t = time.monotonic_ns()
            emitted[0](sev.CarrierDown(ts_ns=t, source="netlink", ifname=nic))
            t0 = time.monotonic()
            await until(handled(2 * k + 1), 5, "handled")
            assert time.monotonic() - t0 < 2.0
            emitted[0](sev.CarrierUp(ts_ns=t + 1, source="netlink", ifname=nic))
            await until(handled(2 * k + 2), 5, "handled")
        t0 = time.monotonic()
        agent.request_stop()
        assert await asyncio.wait_for(task, 15) == 0
        return time.monotonic() - t0

    took = asyncio.run(asyncio.wait_for(body(), 90))
    hole.close()
    assert took < cfg.shutdown_timeout_s + 1.5
    assert agent.tracer is not None and agent.tracer.errors == 0


if __name__ == "__main__" and len(sys.argv) == 5 and sys.argv[1] == "--serve":
    serve(sys.argv[2], Path(sys.argv[3]), Path(sys.argv[4]))
