"""Failover on the emulated fabric (issue 4), through the harness; every byte checked (root).

Each test runs 4 connections (connection c on NIC c % 4 at both ends) over the rate-limited
fabric, injects a fault mid-run and checks that nothing is lost or corrupted (both sides count
the same messages and bytes, zero data and request errors), that the connections on the faulted
NIC resume, and that an unrecoverable fault gives a clean error instead of a hang. The bounds
here are generous (2 shared cores); bench/failover_timeline.py measures the real numbers.
"""

from __future__ import annotations

import os
import re
import time
from dataclasses import dataclass

import pytest

from conftest import fabric_fixture, require, require_built, until
from railhop_lab import soak
from railhop_lab.fabric import CounterSampler, Fabric
from railhop_lab.harness import (
    HarnessConfig,
    HarnessResult,
    HarnessRun,
    bytes_at,
    longest_stall,
    wait_for_bytes,
)

pytestmark = pytest.mark.privileged

MiB = 1 << 20
RATE_MBIT = 200

# Every fault runs over both lane transports: TCP sockets and libfabric (FI_EP_MSG + FI_RMA
# writes with immediate data) through its tcp provider (docs/transports.md).
TRANSPORTS = {
    "tcp": {"RAILHOP_TRANSPORT": "tcp"},
    "ofi": {"RAILHOP_TRANSPORT": "ofi", "FI_PROVIDER": "tcp"},
}
COMPLETION_TIMEOUT_S = 1.0  # RAILHOP_COMPLETION_TIMEOUT default (1000 ms)


@pytest.fixture(scope="module")
def built() -> None:
    require(os.geteuid() == 0, "needs root (netns, veth, tc)")  # module fixtures run first
    require_built()


@pytest.fixture(scope="module", params=sorted(TRANSPORTS))
def lanes(request: pytest.FixtureRequest) -> dict[str, str]:
    """The harness environment selecting the lane transport."""
    return TRANSPORTS[str(request.param)]


fab = fabric_fixture("rhtv", rate_mbit=RATE_MBIT)


def cfg(duration: float, seed: int, **kw: object) -> HarnessConfig:
    base: dict[str, object] = {
        "conns": 4,
        "sizes": (MiB, 4096, 3 * MiB + 5, 0),
        "duration": duration,
        "deadline": duration + 30,
        "seed": seed,
    }
    base.update(kw)
    return HarnessConfig(**base)  # type: ignore[arg-type]


def now_h(run: HarnessRun) -> float:
    """The harness clock (s since the processes started)."""
    return time.monotonic() - run.started_at


def sleep_until_h(run: HarnessRun, t: float) -> None:
    time.sleep(max(0.0, min(t - now_h(run), 60.0)))


def per_conn(run: HarnessRun) -> tuple[int, ...]:
    """The receiver's latest byte count per connection (empty before its first progress line)."""
    prog = run.sides["recv"].progress
    return prog[-1].per_conn if prog else ()


def warm_up(run: HarnessRun) -> None:
    """Wait (bounded) until every connection moves data."""
    wait_for_bytes(run, 16 * MiB, timeout=20)
    until(
        lambda: len(cur := per_conn(run)) == 4 and min(cur) > 0,
        10,
        lambda: f"every connection moves data (now {per_conn(run)})",
    )


def resumed(run: HarnessRun, base: tuple[int, ...], conns: range | list[int]) -> bool:
    """Every connection in ``conns`` moved more than 1 MiB since ``base``."""
    cur = per_conn(run)
    return len(cur) == len(base) and all(cur[c] > base[c] + MiB for c in conns)


def assert_lossless(res: HarnessResult) -> None:
    assert res.ok, res.describe()
    s, r = res.send.summary, res.recv.summary
    assert s is not None and r is not None
    assert s.msgs == r.msgs > 0, res.describe()
    assert s.bytes == r.bytes, res.describe()
    assert r.data_errors == 0 and s.data_errors == 0


def assert_resumed(res: HarnessResult, conn: int, t_fault: float, bound_s: float) -> None:
    prog = res.recv.progress
    before = bytes_at(prog, t_fault, conn)
    assert prog[-1].per_conn[conn] > before + 2 * MiB, (
        f"connection {conn} did not resume after the fault at t={t_fault:.2f}: "
        f"{before} -> {prog[-1].per_conn[conn]}\n{res.describe()}"
    )
    stall = longest_stall(prog, start=t_fault, conn=conn)
    assert stall < bound_s, f"connection {conn} stalled {stall:.2f} s (bound {bound_s} s)"


@dataclass(frozen=True)
class Carrier:
    node: int
    end: str


@pytest.mark.parametrize(
    "where",
    [Carrier(0, "local"), Carrier(1, "local"), Carrier(0, "remote")],
    ids=["local-end", "remote-end", "switch-side-of-local"],
)
def test_carrier_loss(fab: Fabric, lanes: dict[str, str], where: Carrier) -> None:
    with HarnessRun(fab, cfg(6.0, seed=11), env=lanes) as run:
        warm_up(run)
        t_fault = now_h(run)
        fab.carrier_down(where.node, 1, end=where.end)  # type: ignore[arg-type]
        res = run.wait()
    assert_lossless(res)
    assert_resumed(res, conn=1, t_fault=t_fault, bound_s=2.5)
    assert_move_logged(res, "nic1")


# The move's one WARN line (NCCL_ALL: shown under any NCCL_DEBUG_SUBSYS). The side that
# detected the failure logs it (the sender at its first completion after RESUME, the receiver
# when it sends RESUME); whichever side detects first, at least one of them does.
MOVE_LINE = re.compile(
    r"\[ALL\] NET/railhop \S*report_move: conn [0-9a-f]+ \((send|recv)\): failover: (\S+) -> "
    r"peer NIC (\d+) failed \((.+)\); now on (\S+) -> peer NIC \d+, (\d+) ms from detection "
    r"to (the first completion|RESUME sent)"
)


def moved_off(run: HarnessRun, nic: str) -> bool:
    """A running harness logged a failover off ``nic`` (either side)."""
    logs = (run.workdir / f"{role}.stderr" for role in ("send", "recv"))
    return any(
        m.group(2) == nic
        for p in logs
        if p.exists()
        for m in MOVE_LINE.finditer(p.read_text(errors="replace"))
    )


def assert_move_logged(res: HarnessResult, nic: str) -> None:
    moves = [
        m
        for side in (res.send, res.recv)
        for m in MOVE_LINE.finditer(side.stderr_tail)
        if m.group(2) == nic
    ]
    assert moves, f"no failover WARN line for {nic}:\n{res.describe()}"
    for m in moves:
        assert m.group(5) != nic, m.group(0)  # the traffic left the failed NIC
        assert int(m.group(6)) < 30_000, m.group(0)
        assert m.group(4), m.group(0)  # a cause


def test_silent_blackhole(fab: Fabric, lanes: dict[str, str]) -> None:
    with HarnessRun(fab, cfg(7.0, seed=12), env=lanes) as run:
        warm_up(run)
        t_fault = now_h(run)
        fab.blackhole(0, 2)
        res = run.wait()
    assert fab.link_state(0, 2).carrier  # it stayed silent
    assert_lossless(res)
    # detection needs the completion timeout (1 s) plus a probe; target 1.5 s, bound generous
    assert_resumed(res, conn=2, t_fault=t_fault, bound_s=1.5 * COMPLETION_TIMEOUT_S + 2.0)


def test_flap_5hz(fab: Fabric, lanes: dict[str, str]) -> None:
    with HarnessRun(fab, cfg(8.0, seed=13), env=lanes) as run:
        warm_up(run)
        t_fault = now_h(run)
        flapper = fab.flap(0, 3, hz=5, duration=2.5)
        flapper.join(10)
        t_end = now_h(run)
        res = run.wait()
    assert_lossless(res)
    prog = res.recv.progress
    assert prog[-1].per_conn[3] > bytes_at(prog, t_end, 3) + 2 * MiB, res.describe()
    assert longest_stall(prog, start=t_fault, conn=3) < 4.0


def test_two_then_three_of_four_down(fab: Fabric, lanes: dict[str, str]) -> None:
    steps = [
        lambda: fab.carrier_down(0, 1),
        lambda: fab.blackhole(1, 2),
        lambda: fab.carrier_down(0, 3, end="remote"),
    ]
    times = []
    with HarnessRun(fab, cfg(12.0, seed=14), env=lanes) as run:
        warm_up(run)
        for i, step in enumerate(steps):
            times.append(now_h(run))
            base = per_conn(run)
            step()
            # every connection moves again before the next fault (bounded wait)
            until(
                lambda base=base: resumed(run, base, range(4)),
                6,
                f"every connection resumed after fault {i + 1}",
            )
        res = run.wait()
    assert_lossless(res)
    prog = res.recv.progress
    for conn in range(4):  # all four ride on the last pair (rail 0) at the end
        assert prog[-1].per_conn[conn] > bytes_at(prog, times[-1], conn) + MiB


@pytest.mark.parametrize("fault", ["carrier", "blackhole"])
def test_all_nics_down_is_a_clean_error(fab: Fabric, lanes: dict[str, str], fault: str) -> None:
    c = cfg(30.0, seed=15, expect_error=True, deadline=40.0)
    with HarnessRun(fab, c, grace_s=5, env=lanes) as run:
        warm_up(run)
        t_fault = now_h(run)
        for nic in range(4):
            if fault == "carrier":
                fab.carrier_down(1, nic)
            else:
                fab.blackhole(1, nic)
        # no hang: both sides must be done well within the harness's own deadline
        res = run.wait(timeout=t_fault + 2 * COMPLETION_TIMEOUT_S + 8.0)
    for side in (res.send, res.recv):
        assert not side.timed_out, res.describe()
        assert side.returncode == 0, res.describe()  # --expect-error: clean error, no data error
        s = side.summary
        assert s is not None and s.data_errors == 0, res.describe()
        assert s.first_error is not None and s.first_error.clean, res.describe()
    # the error reaches the sender within 2x the completion timeout (+ scheduling slack)
    fe = res.send.summary.first_error if res.send.summary else None
    assert fe is not None
    assert fe.t - t_fault <= 2 * COMPLETION_TIMEOUT_S + 0.5, res.describe()


FAIL_BACK_S = 2.0  # back on the original pair within 2 s of the heal (fail-back interval 1 s)
RATE_WINDOW_S = 1.0  # NIC rates over the last second


def test_heal_and_fail_back(fab: Fabric, lanes: dict[str, str]) -> None:
    with HarnessRun(fab, cfg(9.0, seed=16), env=lanes) as run, CounterSampler(fab) as samp:
        warm_up(run)
        fab.carrier_down(0, 1)
        # the failover happened: the move's WARN line for nic1 (sender or receiver)
        until(lambda: moved_off(run, "nic1"), 2.5, "the failover off nic1 logged")
        t_heal = time.monotonic()
        fab.heal(0, 1)
        shares: list[tuple[float, list[float]]] = []

        def nic1_carries_its_share() -> bool:
            # over a second that began after the heal: NIC 1 carries at least half the mean
            # of the others (which carry data)
            t1 = time.monotonic()
            t0 = t1 - RATE_WINDOW_S
            if t0 < t_heal:
                return False
            mine = samp.rate(0, 1, t0, t1)
            others = [samp.rate(0, i, t0, t1) for i in (0, 2, 3)]
            shares.append((mine, others))
            return min(others) > 0 and mine >= 0.5 * (sum(others) / 3)

        # the rate over the window lags the move by up to that window, so the bound is the
        # promise plus one window (and a sample interval)
        until(
            nic1_carries_its_share,
            FAIL_BACK_S + RATE_WINDOW_S + 0.5,
            lambda: f"NIC 1 carries its share again after the heal (last rates {shares[-1:]})",
            poll=0.1,
        )
        print(f"fail-back: NIC 1 back at its share {time.monotonic() - t_heal:.2f} s after heal")
        res = run.wait()
    assert_lossless(res)


def test_soak_plan_keeps_a_rail() -> None:
    for seed in range(20):
        plan = soak.soak_plan(seed, 45.0)
        assert plan and plan[-1][0] < 45.0
        rails = {nic for _, action, _, nic in plan if action != "heal"}
        assert len(rails) <= 3
        assert soak.kept_rail(plan) == set(range(4)) - rails != set()


# Seeds that once exposed a bug run on every CI run; one more seed comes from the clock (printed,
# and in the failure message) so each run also explores; RAILHOP_SOAK_SEEDS=a,b replaces the list.
SOAK_SEEDS = [
    30855,  # sender gave up ("no compatible NIC pair left") while rail 3 stayed healthy
]


def soak_seeds() -> list[int | None]:
    env = os.environ.get("RAILHOP_SOAK_SEEDS")
    if env:
        return [int(x) for x in env.split(",") if x.strip()]
    return [*SOAK_SEEDS, None]


@pytest.mark.parametrize("seed_opt", soak_seeds(), ids=lambda s: "clock" if s is None else str(s))
def test_randomized_fault_soak(fab: Fabric, lanes: dict[str, str], seed_opt: int | None) -> None:
    seed = int(time.time()) % 100000 if seed_opt is None else seed_opt
    print(f"soak seed {seed}")
    duration = 45.0
    plan = soak.soak_plan(seed, duration)
    applied = []
    with HarnessRun(fab, cfg(duration, seed=seed, deadline=duration + 20), env=lanes) as run:
        warm_up(run)
        t_base = now_h(run)
        for t, action, node, nic in plan:
            sleep_until_h(run, t_base + t)
            soak.apply(fab, action, node, nic)
            applied.append((round(now_h(run), 2), action, node, nic))
        fab.heal_all()
        res = run.wait()
    try:
        assert_lossless(res)
    except AssertionError as e:
        raise AssertionError(f"soak seed={seed} faults={applied}: {e}") from None
    assert len(applied) >= 10, applied


@pytest.mark.parametrize("peer_role", ["send", "recv"])
def test_escalation_latency_at_the_peer(fab: Fabric, lanes: dict[str, str], peer_role: str) -> None:
    """All NICs of node 1 lose carrier; the process on node 0 (its NICs stay up) must report a
    clean error within 2x the completion timeout: timeout -> confirming probe -> probes of
    every candidate pair in parallel -> error (aim: <= 1.6 s)."""
    c = cfg(30.0, seed=17, expect_error=True, deadline=40.0)
    send_node, recv_node = (0, 1) if peer_role == "send" else (1, 0)
    with HarnessRun(fab, c, grace_s=5, send_node=send_node, recv_node=recv_node, env=lanes) as run:
        warm_up(run)
        t_fault = now_h(run)
        for nic in range(4):
            fab.carrier_down(1, nic)
        res = run.wait(timeout=t_fault + 2 * COMPLETION_TIMEOUT_S + 8.0)
    side = res.send if peer_role == "send" else res.recv
    assert not side.timed_out and side.returncode == 0, res.describe()
    s = side.summary
    assert s is not None and s.data_errors == 0 and s.first_error is not None, res.describe()
    assert s.first_error.clean, res.describe()
    latency = s.first_error.t - t_fault
    print(f"escalation at the peer ({peer_role}): {latency:.3f} s after the fault")
    assert latency <= 2 * COMPLETION_TIMEOUT_S, res.describe()
