"""The plugin's USDT lane probes as lane events (railhop.daemon.UsdtLaneTranslator), and the
failover trace they make: the real probe sequence of plugin/src/core/failover.c."""

from __future__ import annotations

import itertools

from railhop import tracing
from railhop.control import EventType
from railhop.daemon import UsdtLaneTranslator
from railhop.sources.events import PluginLaneEvent
from railhop.tracing import FailoverAssembler, StateChange

NICS = ["nic0", "nic1", "nic2", "nic3"]
PID, CONN = 321, 0xABCDEF0123456789
MS = 1_000_000


def probe(name: str, t_ms: int, *args: int, pid: int = PID) -> PluginLaneEvent:
    return PluginLaneEvent(ts_ns=t_ms * MS, source="usdt.plugin", probe=name, pid=pid, args=args)


def test_probe_sequence_of_a_failover() -> None:
    tr = UsdtLaneTranslator(NICS)
    seq = [
        probe("lane_up", 0, CONN, 0, 1, 1),  # primary lane 0 on nic1 -> peer NIC 1
        probe("lane_down", 100, CONN, 0, 1, (1 << 64) - 104),  # -ECONNRESET read unsigned
        probe("failover_start", 100, CONN, 0, -104),
        probe("lane_up", 110, CONN, 2, 2, 2),  # backup lane 2 on nic2
        probe("failover_end", 130, CONN, 1, 1, 30 * MS),  # first completion after the move
        probe("fair_share", 400, CONN, 1, 300 * MS, 50_000_000),  # rate back at +300 ms
        probe("lane_up", 2000, CONN, 4, 1, 1),  # the primary pair is back
        probe("failback", 2000, CONN, 4),
        probe("lane_down", 2100, CONN, 2, 2, 0),  # the backup drained and closed
    ]
    got = [tr.translate(e) for e in seq]
    assert all(g is not None for g in got)
    types = [g.type for g in got if g is not None]
    assert types == [
        EventType.LANE_UP,
        EventType.LANE_ERROR,
        EventType.FAILOVER_START,
        EventType.LANE_UP,
        EventType.FAILOVER_END,
        EventType.FAIR_SHARE,
        EventType.LANE_UP,
        EventType.FAILBACK,
        EventType.LANE_DOWN,
    ]
    nics = [g.nic for g in got if g is not None]
    assert nics == ["nic1", "nic1", "nic1", "nic2", "nic1", "nic1", "nic1", "nic1", "nic2"]
    assert got[1] is not None and got[1].error == 104
    assert got[2] is not None and got[2].error == 104 and got[2].conn_id == CONN
    assert got[4] is not None and got[4].epoch == 1 and got[4].t_ns == 130 * MS
    assert got[4].duration_ns == 30 * MS
    assert got[5] is not None and got[5].t_ns == 400 * MS and got[5].duration_ns == 300 * MS

    ids = itertools.count(1)
    a = FailoverAssembler(0, rand_bits=lambda b: next(ids))
    spans = a.transition(StateChange("nic1", "up", "down", "carrier down", 99 * MS, 99 * MS))
    for g in got[:6]:
        assert g is not None
        spans += a.lane_event(g, PID, 0)
    spans += a.transition(StateChange("nic1", "down", "up", "recovered", 1900 * MS, 1900 * MS))
    for g in got[6:]:
        assert g is not None
        spans += a.lane_event(g, PID, 0)
    mig = next(s for s in spans if s.name == tracing.MIGRATION)
    assert (mig.start_ns, mig.end_ns) == (100 * MS, 130 * MS)
    assert mig.attributes["railhop.migration.new_lanes"] == ("nic2",)
    assert mig.attributes["error.type"] == "ECONNRESET"
    assert mig.attributes["railhop.migration.first_completion_ms"] == 30.0
    fair = next(s for s in spans if s.name == tracing.FAIR_SHARE)
    assert fair.parent_id == mig.span_id and fair.trace_id == mig.trace_id
    assert (fair.start_ns, fair.end_ns) == (130 * MS, 400 * MS)
    assert fair.attributes["railhop.migration.fair_share_ms"] == 300.0
    assert fair.attributes["railhop.migration.first_completion_ms"] == 30.0
    root = next(s for s in spans if s.name == tracing.FAILOVER)
    assert root.attributes["railhop.failover.outcome"] == "failed_back"
    assert root.end_ns == 2000 * MS


def test_a_move_onto_a_warm_standby_from_the_probes() -> None:
    """The standby's lane_up (handshaken before the move) is no lane of the move; its
    standby_promoted probe is: a LANE_UP flagged standby and promoted, on the standby's NIC,
    listed in the migration's new lanes with railhop.migration.standby true."""
    tr = UsdtLaneTranslator(NICS)
    seq = [
        probe("lane_up", 0, CONN, 0, 1, 1),  # primary lane 0 on nic1
        probe("lane_up", 5, CONN, 2, 3, 3),  # the standby, lane 2 on nic3 (idle)
        probe("lane_down", 100, CONN, 0, 1, (1 << 64) - 104),
        probe("failover_start", 100, CONN, 0, -104),
        probe("standby_promoted", 100, CONN, 2, 3, 3),
        probe("failover_end", 120, CONN, 1, 1, 20 * MS),
    ]
    got = [tr.translate(e) for e in seq]
    assert all(g is not None for g in got)
    up = got[4]
    assert up is not None and up.type is EventType.LANE_UP and up.nic == "nic3"
    assert up.lane == 2 and up.promoted and up.standby
    assert got[1] is not None and not got[1].standby  # lane_up says nothing of the role
    ids = itertools.count(1)
    a = FailoverAssembler(0, rand_bits=lambda b: next(ids))
    spans = []
    for g in got:
        assert g is not None
        spans += a.lane_event(g, PID, 0)
    mig = next(s for s in spans if s.name == tracing.MIGRATION)
    assert mig.attributes["railhop.migration.new_lanes"] == ("nic3",)
    assert mig.attributes["railhop.migration.standby"] is True
    # the promoted lane's NIC is known: its fail-back names it
    back = tr.translate(probe("failback", 900, CONN, 2))
    assert back is not None and back.nic == "nic3"


def test_unknown_lanes_and_nics_are_dropped() -> None:
    tr = UsdtLaneTranslator(NICS)
    assert tr.translate(probe("failover_start", 1, CONN, 9, 0)) is None  # lane never seen
    assert tr.translate(probe("failover_end", 2, CONN, 1, 1, MS)) is None
    assert tr.translate(probe("fair_share", 2, CONN, 1, MS, 1000)) is None
    assert tr.translate(probe("failback", 3, CONN, 9)) is None
    assert tr.translate(probe("lane_up", 4, CONN, 0, 7, 0)) is None  # NIC index out of range
    assert tr.translate(probe("lane_up", 4, CONN, 0, 1, 0, pid=0)) is None
    assert tr.translate(probe("req_done", 5, -1, 4096, 1000)) is None
    assert tr.translate(probe("standby_promoted", 5, CONN, 2, 9, 0)) is None  # NIC 9: none
    # the same connection id in another process is another connection
    assert tr.translate(probe("lane_up", 6, CONN, 0, 3, 3, pid=999)) is not None
    assert tr.translate(probe("failover_start", 7, CONN, 0, 0)) is None
