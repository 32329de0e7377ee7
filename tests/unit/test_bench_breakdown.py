"""The resume breakdown's pure parts (bench/resume_breakdown.py): the run matrix, the marks
taken from a sender's log, and the summary row, without a fabric."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"

LOG = """\
[   4.050] agent.c:255 NET/railhop agent_poll: agent marks nic1 down (reason 1)
[   4.052] failover.c:259 NET/railhop rh_fo_lane_failed: conn 94bd86c7bf5b4e3e (send): lane 0 \
nic1 -> peer NIC 1 failed: local NIC down (Network is down)
[   4.052] conn.c:207 NET/railhop rh_conn_open_lane: conn 94bd86c7bf5b4e3e: opening lane 2 nic0 \
-> peer NIC 0 (4 streams, epoch 1)
[   4.064] handshake.c:325 NET/railhop rh_core_stream_ready: conn 94bd86c7bf5b4e3e (send): lane 2 \
up nic0 -> peer NIC 0
[   4.068] failover.c:657 NET/railhop rh_fo_on_resume: conn 94bd86c7bf5b4e3e (send): RESUME \
applied at epoch 2: 0 confirmed, 8 replayed (3932160 bytes) on 3 lanes
[   4.080] marks.c:100 NET/railhop rh_fo_replay_progress: conn 94bd86c7bf5b4e3e (send): replay \
sent, 27.9 ms after detection
[   4.103] marks.c:155 NET/railhop first_completion: conn 94bd86c7bf5b4e3e (send): failover off \
nic1 -> peer 10.77.1.2 (NIC 1), cause: local NIC down; first completion 50.8 ms after detection
[   4.286] marks.c:108 NET/railhop rh_fo_replay_progress: conn 94bd86c7bf5b4e3e (send): replay \
acknowledged, 233.4 ms after detection
[   4.400] handshake.c:325 NET/railhop rh_core_stream_ready: conn 0000000000000001 (send): lane 0 \
up nic2 -> peer NIC 2 (primary)
"""


@pytest.fixture(scope="module")
def rb() -> Iterator[ModuleType]:
    sys.path.insert(0, str(BENCH))
    try:
        import resume_breakdown

        yield resume_breakdown
    finally:
        sys.path.remove(str(BENCH))


def test_matrix_order_and_unlimited_runs_once(rb: ModuleType) -> None:
    got = list(rb.cells([1000, None], [5, 50], [None, 100], ["none", "carrier"], ["agent"]))
    # shaped NICs: every queue x host queue x fault; unlimited: no queue, so once per fault
    assert len(got) == 2 * 2 * 2 + 2
    assert got[0] == (1000, 5, None, "none", "agent", "fifo")
    assert got[1] == (1000, 5, None, "carrier", "agent", "fifo")
    assert got[2] == (1000, 5, 100, "none", "agent", "fifo")
    assert got[-2:] == [
        (None, 5, None, "none", "agent", "fifo"),
        (None, 5, None, "carrier", "agent", "fifo"),
    ]
    # the host qdisc: side by side for each host queue; unlimited NICs have no queue to share
    got = list(rb.cells([1000, None], [5], [100], ["carrier"], ["agent"], ["fifo", "flows"]))
    assert [(c[0], c[5]) for c in got] == [(1000, "fifo"), (1000, "flows"), (None, "fifo")]


def test_marks_of_a_moved_connection(rb: ModuleType) -> None:
    mk = rb.marks(rb.parse_log(LOG), "nic1", 4.050)
    assert mk["hit"] == 1  # the untouched connection on nic2 is not counted
    want = {
        "detect": 0.0,
        "decide": 2.0,
        "open": 2.0,
        "handshake": 14.0,
        "resume": 18.0,
        "rp.sent": 30.0,
        "first": 53.0,
        "rp.acked": 236.0,
    }
    for name, ms in want.items():
        assert mk[name] == pytest.approx(ms, abs=0.01), name
    assert mk["fair"] is None  # never logged: missing, not guessed


def test_a_round_without_a_fault_has_no_marks_and_no_missing_note(rb: ModuleType) -> None:
    mk = rb.marks(rb.parse_log(LOG), "nic1", 9.0)  # nothing after t=9 s
    assert mk["hit"] == 0 and all(mk[m] is None for m in rb.MARKS)
    r = {**mk, "stall": 21.0, "ok": True, "healthy": 3821.0, "degraded": 3820.0}
    s = rb.summarize([r, r])
    line = rb.row(1000, 5, "none", "agent", s, 100)
    assert "5ms/h100" in line and "none" in line and "2/2" in line
    assert "missing" not in line  # a control round has no marks to miss
    assert "missing in some rounds: detect" in rb.row(1000, 5, "carrier", "agent", s)
    assert "5ms/h100+fl" in rb.row(1000, 5, "none", "agent", s, 100, "flows")
    assert "+fl" not in rb.row(None, 5, "none", "agent", s, None, "flows")


def test_standing_host_queue_in_ms(rb: ModuleType) -> None:
    hq = rb.HostQueueSampler(None, on=False)
    # backlog per NIC (bytes) at 1 Gbit/s = 125 000 bytes per ms
    hq.samples = [(10.0, [250_000, 0, 125_000, 0]), (10.1, [500_000, 0, 500_000, 500_000])]
    hq.samples += [(11.0, [1_250_000] * 4)]  # after the window
    assert hq.median_ms(10.0, 10.5, [0, 2, 3], 1000) == pytest.approx((1.0 + 4.0) / 2)
    assert hq.median_ms(10.0, 10.5, [0, 2, 3], None) is None  # no ceiling: no queue to measure
    assert hq.median_ms(20.0, 21.0, [0], 1000) is None  # no samples (--tcpstat off)
    r = {
        "resume": 31.0,
        "first": 73.0,
        "fair": None,
        "stall": 401.0,
        "stall_conn": 2,
        "stall_at": 690.0,
        "healthy_gap": 221.0,
        "host_queue_ms": [None, 7.54],
        "host_drops": 4490,
        "tcp": [dict.fromkeys(rb.TCP_COUNTERS, 0), dict.fromkeys(rb.TCP_COUNTERS, 1)],
    }
    line = rb.tcp_line(r)
    assert "host queue -/7.5 ms, drops 4490" in line
    assert "conn 2 from 690; healthy 221" in line and "RetransSegs=0/1" in line


STANDBY_LOG = """\
[   4.050] agent.c:255 NET/railhop agent_poll: agent marks nic1 down (reason 1)
[   4.052] failover.c:259 NET/railhop rh_fo_lane_failed: conn 94bd86c7bf5b4e3e (send): lane 0 \
nic1 -> peer NIC 1 failed: local NIC down (Network is down)
[   4.053] failover.c:128 NET/railhop standby_promote: conn 94bd86c7bf5b4e3e (send): standby \
lane 2 nic0 -> peer NIC 0 promoted (a move)
[   4.068] failover.c:657 NET/railhop rh_fo_on_resume: conn 94bd86c7bf5b4e3e (send): RESUME \
applied at epoch 2: 0 confirmed, 8 replayed (3932160 bytes) on 1 lanes
[   5.060] handshake.c:467 NET/railhop rh_core_stream_ready: conn 94bd86c7bf5b4e3e (send): lane 4 \
up nic2 -> peer NIC 2 (standby)
"""


def test_marks_of_a_move_onto_a_standby(rb: ModuleType) -> None:
    """A promoted standby was opened and handshaken before the move: both marks at the
    promotion; its replacement standby coming up later is no handshake of the move."""
    mk = rb.marks(rb.parse_log(STANDBY_LOG), "nic1", 4.050)
    assert mk["open"] == pytest.approx(3.0, abs=0.01)
    assert mk["handshake"] == pytest.approx(3.0, abs=0.01)
