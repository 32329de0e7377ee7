"""The verbs completion probes' pure parts: their records as typed events, which error
completions are evidence against a NIC and how the health model weighs them (one process's
word never takes a NIC down for others), the probe plan, and the per-device metric totals."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from prometheus_client import CollectorRegistry

from railhop import daemon, health
from railhop.metrics import AgentMetrics, VerbsTotals
from railhop.sources import usdt as U
from railhop.sources.base import Reason
from railhop.sources.events import PluginLaneEvent, VerbsAsync, VerbsWcError
from railhop.sources.verbs_usdt import (
    VERBS_PROBES,
    CompletionStats,
    VerbsUsdtSource,
    typed_event,
)
from railhop.topology import read_topology

REPO = Path(__file__).resolve().parents[2]
DGX = REPO / "tests" / "fixtures" / "sys" / "dgx-h100"
NICS = ("ibp25s0", "ibp59s0", "ibp76s0", "ibp93s0")  # the plugin's order


def rec(probe: str, *args: int, pid: int = 42, t: int = 5_000_000_000) -> PluginLaneEvent:
    return PluginLaneEvent(
        ts_ns=t, source="usdt.verbs", hook="usdt", probe=probe, pid=pid, args=args
    )


def wc_err(status: int, nic: int = 2, pid: int = 42, t: int = 5_000_000_000) -> VerbsWcError:
    ev = typed_event(rec("verbs_wc_err", 0x1234, nic, status, 0x81, pid=pid, t=t))
    assert isinstance(ev, VerbsWcError)
    return ev


def test_records_become_typed_events() -> None:
    # arguments arrive sign-extended from their C types: nic -1 and 32-bit values stay so
    e = typed_event(rec("verbs_wc_err", 0x1234, -1, 12, 0x81))
    assert e == VerbsWcError(
        ts_ns=5_000_000_000,
        source="usdt.verbs",
        hook="usdt",
        pid=42,
        qp_num=0x1234,
        nic=-1,
        status=12,
        status_name="RETRY_EXC_ERR",
        vendor_err=0x81,
    )
    a = typed_event(rec("verbs_async", 3, 10, 0, 1))
    assert isinstance(a, VerbsAsync)
    assert (a.nic, a.event, a.code, a.qp_num, a.port) == (3, "PORT_ERR", 10, 0, 1)
    assert typed_event(rec("verbs_wc_err", 1, 0, 99, 0)).status_name == "99"  # type: ignore[union-attr]
    assert typed_event(rec("lane_up", 1, 2, 3, 4)) is None
    # the source passes only its own probes on
    src = VerbsUsdtSource("/nonexistent")
    assert src.filter_event(rec("lane_up", 1, 2)) is None
    assert isinstance(src.filter_event(rec("verbs_async", 0, 1, 7, 0)), VerbsAsync)


def test_plan_needs_every_argument() -> None:
    def note(name: str, args: str) -> U.UsdtNote:
        return U.UsdtNote("railhop", name, 0x10, 0, args)

    notes = [
        note("verbs_wc", "4@%ebx -4@%eax -4@%ecx 4@%edx 8@%rax"),
        note("verbs_wc_err", "4@%edx -4@%eax -4@%ecx"),  # one short
        note("lane_up", "8@%rdi 4@%esi -4@%edx -4@%ecx"),
    ]
    usable, caps = U.plan_probes(notes, VERBS_PROBES, "usdt.verbs", VerbsUsdtSource.MIN_ARGS)
    assert list(usable) == ["verbs_wc"]
    why = {c.hook: (c.reason, c.detail) for c in caps}
    assert why["verbs_wc_err"] == (Reason.NOT_AVAILABLE, "3 args, need 4")
    assert why["verbs_async"][0] == Reason.NO_PROBES
    assert "lane_up" not in why


def test_only_path_errors_are_evidence() -> None:
    alias = daemon.aliases(read_topology(DGX))
    f = daemon.health_event_from_verbs
    src = "uid 1000 pid 42"
    ev = f(wc_err(12), NICS, alias, src)
    assert ev == health.LaneError(
        "ibp76s0", 5.0, detail="verbs RETRY_EXC_ERR qp 4660 pid 42", source=src
    )
    for status in (20, 7, 19):  # RESP_TIMEOUT, BAD_RESP, FATAL
        assert isinstance(f(wc_err(status), NICS, alias, src), health.LaneError)
    # flushes follow an error or the lane's own fence; local, peer-refusal and RNR errors are
    # the application's or the peer's
    for status in (5, 1, 2, 4, 8, 9, 10, 11, 13):
        assert f(wc_err(status), NICS, alias, src) is None, status
    # an index the plugin's order does not have, an unnamed NIC, an unmanaged NIC
    assert f(wc_err(12, nic=4), NICS, alias, src) is None
    assert f(wc_err(12, nic=-1), NICS, alias, src) is None
    assert f(wc_err(12, nic=0), ("veth9",), alias, src) is None


def test_one_process_alone_leaves_the_nic_suspect_two_take_it_down() -> None:
    alias = daemon.aliases(read_topology(DGX))
    p = dataclasses.replace(health.HealthParams(), down_on=frozenset({"lane_error"}))
    m = health.HealthModel.create(NICS, 0.0, p)

    def apply(pid: int, t: float, n: int = 1) -> None:
        nonlocal m
        for k in range(n):
            e = daemon.health_event_from_verbs(
                wc_err(12, pid=pid, t=int((t + k * 0.01) * 1e9)),
                NICS,
                alias,
                f"uid 1000 pid {pid}",
            )
            assert e is not None
            m, _ = m.apply(e)

    apply(42, 1.0, n=10)  # many error completions, one process
    assert m["ibp76s0"].state is health.NicState.SUSPECT
    assert "uncorroborated" in m["ibp76s0"].reason
    assert all(m[n].state is health.NicState.UP for n in NICS if n != "ibp76s0")
    apply(43, 1.5)  # a second process within the window
    assert m["ibp76s0"].state is health.NicState.DOWN


def test_verbs_totals_are_monotonic_per_device() -> None:
    def st(pid: int, nic: int, wcs: int, nbytes: int) -> CompletionStats:
        return CompletionStats(pid, nic, wcs, 0, 0, nbytes, 0, 0)

    t = VerbsTotals()

    def label(i: int) -> str:
        return NICS[i] if 0 <= i < len(NICS) else "other"

    t.update([st(1, 0, 5, 500), st(2, 0, 1, 10), st(1, -1, 2, 0)], label)
    assert t.wcs == {"ibp25s0": 6, "other": 2} and t.bytes["ibp25s0"] == 510
    t.update([st(1, 0, 7, 700)], label)  # pid 2 exited: its share stays
    assert t.wcs["ibp25s0"] == 8 and t.bytes["ibp25s0"] == 710
    t.update([st(1, 0, 1, 100)], label)  # the entry was recreated (pid reused)
    assert t.wcs["ibp25s0"] == 9 and t.bytes["ibp25s0"] == 810


def test_verbs_metrics() -> None:
    reg = CollectorRegistry()
    m = AgentMetrics(reg, nics=NICS)
    stats = [CompletionStats(9, 2, 7, 4, 2, 3003, 7, 1)]
    m.set_verbs_stats(lambda: stats, lambda: NICS)
    m.verbs_error("ibp76s0", "RETRY_EXC_ERR")
    m.verbs_error("eth9", "WR_FLUSH_ERR")  # an unmanaged NIC: bounded label
    m.verbs_async(None, "PORT_ERR")
    v = reg.get_sample_value
    assert v("railhop_verbs_completions_total", {"device": "ibp76s0"}) == 7
    assert v("railhop_verbs_completion_bytes_total", {"device": "ibp76s0"}) == 3003
    assert (
        v("railhop_verbs_completion_errors_total", {"device": "ibp76s0", "status": "RETRY_EXC_ERR"})
        == 1
    )
    assert (
        v("railhop_verbs_completion_errors_total", {"device": "other", "status": "WR_FLUSH_ERR"})
        == 1
    )
    assert v("railhop_verbs_async_events_total", {"device": "other", "event": "PORT_ERR"}) == 1
