"""TCP trouble signals only for registered lane ports.

Two netns (``cli``, ``srv``) joined by a veth pair; two TCP connections cli -> srv, one
registered as a lane (its client port), one not. A tc filter dropping everything at the server's
ingress blackholes both silently (carrier stays up). Both connections retransmit (checked with
TCP_INFO), the eBPF source reports retransmits/loss for the lane only. After the blackhole is
lifted every byte sent arrives intact.
"""

from __future__ import annotations

import asyncio
import errno
import os
import socket
import struct
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import pytest

from conftest import require
from railhop.sources import kernel
from railhop.sources.base import queue_emitter
from railhop.sources.ebpf.tcp import TcpLaneSource
from railhop.sources.events import Event, TcpSuspect

BPF_SRC = Path(__file__).resolve().parents[2] / "bpf"  # test helpers live in the source tree

pytestmark = pytest.mark.privileged

T = TypeVar("T")
PAYLOAD = 64 * 1024
TCPI_TOTAL_RETRANS = 100  # offsetof(struct tcp_info, tcpi_total_retrans)


@dataclass(frozen=True)
class Pair:
    cli: str
    srv: str
    cif: str
    sif: str
    caddr: str = "10.213.0.1"
    saddr: str = "10.213.0.2"


def in_netns(ns: str, fn: Callable[[], T]) -> T:
    """Run ``fn`` in a short-lived thread switched into netns ``ns`` (sockets stay there)."""
    from pyroute2 import netns

    out: list[T] = []
    err: list[BaseException] = []

    def run() -> None:
        try:
            netns.setns(ns)
            out.append(fn())
        except BaseException as e:
            err.append(e)

    th = threading.Thread(target=run)
    th.start()
    th.join(10)
    if err:
        raise err[0]
    assert out, f"in_netns({ns}) timed out"
    return out[0]


@pytest.fixture
def pair() -> Iterator[Pair]:
    from pyroute2 import IPRoute, netns

    tag = os.getpid() % 100000
    p = Pair(f"rhtc{tag}", f"rhts{tag}", f"rhtc{tag}", f"rhts{tag}")
    for ns in (p.cli, p.srv):
        if ns in netns.listnetns():
            netns.remove(ns)
        netns.create(ns)
    try:
        with IPRoute() as ipr:
            ipr.link("add", ifname=p.cif, kind="veth", peer={"ifname": p.sif, "net_ns_fd": p.srv})
            ipr.link("set", index=ipr.link_lookup(ifname=p.cif)[0], net_ns_fd=p.cli)
        for ns, ifn, addr in ((p.cli, p.cif, p.caddr), (p.srv, p.sif, p.saddr)):
            with IPRoute(netns=ns) as ip:
                i = ip.link_lookup(ifname=ifn)[0]
                ip.addr("add", index=i, address=addr, prefixlen=24)
                ip.link("set", index=i, state="up")
                lo = ip.link_lookup(ifname="lo")[0]
                ip.link("set", index=lo, state="up")
        yield p
    finally:
        for ns in (p.cli, p.srv):
            if ns in netns.listnetns():
                netns.remove(ns)


def total_retrans(s: socket.socket) -> int:
    info = s.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 104)
    return int(struct.unpack_from("<I", info, TCPI_TOTAL_RETRANS)[0])


class Blackhole:
    """Silent drop of everything the client sends, at the server NIC's ingress (the client's
    transmissions succeed locally, as with a dead switch port): a clsact ingress filter running
    bpf/blackhole.bpf.c (this kernel has neither netem nor gact)."""

    def __init__(self, p: Pair) -> None:
        from bcc import BPF

        self.p = p
        self.bpf = BPF(src_file=str(BPF_SRC / "blackhole.bpf.c").encode())  # not installed
        self.fn = self.bpf.load_func(b"rh_blackhole", BPF.SCHED_CLS)

    def set(self, on: bool) -> None:
        from pyroute2 import IPRoute

        with IPRoute(netns=self.p.srv) as ip:
            i = ip.link_lookup(ifname=self.p.sif)[0]
            if on:
                ip.tc("add", "clsact", index=i)
                ip.tc(
                    "add-filter",
                    "bpf",
                    index=i,
                    handle=":1",
                    fd=self.fn.fd,
                    name=self.fn.name,
                    parent="ffff:fff2",
                    classid=1,
                    direct_action=True,
                )
            else:
                ip.tc("del", "clsact", index=i)

    def close(self) -> None:
        self.bpf.cleanup()


def recv_exact(s: socket.socket, n: int, deadline_s: float) -> bytes:
    s.settimeout(deadline_s)
    buf = bytearray()
    end = time.monotonic() + deadline_s
    while len(buf) < n:
        s.settimeout(max(end - time.monotonic(), 0.01))
        chunk = s.recv(n - len(buf))
        if not chunk:
            break
        buf += chunk
    return bytes(buf)


async def _run(p: Pair, allow: frozenset[str] | None) -> None:
    lsock = in_netns(p.srv, lambda: socket.create_server((p.saddr, 0), backlog=4))
    sport = lsock.getsockname()[1]
    lane = in_netns(p.cli, lambda: socket.create_connection((p.saddr, sport), timeout=5))
    lane_srv, _ = lsock.accept()
    other = in_netns(p.cli, lambda: socket.create_connection((p.saddr, sport), timeout=5))
    other_srv, _ = lsock.accept()
    doomed = in_netns(p.cli, lambda: socket.create_connection((p.saddr, sport), timeout=5))
    doomed_srv, _ = lsock.accept()
    # gives up after 800 ms without acks -> ETIMEDOUT reported on the socket (sk_error hook)
    doomed.setsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT, 800)
    lane_port = lane.getsockname()[1]
    other_port = other.getsockname()[1]
    doomed_port = doomed.getsockname()[1]

    q: asyncio.Queue[Event] = asyncio.Queue()
    src = TcpLaneSource(allow=allow, netns=p.cli)
    cli_ino = kernel.netns_inode(p.cli)
    src.add_port(lane_port)
    src.add_port(doomed_port)
    caps = await src.start(queue_emitter(asyncio.get_running_loop(), q))
    try:
        require(all(c.attached for c in caps), f"not attached: {[c.line() for c in caps]}")
        data_lane = os.urandom(PAYLOAD)
        data_other = os.urandom(PAYLOAD)
        bh = Blackhole(p)
        await asyncio.to_thread(bh.set, True)
        t_bh = time.monotonic_ns()
        lane.sendall(data_lane)
        other.sendall(data_other)
        doomed.sendall(b"doomed")

        events: list[TcpSuspect] = []
        other_seen_at: int | None = None
        end = time.monotonic() + 20
        # done once the unregistered socket has retransmitted AND a lane event stamped after
        # that arrived (the ring buffer is ordered, so anything about `other` would be in),
        # and the doomed socket's timeout was reported
        while time.monotonic() < end:
            if other_seen_at is None and total_retrans(other) > 0:
                other_seen_at = time.monotonic_ns()
            timed_out = any(e.reason == "error" and e.sport == doomed_port for e in events)
            if other_seen_at and timed_out and any(e.ts_ns > other_seen_at for e in events):
                break
            try:
                ev = await asyncio.wait_for(q.get(), 0.1)
            except TimeoutError:
                continue
            assert isinstance(ev, TcpSuspect), ev
            events.append(ev)
        assert other_seen_at is not None, "the unregistered connection never retransmitted"
        assert events, "no TCP signal for the blackholed lane"
        bad = [e for e in events if e.sport not in (lane_port, doomed_port)]
        assert not bad, f"signals for unregistered sockets: {bad}"
        errs = [e for e in events if e.reason == "error"]
        assert [(e.sport, e.value) for e in errs] == [(doomed_port, errno.ETIMEDOUT)], errs
        retrans = [e for e in events if e.reason == "retransmit" and e.sport == lane_port]
        assert retrans, events
        first = retrans[0]
        assert (first.sport, first.dport) == (lane_port, sport)
        assert (first.saddr, first.daddr) == (p.caddr, p.saddr)
        assert first.ts_ns > t_bh
        assert {e.netns_ino for e in events} == ({0} if first.hook == "tp" else {cli_ino})
        print(
            f"\nfirst lane retransmit signal {(first.ts_ns - t_bh) / 1e6:.1f} ms after the "
            f"blackhole; {len(events)} signals "
            f"({sorted({e.reason for e in events})}), 0 for port {other_port}; ETIMEDOUT "
            f"{(errs[0].ts_ns - t_bh) / 1e6:.0f} ms after the blackhole"
        )
        await asyncio.to_thread(bh.set, False)
        bh.close()
        got_lane = await asyncio.to_thread(recv_exact, lane_srv, PAYLOAD, 30)
        got_other = await asyncio.to_thread(recv_exact, other_srv, PAYLOAD, 30)
        assert got_lane == data_lane
        assert got_other == data_other
    finally:
        await src.stop()
        for s in (lane, other, doomed, lane_srv, other_srv, doomed_srv, lsock):
            s.close()


@pytest.mark.parametrize("allow", [None, frozenset({"tp"})], ids=["best", "tracepoint"])
def test_tcp_signals_only_for_registered_lane_ports(
    pair: Pair, allow: frozenset[str] | None
) -> None:
    asyncio.run(_run(pair, allow))
