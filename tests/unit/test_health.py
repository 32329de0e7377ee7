"""railhop.health: the per-NIC state machine (pure; time is always passed in)."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from railhop.health import (
    AdminDown,
    AdminUp,
    CarrierDown,
    CarrierUp,
    CounterBreach,
    DeviceFatal,
    Event,
    HealthError,
    HealthModel,
    HealthParams,
    LaneError,
    LaneTimeout,
    NicHealth,
    NicState,
    ProbeFail,
    ProbeOk,
    Suspicion,
    TcpSuspect,
    initial,
    next_deadline,
    probes_needed,
    step,
    tick,
)

S = NicState
P = HealthParams(
    suspect_strikes=3,
    suspect_window_s=2.0,
    suspect_clear_s=5.0,
    down_on=frozenset({"lane_timeout"}),
    recover_stable_s=0.5,
    recover_probes=0,
    holdoff_initial_s=1.0,
    holdoff_max_s=8.0,
    holdoff_multiplier=2.0,
    flap_reset_s=60.0,
)


def run(events: list[Event], p: HealthParams = P, t0: float = 0.0) -> NicHealth:
    h = initial("nic0", t0)
    for ev in events:
        h = step(h, ev, p)
    return h


def test_carrier_loss_and_recovery() -> None:
    h = run([CarrierDown("nic0", 10.0)])
    assert h.state is S.DOWN and h.since == 10.0 and h.flaps == 1
    assert h.holdoff_until == 11.0 and h.reason == "carrier down"
    assert next_deadline(h, P) is None  # link down: only an event can help
    h = step(h, CarrierUp("nic0", 10.2), P)
    assert h.state is S.RECOVERING
    # hold-off (until 11.0) dominates the stability time (10.2 + 0.5)
    assert next_deadline(h, P) == 11.0
    assert tick(h, 10.99, P).state is S.RECOVERING
    up = tick(h, 11.0, P)
    assert up.state is S.UP and up.since == 11.0 and up.stable_since == 11.0


def test_stability_time_is_hysteresis() -> None:
    h = run([CarrierDown("nic0", 0.0), CarrierUp("nic0", 5.0)])  # hold-off long over
    assert h.state is S.RECOVERING
    assert tick(h, 5.49, P).state is S.RECOVERING
    assert tick(h, 5.5, P).state is S.UP


def test_soft_signals_suspect_then_down() -> None:
    h = run([LaneError("nic0", 1.0)])
    assert h.state is S.SUSPECT and h.strikes == (1.0,)
    h = step(h, CounterBreach("nic0", 1.5, counter="symbol_error", rate=50, threshold=10), P)
    assert h.state is S.SUSPECT and len(h.strikes) == 2
    h = step(h, LaneError("nic0", 2.5), P)
    assert h.state is S.DOWN and "3 strikes" in h.reason


def test_strikes_outside_window_do_not_count() -> None:
    h = run([LaneError("nic0", 0.0), LaneError("nic0", 1.0), LaneError("nic0", 2.5)])
    # the first strike (t=0) left the 2 s window at t=2.5
    assert h.state is S.SUSPECT and h.strikes == (1.0, 2.5)


def test_suspect_clears_after_quiet() -> None:
    h = run([LaneError("nic0", 1.0), LaneError("nic0", 2.0)])
    assert next_deadline(h, P) == 7.0
    assert tick(h, 6.9, P).state is S.SUSPECT
    up = tick(h, 7.0, P)
    assert up.state is S.UP and up.strikes == () and up.reason == "quiet"
    assert up.stable_since == 0.0  # suspect time still counts as up for flap forgiveness


def test_probe_decides_suspicion() -> None:
    h = run([LaneError("nic0", 1.0), ProbeOk("nic0", 1.1)])
    assert h.state is S.UP and h.reason == "probe ok"
    h = run([LaneError("nic0", 1.0), ProbeFail("nic0", 1.1)])
    assert h.state is S.DOWN and "probe failed" in h.reason


def test_down_on_kinds_skip_suspect() -> None:
    h = run([LaneTimeout("nic0", 1.0)])
    assert h.state is S.DOWN and h.reason == "lane timeout"
    lenient = dataclasses.replace(P, down_on=frozenset())
    assert run([LaneTimeout("nic0", 1.0)], lenient).state is S.SUSPECT
    assert run([LaneError("nic0", 1.0)], dataclasses.replace(P, suspect_strikes=1)).state is S.DOWN


def test_hard_signals() -> None:
    assert run([DeviceFatal("nic0", 1.0)]).state is S.DOWN
    h = run([LaneError("nic0", 1.0), CarrierDown("nic0", 1.2)])
    assert h.state is S.DOWN and not h.link_up


def test_admin_down_needs_admin_up() -> None:
    h = run([AdminDown("nic0", 1.0, reason="maintenance")])
    assert h.state is S.DOWN and h.reason == "admin down: maintenance"
    h = step(h, ProbeOk("nic0", 2.0), P)
    h = tick(h, 100.0, P)
    assert h.state is S.DOWN  # neither probes nor time bring it back
    h = step(h, AdminUp("nic0", 101.0), P)
    assert h.state is S.RECOVERING
    assert tick(h, 101.5, P).state is S.UP


def test_admin_up_with_link_down_stays_down() -> None:
    h = run([CarrierDown("nic0", 1.0), AdminDown("nic0", 2.0), AdminUp("nic0", 3.0)])
    assert h.state is S.DOWN
    assert step(h, CarrierUp("nic0", 4.0), P).state is S.RECOVERING


def test_blackhole_retries_with_backoff_forever() -> None:
    """Soft failure with the link up: hold-off, retry, fail again; hold-off doubles, capped."""
    h = run([LaneTimeout("nic0", 0.0)])
    holdoffs = []
    t = 0.0
    for _ in range(8):
        assert h.state is S.DOWN
        holdoffs.append(h.holdoff_until - h.since)
        deadline = next_deadline(h, P)
        assert deadline == h.holdoff_until
        h = tick(h, deadline, P)
        assert h.state is S.RECOVERING and h.reason == "hold-off over"
        t = deadline + 0.1
        h = step(h, LaneTimeout("nic0", t), P)  # still broken
        assert h.state is S.DOWN
    assert holdoffs == pytest.approx([1.0, 2.0, 4.0, 8.0, 8.0, 8.0, 8.0, 8.0])
    # finally healed: after the (capped) hold-off it waits in RECOVERING for evidence (the link
    # never went down, so nothing else says the path works again: the silent-blackhole bug)
    d = next_deadline(h, P)
    assert d is not None
    h = tick(h, d, P)
    assert h.state is S.RECOVERING and h.need_evidence
    assert next_deadline(h, P) is None
    h = tick(h, d + 100.0, P)
    assert h.state is S.RECOVERING  # no amount of waiting brings it back
    h = step(h, ProbeOk("nic0", d + 100.0), P)  # a plugin's fail-back / lane up on it
    assert h.state is S.UP and not h.need_evidence and h.reason == "recovered"


def test_blackhole_recovery_needs_fresh_evidence() -> None:
    """The demo's bug: DOWN on lane timeouts, carrier up all along -> RECOVERING after the
    hold-off and UP 0.5 s later with nothing checking it. Now it needs a ProbeOk, and one
    from before the failure does not count."""
    h = run([LaneTimeout("nic0", 10.0)])
    assert h.state is S.DOWN and h.need_evidence and h.holdoff_until == 11.0
    h = step(h, ProbeOk("nic0", 9.9), P)  # a lane that came up before the failure
    assert h.state is S.DOWN and h.probes_ok == 0
    h = tick(h, 20.0, P)
    assert h.state is S.RECOVERING and h.since == 11.0
    h = step(h, ProbeOk("nic0", 10.5), P)  # older than RECOVERING: ignored too
    assert h.probes_ok == 0 and tick(h, 30.0, P).state is S.RECOVERING
    h = step(h, ProbeOk("nic0", 30.0), P)
    assert tick(h, 30.0, P).state is S.UP  # stable time (11.5) long over
    # a ProbeOk while still held off counts, but the hold-off still holds
    h = run([LaneError("nic0", 0.0), LaneError("nic0", 0.1), LaneError("nic0", 0.2)])
    assert h.state is S.DOWN and h.need_evidence
    h = step(h, ProbeOk("nic0", 0.3), P)
    assert h.state is S.RECOVERING and h.probes_ok == 1
    assert tick(h, 1.1, P).state is S.RECOVERING
    assert tick(h, 1.2, P).state is S.UP  # hold-off (1.2) over, stable since 0.3 + 0.5


def test_tcp_trouble_is_suspicion_only() -> None:
    h = run([TcpSuspect("nic0", 1.0, detail="retransmit")])
    assert h.state is S.SUSPECT and h.reason == "tcp suspect"
    h = run([TcpSuspect("nic0", 1.0 + i * 0.01) for i in range(50)])  # never strikes
    assert h.state is S.SUSPECT and h.strikes == ()
    assert tick(h, 1.49 + P.suspect_clear_s, P).state is S.UP  # quiet again
    # the plugins' confirming probe failed: lane errors/timeouts take it down as usual
    assert step(h, LaneTimeout("nic0", 2.0), P).state is S.DOWN


def test_carrier_down_needs_no_probe() -> None:
    h = run([LaneTimeout("nic0", 0.0), CarrierDown("nic0", 0.1)])
    assert h.state is S.DOWN and not h.need_evidence  # carrier up will tell
    h = step(h, CarrierUp("nic0", 5.0), P)
    assert tick(h, 5.5, P).state is S.UP
    # a bad lane signal while recovering from carrier loss: now it needs evidence
    h = run([CarrierDown("nic0", 0.0), CarrierUp("nic0", 2.0), LaneError("nic0", 2.1)])
    assert h.state is S.DOWN and h.need_evidence
    h = tick(h, 100.0, P)
    assert h.state is S.RECOVERING
    # device fatal (no carrier change) needs evidence too
    assert run([DeviceFatal("nic0", 0.0)]).need_evidence


def test_flapping_carrier_is_damped() -> None:
    h = initial("nic0", 0.0)
    t = 0.0
    for _ in range(5):  # 5 Hz flap
        h = step(h, CarrierDown("nic0", t), P)
        h = step(h, CarrierUp("nic0", t + 0.1), P)
        t += 0.2
    assert h.state is S.RECOVERING and h.flaps == 5
    assert h.holdoff_until == pytest.approx(0.8 + 8.0)
    assert tick(h, 8.7, P).state is S.RECOVERING
    assert tick(h, 8.8, P).state is S.UP


def test_flaps_forgotten_after_stable_period() -> None:
    h = run([CarrierDown("nic0", 0.0), CarrierUp("nic0", 0.1)])
    h = tick(h, 2.0, P)
    assert h.state is S.UP and h.flaps == 1
    assert next_deadline(h, P) == pytest.approx(1.0 + 60.0)
    h = tick(h, 61.0, P)
    assert h.flaps == 0 and next_deadline(h, P) is None
    h = step(h, CarrierDown("nic0", 70.0), P)
    assert h.flaps == 1 and h.holdoff_until == 71.0
    # without a tick in between, the next failure still sees the long stable period
    h2 = run([CarrierDown("nic0", 0.0), CarrierUp("nic0", 0.1)])
    h2 = step(h2, CarrierDown("nic0", 100.0), P)
    assert h2.flaps == 1


def test_recover_probes_required() -> None:
    p = dataclasses.replace(P, recover_probes=2)
    h = run([CarrierDown("nic0", 0.0), CarrierUp("nic0", 0.1)], p)
    h = tick(h, 50.0, p)
    assert h.state is S.RECOVERING and next_deadline(h, p) is None
    h = step(h, ProbeOk("nic0", 50.0), p)
    assert h.state is S.RECOVERING
    h = step(h, ProbeOk("nic0", 50.1), p)
    assert h.state is S.UP


def test_bad_signal_while_recovering_is_a_flap() -> None:
    h = run([CarrierDown("nic0", 0.0), CarrierUp("nic0", 0.1), LaneError("nic0", 0.2)])
    assert h.state is S.DOWN and h.flaps == 2 and "while recovering" in h.reason
    assert h.holdoff_until == pytest.approx(2.2)


def test_out_of_order_events_use_last_time() -> None:
    h = run([CarrierDown("nic0", 10.0), CarrierUp("nic0", 9.0)])
    assert h.state is S.RECOVERING and h.since == 10.0 and h.t == 10.0


def test_initial_link_down() -> None:
    h = initial("nic0", 0.0, link_up=False)
    assert h.state is S.DOWN and h.flaps == 0
    h = step(h, CarrierUp("nic0", 1.0), P)
    assert h.state is S.RECOVERING
    assert tick(h, 1.5, P).state is S.UP


def test_bad_inputs() -> None:
    with pytest.raises(HealthError, match="applied to NIC"):
        step(initial("nic0", 0.0), CarrierDown("nic1", 1.0), P)
    with pytest.raises(HealthError, match="suspect_strikes"):
        HealthParams(suspect_strikes=0)
    with pytest.raises(HealthError, match="holdoff"):
        HealthParams(holdoff_initial_s=10, holdoff_max_s=1)
    with pytest.raises(HealthError, match="unknown event kinds"):
        HealthParams(down_on=frozenset({"carrier_down"}))
    with pytest.raises(HealthError, match="unknown event type"):
        step(initial("nic0", 0.0), Event("nic0", 1.0), P)
    assert P.holdoff(10**6) == P.holdoff_max_s  # huge flap counts do not overflow


def test_model() -> None:
    m = HealthModel.create(["a", "b"], 0.0, P, link_up={"b": False})
    assert m.states == {"a": S.UP, "b": S.DOWN}
    m, tr = m.apply(CarrierDown("a", 1.0))
    assert tr is not None and (tr.nic, tr.old, tr.new, tr.t) == ("a", S.UP, S.DOWN, 1.0)
    m, tr = m.apply(CarrierDown("a", 1.1))
    assert tr is None
    m, _ = m.apply(CarrierUp("a", 1.2))
    m, _ = m.apply(CarrierUp("b", 1.2))
    assert m.next_deadline() == pytest.approx(1.7)  # b: 1.2 + 0.5 stable; a: hold-off to 2.0
    m, changes = m.tick(2.0)
    assert [(c.nic, c.new) for c in changes] == [("a", S.UP), ("b", S.UP)]
    with pytest.raises(HealthError, match="unknown NIC"):
        m.apply(ProbeOk("zz", 3.0))


# --- properties -----------------------------------------------------------------------------

KINDS = [
    CarrierDown,
    CarrierUp,
    DeviceFatal,
    AdminDown,
    AdminUp,
    LaneTimeout,
    LaneError,
    CounterBreach,
    ProbeOk,
    ProbeFail,
    TcpSuspect,
    Suspicion,
]

events_st = st.lists(
    st.tuples(st.sampled_from(KINDS), st.floats(min_value=0.0, max_value=5.0)), max_size=40
)
params_st = st.builds(
    HealthParams,
    suspect_strikes=st.integers(1, 4),
    suspect_window_s=st.floats(0, 5),
    suspect_clear_s=st.floats(0, 10),
    down_on=st.frozensets(st.sampled_from(["lane_timeout", "lane_error", "probe_fail"])),
    recover_stable_s=st.floats(0, 3),
    recover_probes=st.integers(0, 2),
    holdoff_initial_s=st.floats(0, 2),
    holdoff_max_s=st.floats(2, 30),
    holdoff_multiplier=st.floats(1, 4),
    flap_reset_s=st.floats(0, 100),
)


@settings(max_examples=300, deadline=None)
@given(events_st, params_st)
def test_invariants(evs: list[tuple[type[Event], float]], p: HealthParams) -> None:
    h = initial("nic0", 0.0)
    t = 0.0
    for kind, dt in evs:
        t += dt
        before = h
        h = step(h, kind("nic0", t), p)
        assert h.t == t and h.since <= h.t
        assert h.state is not S.UP or (h.link_up and not h.admin_down)
        if not h.link_up or h.admin_down:
            assert h.state is S.DOWN
        if h.state is S.DOWN and before.state is not S.DOWN:
            assert h.holdoff_until - t <= p.holdoff_max_s + 1e-9
        if h.state is S.UP and before.state in (S.DOWN, S.RECOVERING):
            assert h.since >= before.holdoff_until - 1e-9  # never back before the hold-off
            if before.need_evidence:  # a blackhole never recovers on time alone
                assert kind is ProbeOk or before.probes_ok >= 1
        # ticking before the deadline changes nothing; at the deadline something changes
        d = next_deadline(h, p)
        if d is not None and d > h.t:
            half = (h.t + d) / 2
            if h.t < half < d:  # (not representable between two adjacent floats)
                mid = tick(h, half, p)
                assert (mid.state, mid.flaps) == (h.state, h.flaps)
            assert (tick(h, d, p).state, tick(h, d, p).flaps) != (h.state, h.flaps)


@settings(max_examples=300, deadline=None)
@given(events_st, params_st)
def test_never_gives_up(evs: list[tuple[type[Event], float]], p: HealthParams) -> None:
    """Whatever happened, a NIC that is healthy again gets back to UP within a bounded time."""
    h = initial("nic0", 0.0)
    t = 0.0
    for kind, dt in evs:
        t += dt
        h = step(h, kind("nic0", t), p)
    t += 0.01
    for ev in (CarrierUp("nic0", t), AdminUp("nic0", t)):
        h = step(h, ev, p)
    for i in range(p.recover_probes + 1):
        h = step(h, ProbeOk("nic0", t + i * 1e-3), p)
    bound = t + p.holdoff_max_s + p.recover_stable_s + p.suspect_clear_s + 1.0
    for _ in range(5):  # follow deadlines (probes may be needed after DOWN -> RECOVERING)
        d = next_deadline(h, p)
        if d is not None:
            h = tick(h, d, p)
        if h.state is S.RECOVERING and h.probes_ok < probes_needed(h, p):
            for i in range(probes_needed(h, p)):
                h = step(h, ProbeOk("nic0", h.t + i * 1e-3), p)
    h = tick(h, bound, p)
    assert h.state is S.UP, h


# -- issue 19: lane events are evidence, not commands


def test_one_reporter_alone_never_takes_a_nic_down() -> None:
    p = dataclasses.replace(P, down_on=frozenset({"lane_timeout"}), corroborate_sources=2)
    h = initial("nic0", 0.0)
    for i in range(20):  # a flood from one process: suspicion at most, whatever down_on says
        h = step(h, LaneTimeout("nic0", 1.0 + i * 0.01, source="uid 1000 pid 7"), p)
        assert h.state is S.SUSPECT
    assert "uncorroborated" in h.reason
    h = step(h, LaneError("nic0", 1.3, source="uid 1000 pid 7"), p)
    assert h.state is S.SUSPECT
    # a second process within the window corroborates: DOWN
    h = step(h, LaneTimeout("nic0", 1.4, source="uid 1000 pid 8"), p)
    assert h.state is S.DOWN and "uncorroborated" not in h.reason


def test_a_kernel_signal_or_an_agent_probe_corroborates_one_reporter() -> None:
    p = dataclasses.replace(P, down_on=frozenset({"lane_timeout"}), corroborate_sources=2)
    for kernel in (TcpSuspect("nic0", 1.0), ProbeFail("nic0", 1.0)):
        h = step(initial("nic0", 0.0), kernel, p)
        h = step(h, LaneTimeout("nic0", 1.5, source="uid 1000 pid 7"), p)
        assert h.state is S.DOWN, kernel
    # ... but not one older than the window
    h = step(initial("nic0", 0.0), TcpSuspect("nic0", 1.0), p)
    h = step(h, LaneTimeout("nic0", 1.0 + P.suspect_window_s + 0.1, source="uid 1 pid 7"), p)
    assert h.state is S.SUSPECT


def test_a_kernel_signal_after_the_lane_report_corroborates_it_too() -> None:
    """Either order: a blackholed lane's timeout may reach the agent before the kernel's TCP
    signal on the same lane (the demo saw TCP first in every run; nothing guarantees it)."""
    p = dataclasses.replace(P, down_on=frozenset({"lane_timeout"}), corroborate_sources=2)
    for kernel in (TcpSuspect("nic0", 1.5), ProbeFail("nic0", 1.5)):
        h = step(initial("nic0", 0.0), LaneTimeout("nic0", 1.0, source="uid 1000 pid 7"), p)
        assert h.state is S.SUSPECT
        h = step(h, kernel, p)
        assert h.state is S.DOWN and "corroborated by" in h.reason, (kernel, h.reason)
    # not when the kernel signal comes after the window
    h = step(initial("nic0", 0.0), LaneTimeout("nic0", 1.0, source="uid 1000 pid 7"), p)
    h = step(h, TcpSuspect("nic0", 1.0 + P.suspect_window_s + 0.1), p)
    assert h.state is not S.DOWN
    # nor for a lane signal outside down_on (it stays suspicion)
    p2 = dataclasses.replace(p, down_on=frozenset())
    h = step(initial("nic0", 0.0), LaneTimeout("nic0", 1.0, source="uid 1000 pid 7"), p2)
    h = step(h, TcpSuspect("nic0", 1.2), p2)
    assert h.state is S.SUSPECT


def test_reports_outside_the_window_do_not_add_up() -> None:
    p = dataclasses.replace(P, down_on=frozenset({"lane_timeout"}), corroborate_sources=2)
    h = step(initial("nic0", 0.0), LaneTimeout("nic0", 1.0, source="a"), p)
    h = step(h, LaneTimeout("nic0", 1.0 + P.suspect_window_s + 0.1, source="b"), p)
    assert h.state is S.SUSPECT


def test_corroborate_one_and_sourceless_signals_keep_the_old_rule() -> None:
    p1 = dataclasses.replace(P, down_on=frozenset({"lane_timeout"}), corroborate_sources=1)
    assert step(initial("nic0", 0.0), LaneTimeout("nic0", 1.0, source="a"), p1).state is S.DOWN
    p2 = dataclasses.replace(P, down_on=frozenset({"lane_timeout"}), corroborate_sources=2)
    assert step(initial("nic0", 0.0), LaneTimeout("nic0", 1.0), p2).state is S.DOWN
    with pytest.raises(HealthError, match="corroborate_sources"):
        HealthParams(corroborate_sources=0)


def test_one_reporters_suspicion_never_corroborates() -> None:
    """Issue 29, 1: a Suspicion made from a lane report (a peer's EREMOTEIO, the burst guard)
    had no source and so counted as the agent's own evidence: LaneTimeout then Suspicion of the
    same process took the NIC DOWN. Now it never corroborates, with any corroborate_sources."""
    for n in (2, 3):
        p = dataclasses.replace(P, down_on=frozenset({"lane_timeout"}), corroborate_sources=n)
        h = step(initial("nic0", 0.0), LaneTimeout("nic0", 1.0, source="a"), p)
        for i in range(5):
            h = step(h, Suspicion("nic0", 1.1 + i / 10, source="a"), p)
            h = step(h, LaneTimeout("nic0", 1.15 + i / 10, source="a"), p)
        assert h.state is S.SUSPECT
        h = step(h, TcpSuspect("nic0", 1.9), p)  # the kernel agrees: DOWN
        assert h.state is S.DOWN


def test_recovery_evidence_needs_several_reporters() -> None:
    """Issue 29, 4: one process's FAILBACK / LANE_UP (ProbeOk with its source) cleared SUSPECT
    and supplied the evidence a blackholed NIC needs. Now ``corroborate_sources`` distinct
    reporters are needed; the agent's own probe (no source) counts alone."""
    p = dataclasses.replace(P, down_on=frozenset({"lane_timeout"}), corroborate_sources=2)
    h = step(initial("nic0", 0.0), LaneTimeout("nic0", 1.0), p)
    assert h.state is S.DOWN and h.need_evidence
    h = tick(h, 1.0 + p.holdoff_initial_s, p)
    assert h.state is S.RECOVERING
    for i in range(5):
        h = step(h, ProbeOk("nic0", 3.0 + i, source="a"), p)
    assert h.state is S.RECOVERING and h.probes_ok == 0
    h = step(h, ProbeOk("nic0", 9.0, source="b"), p)
    h = tick(h, 10.0, p)
    assert h.state is S.UP
    h = step(h, Suspicion("nic0", 11.0, source="a"), p)
    h = step(h, ProbeOk("nic0", 11.1, source="a"), p)
    assert h.state is S.SUSPECT
    h = step(h, ProbeOk("nic0", 11.2), p)
    assert h.state is S.UP
