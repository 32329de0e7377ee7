"""The emulated fabric: connectivity, source routing, rate limits, faults, clean-up (root)."""

from __future__ import annotations

import itertools
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from pyroute2 import NetNS, netns

from conftest import fabric_fixture
from railhop_lab.fabric import Fabric, FabricError, FaultKind, owns_netns, unique_prefix

pytestmark = pytest.mark.privileged

# After a heal the sender's neighbour entry for the peer may have gone FAILED while the link was
# down; the kernel re-resolves it with ARP probes 1 s apart, so a first probe lost to the port
# coming back costs a second. Connectivity must come back, within a few seconds.
HEALED_TIMEOUT = 3.0

LAB_DIR = str(Path(__file__).resolve().parents[2] / "lab")


def wait_until(cond: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.01)


def our_netns(prefix: str) -> list[str]:
    return sorted(n for n in netns.listnetns() if owns_netns(prefix, n))


fab = fabric_fixture("rhtf", rate_mbit=100, plugin=False)


def test_connectivity_every_pair(fab: Fabric) -> None:
    for i in range(4):
        for j in range(4):
            assert fab.tcp_check((0, i), (1, j)) == "ok", (i, j)
    assert fab.tcp_check((1, 2), (0, 1)) == "ok"
    assert fab.tcp_check((0, 1), (0, 1)) == "ok"  # same host, same NIC (loopback)


def test_source_routing_uses_the_source_nic(fab: Fabric) -> None:
    nbytes = 4 << 20
    for src, dst in (((0, 1), (1, 3)), ((0, 3), (1, 0)), ((1, 2), (0, 2))):
        before = fab.counters()
        assert fab.tcp_check(src, dst, timeout=5.0, nbytes=nbytes) == "ok"
        after = fab.counters()
        tx = {i: after[(src[0], i)].tx_bytes - before[(src[0], i)].tx_bytes for i in range(4)}
        rx = {j: after[(dst[0], j)].rx_bytes - before[(dst[0], j)].rx_bytes for j in range(4)}
        assert tx[src[1]] >= nbytes, (src, dst, tx)
        assert rx[dst[1]] >= nbytes, (src, dst, rx)
        for i in range(4):
            if i != src[1]:
                assert tx[i] < nbytes // 100, (src, dst, tx)
            if i != dst[1]:
                assert rx[i] < nbytes // 100, (src, dst, rx)


def _stream_rate(fab: Fabric, src: tuple[int, int], dst: tuple[int, int], seconds: float) -> float:
    """Bytes/s a single TCP stream gets from NIC src to NIC dst, from the receiver's counter."""
    srv = fab.socket(dst[0])
    cli = fab.socket(src[0])
    stop = threading.Event()
    got = [0]

    def drain(conn: socket.socket) -> None:
        with conn:
            conn.settimeout(seconds + 5)
            while True:
                b = conn.recv(1 << 20)
                if not b:
                    return
                got[0] += len(b)

    try:
        srv.bind((fab.address(*dst), 0))
        srv.listen(1)
        srv.settimeout(5)
        cli.setsockopt(socket.SOL_SOCKET, socket.SO_BINDTODEVICE, fab.ifname(src[1]).encode())
        cli.bind((fab.address(*src), 0))
        cli.settimeout(5)
        cli.connect(srv.getsockname())
        conn, _ = srv.accept()
        th = threading.Thread(target=drain, args=(conn,), daemon=True)
        th.start()
        buf = b"\x5a" * (1 << 18)
        timer = threading.Timer(seconds + 0.5, stop.set)
        timer.start()
        cli.sendall(buf * 4)  # warm-up, not counted
        t0 = time.monotonic()
        c0 = fab.nic_bytes(*dst).rx_bytes
        while time.monotonic() - t0 < seconds:
            cli.sendall(buf)
        c1 = fab.nic_bytes(*dst).rx_bytes
        dt = time.monotonic() - t0
        timer.cancel()
        cli.shutdown(socket.SHUT_WR)
        th.join(seconds + 5)
        return (c1 - c0) / dt
    finally:
        cli.close()
        srv.close()


@pytest.mark.parametrize("direction", ["node0->node1", "node1->node0"])
def test_tbf_limits_each_nic(fab: Fabric, direction: str) -> None:
    src, dst = ((0, 2), (1, 2)) if direction == "node0->node1" else ((1, 2), (0, 2))
    rate = _stream_rate(fab, src, dst, seconds=1.5)
    limit = 100e6 / 8
    # wire bytes include headers; the ceiling holds within a few percent, and one stream fills it
    assert 0.80 * limit <= rate <= 1.06 * limit, f"{rate * 8 / 1e6:.1f} Mbit/s vs 100"


def _tbf_limits(fab: Fabric, node: int, nic: int) -> tuple[int, int]:
    """The tbf queue limits (bytes) of the node's NIC and of its switch-side peer."""
    out = []
    for ns, ifname in (
        (fab.netns(node), fab.ifname(nic)),
        (fab.spine_netns, fab.plan.nic(node, nic).peer),
    ):
        with NetNS(ns) as nl:
            idx = nl.link_lookup(ifname=ifname)[0]
            (q,) = [q for q in nl.get_qdiscs(index=idx) if q.get_attr("TCA_KIND") == "tbf"]
            out.append(q.get_attr("TCA_OPTIONS").get_attr("TCA_TBF_PARMS")["limit"])
    return out[0], out[1]


SO_SNDBUFFORCE = 32  # <asm-generic/socket.h>; Python's socket module does not name it


def _udp_send(
    fab: Fabric, nic: int, more: Callable[[int], bool], port: int = 0, sndbuf: int = 1 << 20
) -> None:
    """1400-byte datagrams from node 0's ``port`` to node 1 on one NIC, as fast as the socket
    takes them, while ``more(sent so far)``."""
    s = fab.socket(0, type=socket.SOCK_DGRAM)
    try:
        s.setsockopt(socket.SOL_SOCKET, SO_SNDBUFFORCE, sndbuf)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_BINDTODEVICE, fab.ifname(nic).encode())
        s.bind((fab.address(0, nic), port))
        payload = b"\x5a" * 1400
        sent = 0
        while more(sent):
            s.sendto(payload, (fab.address(1, nic), 9))  # discard port: nobody listens
            sent += 1
    finally:
        s.close()


def _udp_burst(fab: Fabric, nic: int, count: int) -> None:
    """``count`` datagrams (1 MiB of send buffer: more than a shallow queue holds, less than a
    deep one)."""
    _udp_send(fab, nic, lambda sent: sent < count)


def _drops(fab: Fabric) -> list[int]:
    return [q.drops for q in fab.host_queues(0)]


def test_host_queue_depth_and_its_drops(fab: Fabric) -> None:
    rate_bytes = 100_000_000 // 8
    try:
        fab.set_rate(100, queue_ms=2, host_queue_ms=200)
        host, spine = _tbf_limits(fab, 0, 2)
        # each queue holds its latency's worth at the rate beyond the burst
        assert host - spine == pytest.approx(rate_bytes * 198 // 1000, rel=0.02)
        assert fab.host_queue_ms == 200 and fab.queue_ms == 2
        before = _drops(fab)
        _udp_burst(fab, 2, 600)  # ~850 KB: fits the 200 ms host queue (2.6 MB)
        assert _drops(fab) == before
        # the host queue as shallow as the switch's, at 10 Mbit/s: ~130 KB that drain at
        # 1.25 KB/ms, so even a slow sender overflows it
        fab.set_rate(10, queue_ms=2)
        host, spine = _tbf_limits(fab, 0, 2)
        assert host == spine
        before = _drops(fab)
        _udp_burst(fab, 2, 600)  # ~850 KB: the host drops its own packets
        after = _drops(fab)
        assert after[2] > before[2]
        assert [a for i, a in enumerate(after) if i != 2] == [
            b for i, b in enumerate(before) if i != 2
        ]
    finally:
        fab.set_rate(100)
    with pytest.raises(FabricError):
        fab.host_queues(5)


def _flood(fab: Fabric, nic: int, port: int, stop: threading.Event) -> None:
    """Datagrams from node 0's ``port`` until ``stop``: faster than 100 Mbit/s, so the NIC's
    queue for this flow stays full."""
    _udp_send(fab, nic, lambda _: not stop.is_set(), port, 4 << 20)


def _connect_and_echo_ms(fab: Fabric, nic: int, port: int) -> float:
    """ms for a new TCP connection from node 0's ``port`` on ``nic`` to connect and get one byte
    echoed (its SYN and its data wait in node 0's NIC queue)."""
    srv = fab.socket(1)
    cli = fab.socket(0)

    def echo() -> None:
        conn, _ = srv.accept()
        with conn:
            conn.sendall(conn.recv(1))

    try:
        srv.bind((fab.address(1, nic), 0))
        srv.listen(1)
        srv.settimeout(5)
        th = threading.Thread(target=echo, daemon=True)
        th.start()
        cli.bind((fab.address(0, nic), port))
        cli.settimeout(5)
        t0 = time.monotonic()
        cli.connect(srv.getsockname())
        cli.sendall(b"a")
        assert cli.recv(1) == b"a"
        ms = (time.monotonic() - t0) * 1e3
        th.join(5)
        return ms
    finally:
        cli.close()
        srv.close()


@pytest.mark.parametrize("kind", ["fifo", "flows"])
def test_a_new_flow_behind_a_full_host_queue(fab: Fabric, kind: str) -> None:
    """One queue per NIC (``fifo``): a new connection waits behind what another flow filled it
    with, twice (SYN, then data) ~100 ms. A queue per flow (``flows``, as a real host's
    fq_codel): it does not wait; and the NIC's ceiling still holds for all flows together."""
    stop = threading.Event()
    th = threading.Thread(target=_flood, args=(fab, 2, 40000, stop), daemon=True)
    try:
        fab.set_rate(100, queue_ms=2, host_queue_ms=100, host_qdisc=kind)
        assert fab.host_qdisc == kind
        th.start()
        # the flood's own queue holds ~100 ms at 100 Mbit/s (1.25 MB) once full
        wait_until(lambda: fab.host_queues(0)[2].backlog > 900_000, 5.0, "the queue to fill")
        ms = [_connect_and_echo_ms(fab, 2, 40002 + 2 * i) for i in range(3)]
        if kind == "fifo":
            assert min(ms) > 150, ms
        else:
            assert max(ms) < 50, ms
        stop.set()
        th.join(5)
        rate = _stream_rate(fab, (0, 2), (1, 2), seconds=1.0)
        assert 0.80 * 100e6 / 8 <= rate <= 1.06 * 100e6 / 8, f"{rate * 8 / 1e6:.1f} Mbit/s"
    finally:
        stop.set()
        if th.is_alive():
            th.join(5)
        fab.set_rate(100, host_qdisc="fifo")
    assert fab.host_qdisc == "fifo"
    with pytest.raises(FabricError):
        fab.set_rate(100, host_qdisc="fq")


def test_carrier_down_local(fab: Fabric) -> None:
    fab.carrier_down(0, 1, end="local")
    st = fab.link_state(0, 1)
    assert not st.admin_up and not st.carrier and not st.peer_carrier
    assert fab.tcp_check((0, 1), (1, 1), timeout=0.5) in ("ENETUNREACH", "ENETDOWN")
    assert fab.tcp_check((0, 0), (1, 0)) == "ok"
    assert fab.faults() == {(0, 1): frozenset({FaultKind.CARRIER_LOCAL})}
    fab.heal(0, 1)
    assert fab.tcp_check((0, 1), (1, 1), timeout=HEALED_TIMEOUT) == "ok"
    assert fab.faults() == {}


def test_carrier_down_remote(fab: Fabric) -> None:
    fab.carrier_down(1, 2, end="remote")
    st = fab.link_state(1, 2)
    assert st.admin_up and not st.carrier and not st.peer_admin_up
    assert fab.tcp_check((1, 2), (0, 2), timeout=0.5) != "ok"
    assert fab.tcp_check((0, 2), (1, 2), timeout=0.5) != "ok"
    assert fab.tcp_check((1, 3), (0, 2)) == "ok"
    fab.heal(1, 2)
    assert fab.tcp_check((0, 2), (1, 2), timeout=HEALED_TIMEOUT) == "ok"


def test_blackhole_is_silent_and_total(fab: Fabric) -> None:
    before = fab.counters()
    fab.blackhole(0, 3)
    st = fab.link_state(0, 3)
    assert st.admin_up and st.carrier and st.peer_carrier and st.operstate == "UP"
    assert not st.forwarding
    # silent: no refusal, no unreachable error, just nothing; total: both ways, every rail
    assert fab.tcp_check((0, 3), (1, 3), timeout=0.5) == "timeout"
    assert fab.tcp_check((1, 3), (0, 3), timeout=0.5) == "timeout"
    assert fab.tcp_check((0, 3), (1, 1), timeout=0.5) == "timeout"
    assert fab.tcp_check((1, 0), (0, 3), timeout=0.5) == "timeout"
    assert fab.tcp_check((0, 2), (1, 2)) == "ok"
    after = fab.counters()
    # the node kept transmitting (SYN retries) while nothing came back on that NIC
    assert after[(0, 3)].tx_packets > before[(0, 3)].tx_packets
    assert after[(0, 3)].rx_packets == before[(0, 3)].rx_packets
    assert fab.link_state(0, 3).carrier  # still up at the end
    fab.heal(0, 3)
    assert fab.link_state(0, 3).forwarding
    assert fab.tcp_check((0, 3), (1, 3)) == "ok"


def test_flap_toggles_and_ends_by_itself(fab: Fabric) -> None:
    seen: list[bool] = []
    th = fab.flap(0, 0, hz=5, duration=1.2)
    t_end = time.monotonic() + 1.6
    while time.monotonic() < t_end:
        seen.append(fab.link_state(0, 0).admin_up)
        time.sleep(0.02)
    transitions = sum(1 for a, b in itertools.pairwise(seen) if a != b)
    assert transitions >= 6, f"saw {transitions} carrier transitions at 5 Hz over 1.2 s"
    th.join(3.0)
    assert not th.is_alive()
    wait_until(lambda: fab.link_state(0, 0).operstate == "UP", 3.0, "nic0 up after the flap")
    assert fab.tcp_check((0, 0), (1, 0), timeout=3.0) == "ok"


def test_heal_stops_a_flap_early(fab: Fabric) -> None:
    th = fab.flap(1, 1, hz=5, duration=30, end="remote")
    time.sleep(0.25)
    t0 = time.monotonic()
    fab.heal(1, 1)
    assert time.monotonic() - t0 < 3.0
    assert not th.is_alive()
    assert fab.tcp_check((1, 1), (0, 1), timeout=3.0) == "ok"


def test_several_faults_then_heal_all(fab: Fabric) -> None:
    fab.carrier_down(0, 0)
    fab.carrier_down(1, 1, end="remote")
    fab.blackhole(0, 2)
    assert set(fab.faults()) == {(0, 0), (1, 1), (0, 2)}
    fab.heal_all()
    assert fab.faults() == {}
    for i in range(4):
        assert fab.tcp_check((0, i), (1, i), timeout=3.0) == "ok"


def test_popen_runs_inside_the_node(fab: Fabric) -> None:
    out = fab.run(1, ["cat", "/proc/net/dev"], timeout=10).stdout
    assert all(f"nic{i}:" in out for i in range(4))
    ls = fab.run(1, ["ls", "/sys/class/net"], timeout=10).stdout.split()
    assert sorted(ls) == ["lo", "nic0", "nic1", "nic2", "nic3"]
    with pytest.raises(FabricError):
        fab.run(0, ["sleep", "30"], timeout=0.3)


def test_bad_arguments(fab: Fabric) -> None:
    with pytest.raises(FabricError):
        fab.carrier_down(0, 9)
    with pytest.raises(FabricError):
        fab.flap(0, 0, hz=0, duration=1)
    with pytest.raises(FabricError):
        Fabric(prefix=fab.prefix).up()  # a live owner holds the prefix


def test_two_fabrics_side_by_side_and_cleanup() -> None:
    p1, p2 = unique_prefix("rhtf"), unique_prefix("rhtf")
    with Fabric(nodes=2, nics=2, prefix=p1) as a, Fabric(nodes=3, nics=1, prefix=p2) as b:
        assert a.tcp_check((0, 1), (1, 1)) == "ok"
        assert b.tcp_check((2, 0), (0, 0)) == "ok"
        proc = a.popen(0, ["sleep", "60"])
        assert len(our_netns(p1)) == 3 and len(our_netns(p2)) == 4
    assert our_netns(p1) == [] and our_netns(p2) == []
    assert proc.poll() is not None  # killed on close
    assert not Path(f"/run/railhop-fabric/{p1}.pid").exists()


SCRIPT = """
import sys, time
sys.path.insert(0, {lab!r})
from railhop_lab.fabric import Fabric
f = Fabric(nodes=2, nics=2, prefix={prefix!r})
f.up()
print("up", flush=True)
time.sleep(120)
"""


def sigint_default() -> None:
    """A child's SIGINT as at a terminal: a runner started in the background by a shell (``cmd
    &``) ignores SIGINT, its children inherit that, and Python then installs no
    KeyboardInterrupt handler, so the signal under test would never arrive."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _child_with_fabric(prefix: str) -> subprocess.Popen[str]:
    proc = subprocess.Popen(
        [sys.executable, "-c", SCRIPT.format(lab=LAB_DIR, prefix=prefix)],
        stdout=subprocess.PIPE,
        text=True,
        preexec_fn=sigint_default,  # noqa: PLW1509 (only resets one signal)
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()  # bounded: the child sleeps at most 60 s
    assert line.strip() == "up", line
    assert len(our_netns(prefix)) == 3
    return proc


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP])
def test_signal_cleans_up(sig: int) -> None:
    prefix = unique_prefix("rhtf")
    proc = _child_with_fabric(prefix)
    proc.send_signal(sig)
    proc.wait(60)
    assert our_netns(prefix) == []


def test_stale_objects_of_a_killed_run_are_removed() -> None:
    prefix = unique_prefix("rhtf")
    proc = _child_with_fabric(prefix)
    proc.kill()  # SIGKILL: no handler runs
    proc.wait(60)
    assert len(our_netns(prefix)) == 3
    with Fabric(nodes=2, nics=1, prefix=unique_prefix("rhtf")):
        # any new fabric removes the leftovers of owners that are gone
        assert our_netns(prefix) == []
    with Fabric(nodes=1, nics=1, prefix=prefix) as f:  # and the prefix is usable again
        assert sorted(our_netns(prefix)) == sorted([f.netns(0), f.spine_netns])
    assert os.path.exists("/var/run/netns")
