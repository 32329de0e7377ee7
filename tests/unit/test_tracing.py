"""The failover assembler (pure: inputs in, span descriptions out), the OTLP/JSON encoding, the
resource attributes and the sink configuration from the standard OTEL_* variables."""

from __future__ import annotations

import base64
import itertools
import json
import random
from collections.abc import Sequence
from pathlib import Path

import pytest
from google.protobuf import json_format
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from railhop import tracing
from railhop.control import EventFlag, EventType, LaneEvent
from railhop.tracing import (
    DECISION,
    DETECTION,
    ESCALATION,
    FAILBACK,
    FAILOVER,
    MIGRATION,
    Decision,
    FailoverAssembler,
    Pair,
    Signal,
    SpanDesc,
    StateChange,
)
from railhop.tracing.assembler import witness_attrs

OFFSET = 1_700_000_000_000_000_000  # epoch ns at monotonic 0
S = 1_000_000_000
MS = 1_000_000
PID, PEER = 4242, 77


def asm(**kw: object) -> FailoverAssembler:
    counter = itertools.count(1)
    return FailoverAssembler(
        OFFSET,
        host="node7",
        config=tracing.AssemblerConfig(**kw),  # type: ignore[arg-type]
        rand_bits=lambda bits: next(counter),
    )


def lane(t: EventType, nic: str, at: int, conn: int = 1, **kw: object) -> LaneEvent:
    return LaneEvent(t, pid=PID, nic=nic, conn_id=conn, t_ns=at, **kw)  # type: ignore[arg-type]


def by_name(spans: Sequence[SpanDesc], name: str) -> list[SpanDesc]:
    return [s for s in spans if s.name == name]


def one(spans: Sequence[SpanDesc], name: str) -> SpanDesc:
    got = by_name(spans, name)
    assert len(got) == 1, f"{name}: {len(got)} spans"
    return got[0]


def pairs() -> tuple[Pair, ...]:
    return (
        Pair("nic1", 1, weight=0.5, distance="PIX"),
        Pair("nic2", 2, weight=0.5, distance="NODE"),
    )


def carrier_failover(a: FailoverAssembler) -> list[SpanDesc]:
    """nic0 loses carrier at t=100 s; two connections move to nic1/nic2; it comes back."""
    out: list[SpanDesc] = []
    t = 100 * S
    out += a.signal(Signal("nic0", "netlink", "carrier_down", t, t + 3 * MS))
    out += a.transition(StateChange("nic0", "up", "down", "carrier down", t, t + 3 * MS))
    assert by_name(out, DETECTION)  # detection is out at once
    out += a.decision(Decision("nic0", "rail-opt", "migrate", pairs(), t + 3 * MS, t + 4 * MS))
    for conn in (1, 2):
        out += a.lane_event(
            lane(EventType.FAILOVER_START, "nic0", t + 1 * MS, conn, lane=0, error=104), PEER, t
        )
        out += a.lane_event(
            lane(EventType.LANE_UP, f"nic{conn}", t + 8 * MS, conn, remote_nic="peer1"), PEER, t
        )
        out += a.lane_event(
            lane(EventType.FAILOVER_END, "nic0", t + 20 * MS, conn, epoch=2, duration_ns=19 * MS),
            PEER,
            t + 21 * MS,
        )
    assert len(by_name(out, MIGRATION)) == 2 and not by_name(out, FAILOVER)
    out += a.transition(StateChange("nic0", "down", "recovering", "carrier up", 105 * S, 105 * S))
    out += a.transition(StateChange("nic0", "recovering", "up", "recovered", 106 * S, 106 * S))
    assert not by_name(out, FAILOVER)  # connections not back yet
    out += a.lane_event(lane(EventType.FAILBACK, "nic0", 106 * S + 5 * MS, 1), PEER, 0)
    out += a.lane_event(lane(EventType.FAILBACK, "nic0", 106 * S + 7 * MS, 2), PEER, 0)
    return out


def test_carrier_failover_is_one_trace_timed_by_the_events() -> None:
    a = asm()
    spans = carrier_failover(a)
    root = one(spans, FAILOVER)
    assert a.open_failovers == []
    assert {s.trace_id for s in spans} == {root.trace_id}
    assert root.parent_id is None
    assert all(s.parent_id == root.span_id for s in spans if s is not root)
    assert len({s.span_id for s in spans}) == len(spans) == 6
    # times come from the events (monotonic + one offset), not from when they were handled
    assert root.start_ns == OFFSET + 100 * S
    assert root.end_ns == OFFSET + 106 * S + 7 * MS
    det = one(spans, DETECTION)
    assert (det.start_ns, det.end_ns) == (OFFSET + 100 * S, OFFSET + 100 * S)
    assert det.attributes["railhop.detection.source"] == "netlink"
    assert det.attributes["railhop.detection.signal"] == "carrier_down"
    assert det.attributes["railhop.detection.latency_ms"] == pytest.approx(3.0)
    assert det.attributes["network.interface.name"] == "nic0"
    assert det.attributes["hw.state"] == "failed"
    # hw.* comes with hw.id (required by the hardware conventions): the name without a PCI id
    assert det.attributes["hw.id"] == "nic0" == det.attributes["hw.name"]
    assert det.attributes["hw.type"] == "network"
    assert one(spans, FAILOVER).attributes["hw.id"] == "nic0"
    dec = one(spans, DECISION)
    assert dec.attributes["railhop.policy.name"] == "rail-opt"
    assert dec.attributes["railhop.decision.pairs"] == ("nic1->rail1", "nic2->rail2")
    assert dec.attributes["railhop.decision.weights"] == (0.5, 0.5)
    migs = sorted(by_name(spans, MIGRATION), key=lambda s: str(s.attributes["railhop.conn.id"]))
    for conn, m in enumerate(migs, 1):
        assert (m.start_ns, m.end_ns) == (OFFSET + 100 * S + 1 * MS, OFFSET + 100 * S + 20 * MS)
        assert m.attributes["railhop.conn.id"] == f"{conn:#018x}"
        assert m.attributes["process.pid"] == PEER and m.attributes["railhop.process.pid"] == PID
        assert m.attributes["error.type"] == "ECONNRESET"
        assert m.attributes["railhop.conn.epoch"] == 2
        assert m.attributes["railhop.migration.new_lanes"] == (f"nic{conn}->peer1",)
        assert m.attributes["railhop.migration.outcome"] == "resumed"
        assert [e.name for e in m.events] == ["lane up"]
    fb = one(spans, FAILBACK)
    assert (fb.start_ns, fb.end_ns) == (OFFSET + 105 * S, OFFSET + 106 * S + 7 * MS)
    assert fb.attributes["railhop.failback.connections"] == 2
    assert fb.attributes["hw.state"] == "ok"
    assert [e.name for e in fb.events] == [
        "recovering",
        "nic up",
        "connection back",
        "connection back",
    ]
    assert root.attributes["host.name"] == "node7"
    assert root.attributes["railhop.failover.outcome"] == "failed_back"
    assert root.attributes["railhop.failover.cause"] == "carrier_down"
    assert root.attributes["error.type"] == "carrier_down"
    assert root.attributes["railhop.failover.connections"] == 2
    assert root.status == "unset"
    # children end inside the root
    assert all(root.start_ns <= s.start_ns <= s.end_ns <= root.end_ns for s in spans)


def test_soft_signals_make_a_detection_span_from_the_first_one() -> None:
    a = asm()
    out: list[SpanDesc] = []
    for k in range(3):
        ev = lane(EventType.LANE_TIMEOUT, "nic3", 50 * S + k * 100 * MS, 9, error=110)
        out += a.lane_event(ev, PEER, 50 * S + k * 100 * MS + 1 * MS)
    assert out == [] and a.open_failovers == []
    out += a.transition(
        StateChange("nic3", "suspect", "down", "3 strikes: lane timeout", 50 * S + 200 * MS, 0)
    )
    det = one(out, DETECTION)
    assert det.start_ns == OFFSET + 50 * S and det.end_ns == OFFSET + 50 * S + 200 * MS
    assert det.attributes["railhop.detection.signals"] == 3
    assert det.attributes["railhop.detection.source"] == "plugin"
    assert det.attributes["railhop.detection.agent_delay_ms"] == pytest.approx(1.0)
    assert [e.name for e in det.events] == ["lane_timeout"] * 3
    assert "ETIMEDOUT" in str(det.events[0].attributes["detail"])


def test_cause_is_what_took_the_nic_down_and_the_trace_starts_at_the_first_signal() -> None:
    """The plugin saw its lane fail (soft) just before netlink reported the carrier loss (hard);
    the events arrive out of order."""
    a = asm()
    t = 30 * S
    a.signal(Signal("nic1", "netlink", "carrier_down", t + 2 * MS, t + 3 * MS))
    ev = lane(EventType.LANE_ERROR, "nic1", t, 4, error=100)
    a.lane_event(ev, PEER, t + 4 * MS)
    out = a.transition(StateChange("nic1", "up", "down", "carrier down", t + 2 * MS, t + 5 * MS))
    det = one(out, DETECTION)
    assert det.attributes["railhop.detection.signal"] == "carrier_down"
    assert det.attributes["railhop.detection.source"] == "netlink"
    assert det.attributes["railhop.detection.first_signal"] == "lane_error"
    assert det.attributes["railhop.detection.first_source"] == "plugin"
    assert det.start_ns == OFFSET + t and det.end_ns == OFFSET + t + 2 * MS
    assert det.attributes["railhop.detection.latency_ms"] == pytest.approx(5.0)
    assert [e.name for e in det.events] == ["lane_error", "carrier_down"]
    root = one(a.close_all(t + S), FAILOVER)
    assert root.start_ns == OFFSET + t
    assert root.attributes["railhop.failover.cause"] == "carrier_down"


def test_the_failover_records_every_source_that_saw_it() -> None:
    """A carrier loss on an RDMA NIC is seen by several sources: netlink takes the NIC DOWN,
    the verbs async event, the sysfs counter and the eBPF driver hook follow (one of them
    timestamped before netlink, handled after it). The root span lists each source once, in
    the order of its first signal, with its delay after the first."""
    a = asm()
    t = 40 * S
    a.signal(Signal("nic1", "netlink", "carrier_down", t + 5 * MS, t + 6 * MS, "RTM_NEWLINK"))
    out = a.transition(StateChange("nic1", "up", "down", "carrier down", t + 5 * MS, t + 6 * MS))
    det = one(out, DETECTION)
    assert det.attributes["railhop.detection.signals"] == 1  # only what came before DOWN
    a.signal(Signal("nic1", "verbs", "carrier_down", t + 45 * MS, t + 46 * MS, "rxe1"))
    a.signal(Signal("nic1", "ebpf.rdma", "carrier_down", t + 83 * MS, t + 90 * MS, "kprobe"))
    a.signal(Signal("nic1", "netlink", "carrier_down", t + 95 * MS, t + 96 * MS))  # again
    a.signal(Signal("nic1", "sysfs", "counter_breach", t + 200 * MS, t + 201 * MS))
    # handled last, but its own timestamp is the earliest: it came first
    a.signal(Signal("nic1", "ebpf.carrier", "carrier_down", t + 2 * MS, t + 210 * MS))
    a.signal(Signal("nic2", "verbs", "carrier_down", t + 50 * MS, t + 51 * MS))  # another NIC
    out = a.transition(StateChange("nic1", "down", "up", "carrier up", t + 3 * S, t + 3 * S))
    # a signal while recovering is no witness of the failure
    root = one(out + a.close_all(t + 5 * S), FAILOVER)
    at = root.attributes
    assert at["railhop.failover.first_source"] == "ebpf.carrier"
    assert at["railhop.failover.first_signal"] == "carrier_down"
    assert at["railhop.failover.witness.sources"] == (
        "ebpf.carrier",
        "netlink",
        "verbs",
        "ebpf.rdma",
        "sysfs",
    )
    assert at["railhop.failover.witness.signals"] == ("carrier_down",) * 4 + ("counter_breach",)
    assert at["railhop.failover.witness.offsets_ms"] == (0.0, 3.0, 43.0, 81.0, 198.0)
    assert at["railhop.failover.source"] == "netlink"  # what took it DOWN is unchanged
    seen = [e for e in root.events if e.name.startswith("seen by ")]
    assert [e.name for e in seen] == [
        "seen by ebpf.carrier",
        "seen by netlink",
        "seen by verbs",
        "seen by ebpf.rdma",
        "seen by sysfs",
    ]
    assert [e.time_ns - OFFSET - t for e in seen] == [2 * MS, 5 * MS, 45 * MS, 83 * MS, 200 * MS]
    assert seen[3].attributes["railhop.detection.offset_ms"] == 81.0
    assert seen[3].attributes["detail"] == "kprobe"
    assert [e.time_ns for e in root.events] == sorted(e.time_ns for e in root.events)


def test_signals_while_recovering_are_no_witnesses() -> None:
    a = asm()
    t = 60 * S
    a.signal(Signal("nic0", "netlink", "carrier_down", t, t + 1 * MS))
    a.transition(StateChange("nic0", "up", "down", "carrier down", t, t + 1 * MS))
    a.transition(StateChange("nic0", "down", "recovering", "carrier up", t + 2 * S, t + 2 * S))
    a.signal(Signal("nic0", "verbs", "carrier_down", t + 2 * S + 5 * MS, t + 2 * S + 6 * MS))
    root = one(a.close_all(t + 4 * S), FAILOVER)
    assert root.attributes["railhop.failover.witness.sources"] == ("netlink",)
    assert "carrier_down while recovering" in [e.name for e in root.events]


def test_witness_attrs_is_pure_and_empty_without_signals() -> None:
    assert witness_attrs({}) == {}
    w = {
        "b": Signal("n", "b", "carrier_down", 7 * MS, 0),
        "a": Signal("n", "a", "counter_breach", 7 * MS, 0),
    }
    got = witness_attrs(w)
    assert got["railhop.failover.witness.sources"] == ("a", "b")  # a tie: by name
    assert got["railhop.failover.witness.offsets_ms"] == (0.0, 0.0)


def test_old_signals_do_not_count() -> None:
    a = asm(signal_window_s=1.0)
    a.signal(Signal("nic0", "sysfs", "counter_breach", 10 * S, 10 * S))
    out = a.transition(StateChange("nic0", "up", "down", "carrier down", 20 * S, 20 * S))
    det = one(out, DETECTION)
    assert det.start_ns == OFFSET + 20 * S
    assert det.attributes["railhop.detection.signal"] == "carrier_down"  # from the reason


def test_plugin_first_failover_without_a_down_nic() -> None:
    """A remote NIC failed: the plugin fails over; this node's NIC never goes DOWN."""
    a = asm()
    t = 7 * S
    out = a.lane_event(lane(EventType.FAILOVER_START, "nic1", t, 3, error=113), PEER, t + MS)
    det = one(out, DETECTION)
    assert det.attributes["railhop.detection.source"] == "plugin"
    assert det.attributes["error.type"] == "EHOSTUNREACH"
    out += a.lane_event(lane(EventType.FAILOVER_END, "nic1", t + 30 * MS, 3), PEER, 0)
    assert one(out, MIGRATION).start_ns == OFFSET + t
    assert not by_name(out, FAILOVER)
    out += a.lane_event(lane(EventType.FAILBACK, "nic1", t + 2 * S, 3), PEER, 0)
    root = one(out, FAILOVER)
    assert root.attributes["railhop.failover.opened_by"] == "plugin"
    assert root.attributes["railhop.failover.outcome"] == "failed_back"
    assert one(out, FAILBACK).start_ns == OFFSET + t + 2 * S


def test_a_move_onto_a_warm_standby_lists_the_promoted_lane() -> None:
    """The standby's first LANE_UP (idle, before the move) is no lane of the move; its
    promotion (a LANE_UP flagged promoted, no handshake) is: new_lanes lists it and the
    migration says standby. A move that opens its lanes says standby false."""
    a = asm()
    t = 9 * S
    idle = int(EventFlag.STANDBY)
    promoted = int(EventFlag.STANDBY | EventFlag.PROMOTED)
    out = a.lane_event(lane(EventType.LANE_UP, "nic2", t - S, 3, lane=2, flags=idle), PEER, t)
    out += a.lane_event(lane(EventType.FAILOVER_START, "nic1", t, 3, error=113), PEER, t)
    out += a.lane_event(
        lane(EventType.LANE_UP, "nic2", t + MS, 3, lane=2, remote_nic="peer2", flags=promoted),
        PEER,
        t,
    )
    # a replacement standby handshaken while the move is still open carries nothing
    out += a.lane_event(lane(EventType.LANE_UP, "nic3", t + 2 * MS, 3, lane=4, flags=idle), PEER, t)
    out += a.lane_event(lane(EventType.FAILOVER_END, "nic1", t + 5 * MS, 3), PEER, t)
    m = one(out, MIGRATION)
    assert m.attributes["railhop.migration.new_lanes"] == ("nic2->peer2",)
    assert m.attributes["railhop.migration.standby"] is True
    assert [e.name for e in m.events] == ["standby promoted", "standby up"]
    assert m.events[0].attributes["railhop.lane.id"] == 2

    # the same move onto a lane it opened (the plain LANE_UP an older plugin also sends)
    b = asm()
    b.lane_event(lane(EventType.FAILOVER_START, "nic1", t, 3, error=113), PEER, t)
    b.lane_event(lane(EventType.LANE_UP, "nic2", t + MS, 3, lane=2, remote_nic="peer2"), PEER, t)
    m = one(b.lane_event(lane(EventType.FAILOVER_END, "nic1", t + 5 * MS, 3), PEER, t), MIGRATION)
    assert m.attributes["railhop.migration.new_lanes"] == ("nic2->peer2",)
    assert m.attributes["railhop.migration.standby"] is False
    assert [e.name for e in m.events] == ["lane up"]


def test_plugin_only_failover_closes_when_idle() -> None:
    a = asm(idle_close_s=5)
    a.lane_event(lane(EventType.FAILOVER_START, "nic1", S, 3), PEER, S)
    a.lane_event(lane(EventType.FAILOVER_END, "nic1", S + MS, 3), PEER, S)
    assert a.tick(3 * S) == []
    root = one(a.tick(7 * S), FAILOVER)
    assert root.attributes["railhop.failover.outcome"] == "migrated"
    assert root.end_ns == OFFSET + S + MS


def test_fair_share_span_after_the_failover_is_over() -> None:
    """FAILOVER_END is the first completion after the move; FAIR_SHARE (the rate back) may come
    after the failover's root span: its span hangs under the migration span, once."""
    a = asm(idle_close_s=1)
    a.lane_event(lane(EventType.FAILOVER_START, "nic1", S, 3), PEER, S)
    out = a.lane_event(lane(EventType.FAILOVER_END, "nic1", S + 40 * MS, 3), PEER, S)
    mig = one(out, MIGRATION)
    assert mig.attributes["railhop.migration.first_completion_ms"] == 40.0
    assert one(a.tick(3 * S), FAILOVER).end_ns == OFFSET + S + 40 * MS
    ev = lane(EventType.FAIR_SHARE, "nic1", S + 250 * MS, 3, duration_ns=250 * MS)
    fair = one(a.lane_event(ev, PEER, S), tracing.FAIR_SHARE)
    assert (fair.trace_id, fair.parent_id) == (mig.trace_id, mig.span_id)
    assert (fair.start_ns, fair.end_ns) == (OFFSET + S + 40 * MS, OFFSET + S + 250 * MS)
    assert fair.attributes["railhop.migration.fair_share_ms"] == 250.0
    assert a.lane_event(ev, PEER, S) == []  # once per migration
    assert a.lane_event(lane(EventType.FAIR_SHARE, "nic1", S, 9), PEER, S) == []  # unknown


def test_no_backup_pair_escalates() -> None:
    a = asm()
    a.transition(StateChange("nic0", "up", "down", "device fatal", S, S))
    out = a.decision(Decision("nic0", "p", "migrate", (), S, S + MS))
    esc = one(out, ESCALATION)
    assert esc.status == "error" and esc.attributes["error.type"] == "no_backup_pair"
    root = one(a.close_all(5 * S), FAILOVER)
    assert root.status == "error"
    assert root.attributes["railhop.failover.outcome"] == "escalated"
    assert root.attributes["railhop.failover.escalated"] is True


def test_migration_timeout_escalates_and_shutdown_ends_everything() -> None:
    a = asm(migration_timeout_s=2)
    a.transition(StateChange("nic0", "up", "down", "carrier down", S, S))
    a.lane_event(lane(EventType.FAILOVER_START, "nic0", S, 5), PEER, S)
    assert a.tick(2 * S) == []
    esc = one(a.tick(4 * S), ESCALATION)
    assert esc.attributes["error.type"] == "migration_timeout"
    assert a.tick(5 * S) == []  # once
    out = a.close_all(6 * S)
    mig = one(out, MIGRATION)
    assert mig.status == "error" and mig.attributes["railhop.migration.outcome"] == "unfinished"
    root = one(out, FAILOVER)
    assert root.attributes["railhop.failover.outcome"] == "escalated"
    assert root.end_ns == OFFSET + 6 * S
    assert a.open_failovers == []


def test_flap_during_recovery_is_counted_and_decisions_deduplicated() -> None:
    a = asm()
    out = a.transition(StateChange("nic0", "up", "down", "carrier down", S, S))
    d = Decision("nic0", "p", "migrate", pairs(), S, S)
    out += a.decision(d)
    out += a.decision(d)  # same plan republished: no new span
    out += a.decision(Decision("nic0", "p", "migrate", pairs()[:1], 2 * S, 2 * S))
    assert len(by_name(out, DECISION)) == 2
    out += a.decision(Decision("nic9", "p", "migrate", pairs(), S, S))  # no failover: nothing
    assert len(by_name(out, DECISION)) == 2
    out += a.transition(StateChange("nic0", "down", "recovering", "carrier up", 3 * S, 3 * S))
    out += a.transition(StateChange("nic0", "recovering", "down", "carrier down", 4 * S, 4 * S))
    out += a.transition(StateChange("nic0", "down", "recovering", "carrier up", 5 * S, 5 * S))
    out += a.transition(StateChange("nic0", "recovering", "up", "recovered", 8 * S, 8 * S))
    root = one(out, FAILOVER)  # no connection migrated: over when the NIC is up
    assert root.attributes["railhop.failover.flaps"] == 1
    assert root.attributes["railhop.failover.decisions"] == 2
    fb = one(out, FAILBACK)
    assert fb.start_ns == OFFSET + 3 * S and "flap" in [e.name for e in fb.events]


def test_failback_grace_closes_when_a_connection_never_comes_back() -> None:
    a = asm(failback_grace_s=2)
    a.transition(StateChange("nic0", "up", "down", "carrier down", S, S))
    a.lane_event(lane(EventType.FAILOVER_START, "nic0", S, 1), PEER, S)
    a.lane_event(lane(EventType.FAILOVER_END, "nic0", S + MS, 1), PEER, S)
    assert a.transition(StateChange("nic0", "down", "up", "recovered", 3 * S, 3 * S)) == []
    assert a.tick(4 * S) == []
    out = a.tick(6 * S)
    assert one(out, FAILOVER).attributes["railhop.failover.connections_failed_back"] == 0


def test_a_new_failover_after_the_first_gets_a_new_trace() -> None:
    a = asm()
    first = carrier_failover(a)
    second = a.transition(StateChange("nic0", "up", "down", "carrier down", 200 * S, 200 * S))
    assert one(second, DETECTION).trace_id != one(first, FAILOVER).trace_id


def test_epoch_offset_uses_the_tightest_read() -> None:
    monos = iter([0, 50, 100, 101, 200, 260, 300, 350, 400, 460])
    walls = iter([1000, 2000, 3000, 4000, 5000])
    off = tracing.epoch_offset_ns(wall=lambda: next(walls), mono=lambda: next(monos))
    assert off == 2000 - 100  # the read bracketed by 100..101


def test_errno_names() -> None:
    assert tracing.errno_name(110) == "ETIMEDOUT"
    assert tracing.errno_name(-104) == "ECONNRESET"
    assert tracing.errno_name(99999) == "errno_99999"


# ---- OTLP/JSON


def _hex_ids_to_b64(doc: dict[str, object]) -> dict[str, object]:
    """OTLP/JSON ids are hex; the generic protobuf JSON mapping wants base64."""
    for rs in doc["resourceSpans"]:  # type: ignore[attr-defined]
        for ss in rs["scopeSpans"]:
            for sp in ss["spans"]:
                for k in ("traceId", "spanId", "parentSpanId"):
                    if k in sp:
                        sp[k] = base64.b64encode(bytes.fromhex(sp[k])).decode()
    return doc


def test_otlp_json_parses_with_the_official_proto(tmp_path: Path) -> None:
    spans = carrier_failover(asm())
    path = tmp_path / "traces.json"
    tracing.write_otlp_json(spans, path, {"service.name": "railhop-agent", "host.name": "n7"})
    doc = json.loads(path.read_text())
    msg = ExportTraceServiceRequest()
    json_format.ParseDict(_hex_ids_to_b64(doc), msg)
    got = msg.resource_spans[0].scope_spans[0].spans
    assert len(got) == len(spans)
    want = {s.span_id.to_bytes(8, "big"): s for s in spans}
    for g in got:
        s = want[g.span_id]
        assert g.trace_id == s.trace_id.to_bytes(16, "big")
        assert g.name == s.name and g.start_time_unix_nano == s.start_ns
        assert g.end_time_unix_nano == s.end_ns
        assert (g.parent_span_id or None) == (
            s.parent_id.to_bytes(8, "big") if s.parent_id is not None else None
        )
        attrs = {kv.key: kv.value for kv in g.attributes}
        assert (
            attrs["network.interface.name"].string_value == s.attributes["network.interface.name"]
        )
    mig = next(g for g in got if g.name == MIGRATION)
    attrs = {kv.key: kv.value for kv in mig.attributes}
    assert attrs["process.pid"].int_value == PEER
    assert [v.string_value for v in attrs["railhop.migration.new_lanes"].array_value.values]
    res = {kv.key: kv.value.string_value for kv in msg.resource_spans[0].resource.attributes}
    assert res == {"service.name": "railhop-agent", "host.name": "n7"}
    # the reader gives the spans back, as does the line format of the file sink
    assert len(tracing.read_otlp_json(path)) == len(spans)
    sink = tracing.OtlpJsonFileSink(tmp_path / "lines.jsonl", {"service.name": "x"})
    sink.emit(spans[:2])
    sink.emit(spans[2:])
    assert len((tmp_path / "lines.jsonl").read_text().splitlines()) == 2
    assert len(tracing.read_otlp_json(tmp_path / "lines.jsonl")) == len(spans)


# ---- resource and configuration


def test_hw_id_is_the_pci_address_when_known() -> None:
    a = asm(hw_ids={"nic0": "0000:19:00.0"})
    spans = carrier_failover(a)
    for name in (FAILOVER, DETECTION, FAILBACK):
        attrs = one(spans, name).attributes
        assert attrs["hw.id"] == "0000:19:00.0" and attrs["hw.name"] == "nic0", name
    for s in spans:  # every span with hw.* has hw.id
        if any(k.startswith("hw.") for k in s.attributes):
            assert "hw.id" in s.attributes, s.name


def test_resource_is_built_by_the_sdk_from_the_standard_variables(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Resource.create(): OTEL_RESOURCE_ATTRIBUTES (percent-decoded) beats railhop's
    defaults, OTEL_SERVICE_NAME beats both; the SDK adds telemetry.sdk.*."""
    env = {"NODE_NAME": "gpu-node-3", "K8S_POD_NAME": "railhop-abcde", "POD_NAMESPACE": "rh"}
    monkeypatch.setenv(
        "OTEL_RESOURCE_ATTRIBUTES",
        "deployment.environment=prod,host.name=override%2C1,service.name=from-attrs",
    )
    monkeypatch.setenv("OTEL_SERVICE_NAME", "railhop-node")
    a = tracing.resource_attributes(env, "h1", 12)
    assert a["k8s.node.name"] == "gpu-node-3"
    assert a["k8s.pod.name"] == "railhop-abcde"
    assert a["k8s.namespace.name"] == "rh"
    assert a["deployment.environment"] == "prod"
    assert a["host.name"] == "override,1"
    assert a["service.name"] == "railhop-node"
    assert a["process.pid"] == 12
    assert a["telemetry.sdk.name"] == "opentelemetry"
    monkeypatch.delenv("OTEL_SERVICE_NAME")
    assert tracing.resource_attributes(env, "h1", 12)["service.name"] == "from-attrs"
    monkeypatch.delenv("OTEL_RESOURCE_ATTRIBUTES")
    plain = tracing.resource_attributes({}, "h1", 12)
    assert plain["service.name"] == "railhop-agent" and plain["host.name"] == "h1"
    assert not any(k.startswith("k8s.") for k in plain)


def test_grpc_without_its_extra_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    import builtins

    real_import = builtins.__import__

    def no_grpc(name: str, *a: object, **kw: object) -> object:
        if name.startswith("opentelemetry.exporter.otlp.proto.grpc"):
            raise ImportError("No module named 'grpc'")
        return real_import(name, *a, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(builtins, "__import__", no_grpc)
    with pytest.raises(tracing.TracingError, match=r"railhop\[grpc\]"):
        tracing.sinks_from_env({"OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}, hostname="h")


def test_otel_traces_sampler_is_honoured(monkeypatch: pytest.MonkeyPatch) -> None:
    """OTEL_TRACES_SAMPLER (+ _ARG) decides per trace which failovers reach the exporter; every
    span of one failover gets the same decision."""
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    def exported(sampler: str, arg: str | None = None, runs: int = 1) -> tuple[int, int, int]:
        monkeypatch.setenv("OTEL_TRACES_SAMPLER", sampler)
        if arg is None:
            monkeypatch.delenv("OTEL_TRACES_SAMPLER_ARG", raising=False)
        else:
            monkeypatch.setenv("OTEL_TRACES_SAMPLER_ARG", arg)
        mem = InMemorySpanExporter()
        sink = tracing.OtelSink([SimpleSpanProcessor(mem)], {}, tracing.sampler_from_env())
        traces = 0
        rng = random.Random(7)
        for _ in range(runs):
            a = FailoverAssembler(OFFSET, host="h", rand_bits=rng.getrandbits)
            spans = carrier_failover(a)
            traces += 1
            sink.emit(spans)
        got = mem.get_finished_spans()
        per_trace: dict[int, int] = {}
        for g in got:
            per_trace[g.context.trace_id] = per_trace.get(g.context.trace_id, 0) + 1
        assert all(n == 6 for n in per_trace.values()), per_trace  # whole traces only
        return len(per_trace), traces, sink.dropped_by_sampler

    assert exported("always_on") == (1, 1, 0)
    assert exported("always_off") == (0, 1, 6)
    assert exported("parentbased_always_off") == (0, 1, 6)
    kept, total, _ = exported("traceidratio", "0.25", runs=400)
    assert total == 400
    assert 60 <= kept <= 140, kept  # 100 expected; binomial sd ~8.7
    with pytest.raises(tracing.TracingError, match="OTEL_TRACES_SAMPLER"):
        exported("sometimes")
    monkeypatch.delenv("OTEL_TRACES_SAMPLER")
    monkeypatch.delenv("OTEL_TRACES_SAMPLER_ARG", raising=False)
    assert tracing.sampler_from_env().get_description().startswith("ParentBased")


def test_sinks_from_env() -> None:
    sinks, _ = tracing.sinks_from_env({"OTEL_TRACES_EXPORTER": "none"}, hostname="h")
    assert sinks == []
    sinks, _ = tracing.sinks_from_env({"OTEL_SDK_DISABLED": "true"}, hostname="h")
    assert sinks == []
    for proto, mod in (("grpc", "grpc"), ("http/protobuf", "http"), (None, "http")):
        env = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:9"}
        if proto:
            env["OTEL_EXPORTER_OTLP_PROTOCOL"] = proto
        sinks, _ = tracing.sinks_from_env(env, hostname="h")
        (sink,) = sinks
        assert isinstance(sink, tracing.OtelSink)
        exporter = sink.processors[0]._batch_processor._exporter
        # the SDK's exporter, wrapped to record export health (issue 19)
        assert f".proto.{mod}." in type(exporter.inner).__module__
        sink.shutdown(2.0)
    sinks, _ = tracing.sinks_from_env(
        {"OTEL_TRACES_EXPORTER": "console,otlp"}, hostname="h", trace_file="/tmp/x"
    )
    assert len(sinks) == 2 and len(sinks[0].processors) == 2  # type: ignore[attr-defined]
    for s in sinks:
        s.shutdown(2.0)
    with pytest.raises(tracing.TracingError, match="zipkin"):
        tracing.sinks_from_env({"OTEL_TRACES_EXPORTER": "zipkin"}, hostname="h")
    with pytest.raises(tracing.TracingError, match="http/json"):
        tracing.sinks_from_env({"OTEL_EXPORTER_OTLP_PROTOCOL": "http/json"}, hostname="h")


def test_otel_sink_builds_sdk_spans_with_our_ids_and_times() -> None:
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
    from opentelemetry.trace import StatusCode

    mem = InMemorySpanExporter()
    sink = tracing.OtelSink([SimpleSpanProcessor(mem)], {"service.name": "t", "host.name": "h"})
    a = asm()
    a.transition(StateChange("nic0", "up", "down", "carrier down", S, S))
    spans = a.decision(Decision("nic0", "p", "migrate", (), S, S)) + a.close_all(2 * S)
    sink.emit(spans)
    got = {s.context.span_id: s for s in mem.get_finished_spans()}
    assert len(got) == len(spans)
    for s in spans:
        g = got[s.span_id]
        assert g.context.trace_id == s.trace_id and g.name == s.name
        assert (g.start_time, g.end_time) == (s.start_ns, s.end_ns)
        assert (g.parent.span_id if g.parent else None) == s.parent_id
        assert g.resource.attributes["host.name"] == "h"
        assert g.instrumentation_scope is not None and g.instrumentation_scope.name == "railhop"
    esc = next(g for g in got.values() if g.name == ESCALATION)
    assert esc.status.status_code == StatusCode.ERROR


class Boom:
    def emit(self, spans: Sequence[SpanDesc]) -> None:
        raise RuntimeError("collector on fire")

    def shutdown(self, timeout_s: float) -> None:
        raise RuntimeError("still on fire")


def test_tracer_never_raises_into_the_agent() -> None:
    seen: list[SpanDesc] = []

    def bad(spans: Sequence[SpanDesc]) -> None:
        raise ZeroDivisionError

    t = tracing.FailoverTracer([Boom()], offset_ns=OFFSET, host="h", observers=[seen.extend, bad])
    t.transition(StateChange("nic0", "up", "down", "carrier down", S, S))
    t.lane_event(lane(EventType.FAILOVER_START, "nic0", S, 1), PEER, S)
    t.shutdown(2 * S, 0.5)
    assert t.errors == 4  # two emits x (sink + bad observer)
    assert [s.name for s in seen].count(FAILOVER) == 1
