"""An emulated multi-rail fabric built from network namespaces (tests, the demo, benchmarks).

Layout::

    netns <prefix>n0            netns <prefix>sp                 netns <prefix>n1
    nic0 10.77.0.1 ─ veth ─ n0nic0 ┐                    ┌ n1nic0 ─ veth ─ nic0 10.77.0.2
    nic1 10.77.1.1 ─ veth ─ n0nic1 ├── bridge "spine" ──┤ n1nic1 ─ veth ─ nic1 10.77.1.2
    ...                            ┘                    └ ...

Every NIC has its own rail subnet 10.77.<nic>.0/24 (node n owns .n+1) and its own routing table
selected by a source rule (``from <addr> lookup 100+<nic>``), so traffic sourced from a NIC's
address leaves through that NIC even towards another rail. ``arp_ignore=1``/``arp_announce=2``
make each address answer ARP on its own NIC only. An optional ``tbf`` qdisc on both veth ends
gives every NIC a real bandwidth ceiling in both directions; the node-side one is the host's own
NIC queue (its depth can differ from the switch side's, and :meth:`Fabric.host_queues` reports
what waits in it and what it dropped). That queue is one FIFO (``host_qdisc="fifo"``) or a queue
per flow under the same ceiling (``"flows"``: htb buckets chosen by u32 from the source port
under the tbf, standing in for a real host's fq_codel on kernels without per-flow qdiscs).

Faults (all reversible with :meth:`Fabric.heal`):

* carrier loss, local end: the node-side veth is set down (the node sees its NIC go down);
* carrier loss, remote end: the spine-side peer is set down (the node's NIC loses carrier, as when
  the switch port or cable fails);
* silent blackhole: the spine port is put in the bridge ``listening`` state; carrier stays up on
  both ends and every frame to or from the NIC is dropped without any error;
* flap: a bounded background thread toggles the carrier at ``hz`` for ``duration`` seconds.

Only pyroute2 is used (no ``ip``/``tc`` binaries). Namespaces are named from a prefix; a fabric
removes objects left behind by a crashed run with the same prefix, or by any run whose owning
process is gone, and cleans up on ``__exit__``, at interpreter exit and on SIGTERM/SIGHUP.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import ctypes.util
import errno
import functools
import itertools
import os
import re
import signal
import socket
import struct
import subprocess
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from types import FrameType, TracebackType
from typing import Any, Literal, TypeVar

from pyroute2 import NetNS, netns

from railhop.procs import pid_alive

NETNS_DIR = Path("/var/run/netns")
STATE_DIR = Path("/run/railhop-fabric")
RAIL_NET = "10.77"
TABLE_BASE = 100
RULE_PRIO_BASE = 1000
BRIDGE = "spine"
BR_STATE_FORWARDING = 3
# A port in "listening" drops every frame both ways (only "learning"/"forwarding" pass frames) and,
# with STP off, nothing moves it out of that state while its carrier stays up ("blocking" would be
# turned back into "forwarding" at once by the bridge's port state selection).
BR_STATE_LISTENING = 1

_CLONE_NEWNET = 0x40000000
_CLONE_NEWNS = 0x00020000
_MS_REC = 0x4000
_MS_SLAVE = 1 << 19

_PREFIX_RE = re.compile(r"^[a-z][a-z0-9]{0,11}$")

End = Literal["local", "remote"]
T = TypeVar("T")


class FabricError(Exception):
    """Base error of the emulated fabric."""


# ---------------------------------------------------------------------------------------------
# Pure description of a fabric: names, addresses, tables. No I/O.


@dataclass(frozen=True)
class NicPlan:
    node: int
    nic: int
    ifname: str  # inside the node's netns
    peer: str  # spine-side end, inside the spine netns
    address: str
    prefixlen: int
    table: int
    rule_priority: int


@dataclass(frozen=True)
class FabricPlan:
    prefix: str
    nodes: int
    nics: int
    node_ns: tuple[str, ...]
    spine_ns: str
    nic_plans: tuple[NicPlan, ...]

    def nic(self, node: int, nic: int) -> NicPlan:
        if not (0 <= node < self.nodes and 0 <= nic < self.nics):
            raise FabricError(f"no NIC {nic} on node {node} (fabric has {self.nodes}x{self.nics})")
        return self.nic_plans[node * self.nics + nic]

    def namespaces(self) -> tuple[str, ...]:
        return (*self.node_ns, self.spine_ns)


def nic_address(node: int, nic: int) -> str:
    """Address of NIC ``nic`` of node ``node``: 10.77.<nic>.<node+1>."""
    return f"{RAIL_NET}.{nic}.{node + 1}"


def plan_fabric(nodes: int, nics: int, prefix: str) -> FabricPlan:
    """Names and addresses of a fabric; validates the shape."""
    if not _PREFIX_RE.match(prefix):
        raise FabricError(f"bad prefix {prefix!r}: want [a-z][a-z0-9]{{0,11}}")
    if not 1 <= nodes <= 200:
        raise FabricError(f"nodes={nodes}: want 1..200")
    if not 1 <= nics <= 64:
        raise FabricError(f"nics={nics}: want 1..64")
    plans = [
        NicPlan(
            node=n,
            nic=i,
            ifname=f"nic{i}",
            peer=f"n{n}nic{i}",
            address=nic_address(n, i),
            prefixlen=24,
            table=TABLE_BASE + i,
            rule_priority=RULE_PRIO_BASE + i,
        )
        for n in range(nodes)
        for i in range(nics)
    ]
    return FabricPlan(
        prefix=prefix,
        nodes=nodes,
        nics=nics,
        node_ns=tuple(f"{prefix}n{n}" for n in range(nodes)),
        spine_ns=f"{prefix}sp",
        nic_plans=tuple(plans),
    )


def owns_netns(prefix: str, name: str) -> bool:
    """True when netns ``name`` belongs to a fabric with exactly this prefix."""
    return re.fullmatch(re.escape(prefix) + r"(n\d+|sp)", name) is not None


QUEUE_MS = 20  # tbf's default queue: the longest a packet may wait for tokens


def tbf_params(rate_mbit: int, queue_ms: int = QUEUE_MS) -> dict[str, Any]:
    """tbf parameters for a NIC ceiling: a burst of ~4 ms (>= 128 KiB, so GSO frames pass whole)
    and a queue of ``queue_ms`` (tbf's ``latency``: the qdisc holds rate x latency bytes beyond
    the burst; a deeper queue is more standing delay under load)."""
    if rate_mbit <= 0 or rate_mbit > 30000:
        raise FabricError(f"rate_mbit={rate_mbit}: want 1..30000")
    if queue_ms <= 0 or queue_ms > 1000:
        raise FabricError(f"queue_ms={queue_ms}: want 1..1000")
    rate_bytes = rate_mbit * 1_000_000 // 8
    burst = max(128 * 1024, rate_bytes // 250)
    return {"rate": f"{rate_mbit}mbit", "burst": burst, "latency": f"{queue_ms}ms"}


def tbf_sides(
    rate_mbit: int | None, queue_ms: int, host_queue_ms: int | None
) -> tuple[dict[str, Any] | None, dict[str, Any] | None]:
    """The tbf parameters of a NIC's node side (the host's own queue: ``host_queue_ms``, or
    ``queue_ms`` when None) and of its switch side (``queue_ms``); (None, None) unshaped."""
    if rate_mbit is None:
        return None, None
    return tbf_params(rate_mbit, host_queue_ms or queue_ms), tbf_params(rate_mbit, queue_ms)


HOST_QDISCS = ("fifo", "flows")
FLOW_QUEUES = 64  # the per-flow host queue's buckets
_ETH_P_IP = 0x0800
_TC_H_ROOT = 0xFFFFFFFF


def flow_queue_plan(
    rate_mbit: int, queue_ms: int, queues: int = FLOW_QUEUES
) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any], int, list[str]]:
    """The per-flow host queue of a NIC (``host_qdisc="flows"``), a stand-in for the per-flow
    queueing of a real host's NIC (Linux's default fq_codel) on a kernel with no per-flow qdisc
    but htb and u32. The NIC's tbf stays the root and sets the rate exactly as with ``fifo``
    (an htb shaping on its own overshoots the switch side's tbf now and then, which drops); its
    queue is an htb with ``queues`` buckets, each with its own FIFO of ``queue_ms`` at the full
    rate in MTU-sized packets. A bucket that sends less than 1/``queues`` of the rate is served
    before those that send more (htb serves a class within its rate before classes that
    borrow), as fq_codel serves a new or sparse flow first; the busy ones share the rest round
    robin. The htb itself never limits (its ceiling is far above the rate). A TCP/UDP packet
    goes to the bucket of bits 1-6 of its source port (ephemeral ports of connect() are mostly
    even: bit 0 says little).

    Returns (the root tbf, the htb parent class, a bucket class, FIFO limit in packets, u32 keys
    per bucket)."""
    tbf = tbf_params(rate_mbit, queue_ms)  # validates
    if not 1 <= queues <= 64:
        raise FabricError(f"queues={queues}: want 1..64")
    fast = f"{min(4 * rate_mbit, 30000)}mbit"  # htb's rates are 32-bit bytes/s
    parent: dict[str, Any] = {"rate": fast, "ceil": fast}
    share = f"{max(8, rate_mbit * 1000 // queues)}kbit"
    bucket: dict[str, Any] = {"rate": share, "ceil": fast, "quantum": 64 * 1024}
    limit = max(64, rate_mbit * 125 * queue_ms // 1500)  # packets the full rate sends in queue_ms
    # u32 reads the 32-bit word at offset 20 of the IPv4 header (no options): sport << 16 | dport
    keys = [f"0x{(k << 17):08x}/0x{((queues - 1) << 17):08x}+20" for k in range(queues)]
    return tbf, parent, bucket, limit, keys


def node_sysctls(ifnames: Sequence[str]) -> list[tuple[str, str]]:
    """Sysctls (path under /proc/sys, value) of a node: ARP per NIC, no rp_filter, no IPv6."""
    out: list[tuple[str, str]] = []
    for dev in ("all", "default", *ifnames):
        out += [
            (f"net/ipv4/conf/{dev}/arp_ignore", "1"),
            (f"net/ipv4/conf/{dev}/arp_announce", "2"),
            (f"net/ipv4/conf/{dev}/rp_filter", "0"),
        ]
    return out


_PRE_LINK_SYSCTLS = (
    ("net/ipv6/conf/all/disable_ipv6", "1"),
    ("net/ipv6/conf/default/disable_ipv6", "1"),
)


_prefix_counter = itertools.count()


def unique_prefix(base: str = "rh") -> str:
    """A prefix no other live process uses: base + pid + a per-process counter (base36)."""

    def b36(v: int) -> str:
        digits = "0123456789abcdefghijklmnopqrstuvwxyz"
        s = ""
        while True:
            v, r = divmod(v, 36)
            s = digits[r] + s
            if v == 0:
                return s

    return f"{base}{b36(os.getpid())}x{b36(next(_prefix_counter))}"


# ---------------------------------------------------------------------------------------------
# Namespace plumbing (setns through libc; no `ip` binary).


def _check_host_qdisc(kind: str) -> None:
    if kind not in HOST_QDISCS:
        raise FabricError(f"host_qdisc={kind!r}: want one of {', '.join(HOST_QDISCS)}")


@functools.cache
def _get_libc() -> ctypes.CDLL:
    return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)


def _setns_path(path: str) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        if _get_libc().setns(fd, _CLONE_NEWNET) != 0:
            e = ctypes.get_errno()
            raise OSError(e, f"setns({path}): {os.strerror(e)}")
    finally:
        os.close(fd)


def in_netns(name: str, fn: Callable[[], T], timeout: float = 10.0) -> T:
    """Run ``fn`` in a short-lived thread that has entered netns ``name`` (setns is per thread).

    Sockets created by ``fn`` stay in that netns; files under /proc/sys/net are that netns's.
    """
    box: dict[str, Any] = {}

    def body() -> None:
        try:
            _setns_path(str(NETNS_DIR / name))
            box["value"] = fn()
        except BaseException as e:
            box["error"] = e

    th = threading.Thread(target=body, name=f"netns-{name}", daemon=True)
    th.start()
    th.join(timeout)
    if th.is_alive():
        raise FabricError(f"work inside netns {name} did not finish within {timeout} s")
    if "error" in box:
        raise box["error"]
    return box["value"]  # type: ignore[no-any-return]


def _write_sysctls(name: str, items: Sequence[tuple[str, str]]) -> None:
    def body() -> None:
        for path, value in items:
            Path("/proc/sys", path).write_text(value)

    in_netns(name, body)


def _preexec_enter(nspath: str, remount_sys: bool) -> Callable[[], None]:
    libc = _get_libc()

    def enter() -> None:  # runs in the child between fork and exec: no locks, no imports
        fd = os.open(nspath, os.O_RDONLY)
        if libc.setns(fd, _CLONE_NEWNET) != 0:
            raise OSError(ctypes.get_errno(), "setns failed")
        os.close(fd)
        # like `ip netns exec`: a private mount namespace with a sysfs of this netns, so
        # /sys/class/net shows the node's NICs. Best effort: without it only /sys differs.
        if (
            remount_sys
            and libc.unshare(_CLONE_NEWNS) == 0
            and libc.mount(b"none", b"/", None, _MS_REC | _MS_SLAVE, None) == 0
        ):
            # mounted on top of the old /sys (never unmounted first): if this fails, the old
            # /sys stays usable (CUDA/NVML need it)
            libc.mount(b"sysfs", b"/sys", b"sysfs", 0, None)

    return enter


_RTM_SETLINK = 19
_NLM_F_REQUEST_ACK = 0x1 | 0x4
_NLMSG_ERROR = 2
_IFLA_PROTINFO = 12
_NLA_F_NESTED = 0x8000
_IFLA_BRPORT_STATE = 1


def brport_state_request(ifindex: int, state: int, seq: int = 1) -> bytes:
    """RTM_SETLINK (AF_BRIDGE) setting IFLA_BRPORT_STATE, as `bridge link set state` sends it.

    Built by hand: pyroute2 0.9 routes bridge-port "set" through RTM_NEWLINK link info, which the
    kernel ignores for the port state.
    """
    inner = struct.pack("=HHB3x", 5, _IFLA_BRPORT_STATE, state)
    nla = struct.pack("=HH", 4 + len(inner), _IFLA_PROTINFO | _NLA_F_NESTED) + inner
    ifi = struct.pack("=BxHiII", socket.AF_BRIDGE, 0, ifindex, 0, 0)
    body = ifi + nla
    return struct.pack("=IHHII", 16 + len(body), _RTM_SETLINK, _NLM_F_REQUEST_ACK, seq, 0) + body


def _brport_set_state(ns_name: str, ifindex: int, state: int) -> None:
    def body() -> None:
        with socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, 0) as s:  # NETLINK_ROUTE
            s.settimeout(2.0)
            s.bind((0, 0))
            s.send(brport_state_request(ifindex, state))
            reply = s.recv(65536)
        _len, mtype, _fl, _seq, _pid = struct.unpack_from("=IHHII", reply)
        if mtype != _NLMSG_ERROR:
            raise FabricError(f"unexpected netlink reply type {mtype} to RTM_SETLINK")
        (err,) = struct.unpack_from("=i", reply, 16)
        if err != 0:
            raise FabricError(f"setting bridge port {ifindex} state {state}: {os.strerror(-err)}")

    in_netns(ns_name, body)


def _remove_netns(name: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        netns.remove(name)


def remove_prefix(prefix: str) -> list[str]:
    """Remove every netns of the fabric with exactly this prefix; returns what was removed."""
    removed = []
    for name in sorted(netns.listnetns()):
        if owns_netns(prefix, name):
            _remove_netns(name)
            removed.append(name)
    return removed


def remove_stale(state_dir: Path = STATE_DIR) -> list[str]:
    """Remove the fabrics of every owner process that is gone (crash, SIGKILL)."""
    removed: list[str] = []
    if not state_dir.is_dir():
        return removed
    for f in state_dir.glob("*.pid"):
        try:
            pid = int(f.read_text().strip() or "0")
        except (OSError, ValueError):
            pid = 0
        if pid and pid_alive(pid):
            continue
        removed += remove_prefix(f.stem)
        with contextlib.suppress(FileNotFoundError):
            f.unlink()
    return removed


# ---------------------------------------------------------------------------------------------
# Live state


@dataclass(frozen=True)
class NicCounters:
    rx_bytes: int
    tx_bytes: int
    rx_packets: int
    tx_packets: int


@dataclass(frozen=True)
class LinkState:
    admin_up: bool
    carrier: bool
    operstate: str
    peer_admin_up: bool
    peer_carrier: bool
    forwarding: bool  # the spine port forwards frames (False while blackholed)


class CounterSampler:
    """Samples every NIC's counters of a fabric every ``interval`` s in a background thread.

    ``samples`` holds ``(time.monotonic(), {(node, nic): NicCounters})``; bounded by ``max_s``.
    """

    def __init__(self, fabric: Fabric, interval: float = 0.1, max_s: float = 600.0) -> None:
        self.fabric = fabric
        self.interval = interval
        self.max_s = max_s
        self.samples: list[tuple[float, dict[tuple[int, int], NicCounters]]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._body, name="nic-sampler", daemon=True)

    def _body(self) -> None:
        t_end = time.monotonic() + self.max_s
        nxt = time.monotonic()
        while not self._stop.is_set() and time.monotonic() < t_end:
            with contextlib.suppress(Exception):
                self.samples.append((time.monotonic(), self.fabric.counters()))
            nxt += self.interval
            self._stop.wait(max(0.0, nxt - time.monotonic()))

    def start(self) -> CounterSampler:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5.0)

    def __enter__(self) -> CounterSampler:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def rate(self, node: int, nic: int, t0: float, t1: float, direction: str = "tx") -> float:
        """Bytes/s through a NIC between monotonic times t0 and t1 (nearest samples inside)."""
        inside = [
            (t, c[(node, nic)]) for t, c in self.samples if t0 <= t <= t1 and (node, nic) in c
        ]
        if len(inside) < 2 or inside[-1][0] <= inside[0][0]:
            return 0.0
        (ta, ca), (tb, cb) = inside[0], inside[-1]
        if direction == "tx":
            return (cb.tx_bytes - ca.tx_bytes) / (tb - ta)
        return (cb.rx_bytes - ca.rx_bytes) / (tb - ta)


class FaultKind(StrEnum):
    CARRIER_LOCAL = "carrier_local"
    CARRIER_REMOTE = "carrier_remote"
    BLACKHOLE = "blackhole"
    FLAP = "flap"


@dataclass
class _Flapper:
    thread: threading.Thread
    stop: threading.Event


_live: set[Fabric] = set()
_live_lock = threading.Lock()


def _cleanup_all() -> None:
    with _live_lock:
        fabrics = list(_live)
    for f in fabrics:
        with contextlib.suppress(Exception):
            f.close()


atexit.register(_cleanup_all)


@dataclass(frozen=True)
class HostQueue:
    """One NIC queue of a node: bytes waiting in it now, packets it dropped so far."""

    backlog: int
    drops: int


class Fabric:
    """The emulated fabric. Use as a context manager; see the module docstring."""

    def __init__(
        self,
        nodes: int = 2,
        nics: int = 4,
        rate_mbit: int | None = None,
        prefix: str = "rh",
        *,
        mtu: int = 1500,
        state_dir: Path = STATE_DIR,
        queue_ms: int = QUEUE_MS,
        host_queue_ms: int | None = None,
        host_qdisc: str = "fifo",
    ) -> None:
        self.plan = plan_fabric(nodes, nics, prefix)
        tbf_sides(rate_mbit, queue_ms, host_queue_ms)  # validate early
        _check_host_qdisc(host_qdisc)
        self.rate_mbit = rate_mbit
        self.queue_ms = queue_ms
        self.host_queue_ms = host_queue_ms
        self.host_qdisc = host_qdisc
        self.mtu = mtu
        self._state_dir = state_dir
        self._ns: dict[str, Any] = {}  # netns name -> pyroute2 NetNS
        self._nl_lock = threading.RLock()
        self._procs: list[subprocess.Popen[Any]] = []
        self._flappers: dict[tuple[int, int], _Flapper] = {}
        self._faults: dict[tuple[int, int], set[FaultKind]] = {}
        self._up = False
        self._closed = False
        self._old_handlers: dict[int, Any] = {}
        self._owner_pid = os.getpid()

    # -- naming -----------------------------------------------------------------------------
    @property
    def prefix(self) -> str:
        return self.plan.prefix

    @property
    def nodes(self) -> int:
        return self.plan.nodes

    @property
    def nics(self) -> int:
        return self.plan.nics

    def netns(self, node: int) -> str:
        if not 0 <= node < self.nodes:
            raise FabricError(f"no node {node}")
        return self.plan.node_ns[node]

    @property
    def spine_netns(self) -> str:
        return self.plan.spine_ns

    def address(self, node: int, nic: int) -> str:
        return self.plan.nic(node, nic).address

    def ifname(self, nic: int) -> str:
        return self.plan.nic(0, nic).ifname

    # -- lifecycle ----------------------------------------------------------------------------
    def __enter__(self) -> Fabric:
        self.up()
        return self

    def __exit__(
        self,
        et: type[BaseException] | None,
        ev: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def up(self) -> None:
        """Create the fabric (removing stale objects first); idempotent."""
        if self._up:
            return
        if self._closed:
            raise FabricError("a closed fabric cannot be brought up again")
        if os.geteuid() != 0:
            raise FabricError("the emulated fabric needs root (network namespaces, veth, tc)")
        self._claim_prefix()
        self._register()
        try:
            self._build()
        except BaseException:
            self.close()
            raise
        self._up = True

    def _claim_prefix(self) -> None:
        remove_stale(self._state_dir)
        self._state_dir.mkdir(parents=True, exist_ok=True)
        pidfile = self._state_dir / f"{self.prefix}.pid"
        try:
            owner = int(pidfile.read_text().strip() or "0")
        except (OSError, ValueError):
            owner = 0
        with _live_lock:
            in_use = any(f.prefix == self.prefix and f is not self for f in _live)
        if in_use or (owner and owner != os.getpid() and pid_alive(owner)):
            raise FabricError(
                f"prefix {self.prefix!r} is used by live process {owner}; pick another "
                "(railhop_lab.fabric.unique_prefix())"
            )
        remove_prefix(self.prefix)
        tmp = pidfile.with_suffix(f".tmp{os.getpid()}")
        tmp.write_text(f"{os.getpid()}\n")
        tmp.rename(pidfile)

    def _register(self) -> None:
        with _live_lock:
            _live.add(self)
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGTERM, signal.SIGHUP):
                with contextlib.suppress(ValueError, OSError):
                    self._old_handlers[sig] = signal.signal(sig, self._on_signal)

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        if os.getpid() != self._owner_pid:
            # a forked child (pyroute2 forks helpers) inherited the handler: die as by default
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)
            return
        old = self._old_handlers.get(signum)
        _cleanup_all()
        if callable(old):
            old(signum, frame)
            return
        raise SystemExit(128 + signum)

    def _nl(self, name: str) -> Any:
        ns = self._ns.get(name)
        if ns is None:
            ns = NetNS(name, flags=0)
            self._ns[name] = ns
        return ns

    def _build(self) -> None:
        p = self.plan
        host, spine = tbf_sides(self.rate_mbit, self.queue_ms, self.host_queue_ms)
        for name in p.namespaces():
            netns.create(name)
            _write_sysctls(name, _PRE_LINK_SYSCTLS)
        sp = self._nl(p.spine_ns)
        sp.link("add", ifname=BRIDGE, kind="bridge", br_stp_state=0, br_forward_delay=0)
        br = sp.link_lookup(ifname=BRIDGE)[0]
        for n in range(p.nodes):
            nl = self._nl(p.node_ns[n])
            nl.link("set", index=nl.link_lookup(ifname="lo")[0], state="up")
            for i in range(p.nics):
                np_ = p.nic(n, i)
                nl.link(
                    "add",
                    ifname=np_.ifname,
                    kind="veth",
                    mtu=self.mtu,
                    peer={"ifname": np_.peer, "net_ns_fd": p.spine_ns, "mtu": self.mtu},
                )
            _write_sysctls(p.node_ns[n], node_sysctls([f"nic{i}" for i in range(p.nics)]))
            for i in range(p.nics):
                np_ = p.nic(n, i)
                idx = nl.link_lookup(ifname=np_.ifname)[0]
                nl.addr("add", index=idx, address=np_.address, prefixlen=np_.prefixlen)
                nl.link("set", index=idx, state="up")
                nl.route(
                    "add",
                    dst=f"{RAIL_NET}.0.0",
                    dst_len=16,
                    oif=idx,
                    table=np_.table,
                    scope="link",
                    prefsrc=np_.address,
                )
                nl.rule(
                    "add",
                    family=socket.AF_INET,
                    src=np_.address,
                    src_len=32,
                    table=np_.table,
                    priority=np_.rule_priority,
                )
                pidx = sp.link_lookup(ifname=np_.peer)[0]
                sp.link("set", index=pidx, master=br, state="up")
                if host is not None and spine is not None:
                    self._add_host_queue(nl, idx)
                    sp.tc("add", "tbf", index=pidx, handle="1:", **spine)
        sp.link("set", index=br, state="up")
        self._wait(
            lambda: all(self.link_state(n, i).operstate == "UP" for n, i in self._all_nics()),
            5.0,
            "NICs to come up",
        )

    def _add_host_queue(self, nl: Any, idx: int) -> None:
        """The node-side queue of the NIC at ``idx`` for the current rate, depth and kind: one
        tbf FIFO (``fifo``), or per-flow buckets under an htb (``flows``, see
        :func:`flow_queue_plan`)."""
        assert self.rate_mbit is not None
        depth = self.host_queue_ms or self.queue_ms
        if self.host_qdisc == "fifo":
            nl.tc("add", "tbf", index=idx, handle="1:", **tbf_params(self.rate_mbit, depth))
            return
        tbf, parent, cls, limit, keys = flow_queue_plan(self.rate_mbit, depth)
        nl.tc("add", "tbf", index=idx, handle="1:", **tbf)
        nl.tc("add", "htb", index=idx, handle=0x20000, parent=0x10001, default=0x10)
        nl.tc("add-class", "htb", index=idx, handle=0x20001, parent=0x20000, **parent)
        for k, key in enumerate(keys):
            bucket = 0x20000 | (0x10 + k)
            nl.tc("add-class", "htb", index=idx, handle=bucket, parent=0x20001, **cls)
            nl.tc("add", "pfifo", index=idx, handle=(0x10 + k) << 16, parent=bucket, limit=limit)
            nl.tc(
                "add-filter",
                "u32",
                index=idx,
                parent=0x20000,
                prio=10,
                protocol=_ETH_P_IP,
                target=bucket,
                keys=[key],
            )

    def set_rate(
        self,
        rate_mbit: int | None,
        queue_ms: int = QUEUE_MS,
        host_queue_ms: int | None = None,
        host_qdisc: str | None = None,
    ) -> None:
        """Change every NIC's ceiling (both veth ends) in place: ``None`` removes it.

        ``queue_ms`` is the queue of the fabric's side (the switch port towards the node);
        ``host_queue_ms``, when given, that of the node's own NIC, where the sender's packets
        wait (default: the same). A host queue shallower than what its TCP sockets may hand it
        (TCP small queues allow each about two packets of up to 64 KiB) drops the sender's
        own packets, which a real host, whose NIC pushes back into a deep qdisc, rarely does.
        ``host_qdisc`` (default: unchanged) is ``fifo`` (one tbf) or ``flows`` (a queue per
        flow, as a real host's fq_codel gives: :func:`flow_queue_plan`).
        """
        host, spine = tbf_sides(rate_mbit, queue_ms, host_queue_ms)
        kind = self.host_qdisc if host_qdisc is None else host_qdisc
        _check_host_qdisc(kind)
        p = self.plan
        with self._nl_lock:
            sp = self._nl(p.spine_ns)
            shaped = self.rate_mbit is not None
            self.rate_mbit, self.queue_ms, self.host_queue_ms = rate_mbit, queue_ms, host_queue_ms
            self.host_qdisc = kind
            for n, i in self._all_nics():
                np_ = p.nic(n, i)
                nl = self._nl(p.node_ns[n])
                for ns, ifname, params in ((nl, np_.ifname, host), (sp, np_.peer, spine)):
                    idx = ns.link_lookup(ifname=ifname)[0]
                    if shaped:
                        ns.tc("del", index=idx, handle="1:", root=True)
                    if params is None:
                        continue
                    if ns is nl:
                        self._add_host_queue(nl, idx)
                    else:
                        ns.tc("add", "tbf", index=idx, handle="1:", **params)

    def host_queues(self, node: int) -> list[HostQueue]:
        """The state of each of ``node``'s NIC queues (its root ``tbf``, whose counts cover the
        per-flow buckets under it; zeros without a ceiling):
        what waits in it now and what it dropped so far, the sender's packets that never left
        the host."""
        if not 0 <= node < self.nodes:
            raise FabricError(f"no node {node}")
        with self._nl_lock:
            nl = self._nl(self.plan.node_ns[node])
            got: dict[int, HostQueue] = {}
            for q in nl.get_qdiscs():
                if q.get_attr("TCA_KIND") != "tbf" or q["parent"] != _TC_H_ROOT:
                    continue
                st = q.get_attr("TCA_STATS") or {}
                got[q["index"]] = HostQueue(int(st.get("backlog", 0)), int(st.get("drop", 0)))
            return [
                got.get(nl.link_lookup(ifname=self.plan.nic(node, i).ifname)[0], HostQueue(0, 0))
                for i in range(self.nics)
            ]

    def _all_nics(self) -> Iterator[tuple[int, int]]:
        for n in range(self.nodes):
            for i in range(self.nics):
                yield n, i

    def close(self) -> None:
        """Kill processes started in the fabric, stop flappers, remove every netns. Idempotent."""
        if self._closed or os.getpid() != self._owner_pid:
            return  # only the creating process tears down (never a forked child)
        self._closed = True
        for fl in list(self._flappers.values()):
            fl.stop.set()
        for fl in list(self._flappers.values()):
            fl.thread.join(2.0)
        self._flappers.clear()
        self.kill_processes()
        with self._nl_lock:
            for ns in self._ns.values():
                with contextlib.suppress(Exception):
                    ns.close()
            self._ns.clear()
        remove_prefix(self.prefix)
        with contextlib.suppress(FileNotFoundError):
            (self._state_dir / f"{self.prefix}.pid").unlink()
        with _live_lock:
            _live.discard(self)
        if threading.current_thread() is threading.main_thread():
            for sig, old in self._old_handlers.items():
                with contextlib.suppress(ValueError, OSError, TypeError):
                    signal.signal(sig, old)
        self._old_handlers.clear()

    # -- processes ----------------------------------------------------------------------------
    def popen(
        self,
        node: int,
        argv: Sequence[str],
        env: Mapping[str, str] | None = None,
        remount_sys: bool = True,
        **kwargs: Any,
    ) -> subprocess.Popen[Any]:
        """Start ``argv`` inside node ``node``'s netns (own process group; killed on close)."""
        if not self._up or self._closed:
            raise FabricError("fabric is not up")
        nspath = str(NETNS_DIR / self.netns(node))
        proc: subprocess.Popen[Any] = subprocess.Popen(
            list(argv),
            env=dict(env) if env is not None else None,
            preexec_fn=_preexec_enter(nspath, remount_sys),  # noqa: PLW1509 (setns needs it)
            start_new_session=True,
            **kwargs,
        )
        self._procs.append(proc)
        return proc

    def run(
        self, node: int, argv: Sequence[str], timeout: float, env: Mapping[str, str] | None = None
    ) -> subprocess.CompletedProcess[str]:
        """Run ``argv`` inside a node to completion (bounded by ``timeout``), capturing output."""
        proc = self.popen(
            node, argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            self._kill(proc)
            out, err = proc.communicate()
            raise FabricError(f"{argv[0]} in node {node} did not finish in {timeout} s") from None
        return subprocess.CompletedProcess(list(argv), proc.returncode, out, err)

    @staticmethod
    def _kill(proc: subprocess.Popen[Any]) -> None:
        if proc.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(5.0)

    def kill_processes(self) -> None:
        """SIGTERM then SIGKILL (after 2 s) every process group this fabric started."""
        alive = [p for p in self._procs if p.poll() is None]
        for p in alive:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(p.pid, signal.SIGTERM)
        deadline = time.monotonic() + 2.0
        for p in alive:
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(max(0.0, deadline - time.monotonic()))
        for p in alive:
            self._kill(p)
        self._procs = [p for p in self._procs if p.poll() is None]

    def socket(
        self, node: int, family: int = socket.AF_INET, type: int = socket.SOCK_STREAM
    ) -> socket.socket:
        """A socket created inside node ``node``'s netns."""
        return in_netns(self.netns(node), lambda: socket.socket(family, type))

    def tcp_check(
        self, src: tuple[int, int], dst: tuple[int, int], timeout: float = 1.0, nbytes: int = 65536
    ) -> str:
        """Connect from NIC ``src`` = (node, nic) to NIC ``dst`` and move ``nbytes`` through it.

        Returns ``"ok"``, ``"timeout"`` (silent loss) or the errno name of the failure
        (e.g. ``"ENETUNREACH"``, ``"ECONNREFUSED"``). The client is bound to the source NIC's
        address and device, like a plugin lane.
        """
        srv = self.socket(dst[0])
        cli = self.socket(src[0])
        try:
            srv.bind((self.address(*dst), 0))
            srv.listen(1)
            srv.settimeout(timeout)
            port = srv.getsockname()[1]
            cli.setsockopt(socket.SOL_SOCKET, socket.SO_BINDTODEVICE, self.ifname(src[1]).encode())
            cli.bind((self.address(*src), 0))
            cli.settimeout(timeout)
            deadline = time.monotonic() + timeout
            got = [0]

            def drain(conn: socket.socket) -> None:
                with conn, contextlib.suppress(OSError):
                    conn.settimeout(max(0.05, deadline - time.monotonic()))
                    while got[0] < nbytes:
                        chunk = conn.recv(min(1 << 20, nbytes - got[0]))
                        if not chunk:
                            return
                        got[0] += len(chunk)

            try:
                cli.connect((self.address(*dst), port))
                conn, _ = srv.accept()
                th = threading.Thread(target=drain, args=(conn,), daemon=True)
                th.start()
                cli.settimeout(max(0.05, deadline - time.monotonic()))
                cli.sendall(b"\xa5" * nbytes)
                th.join(max(0.05, deadline - time.monotonic()))
                if got[0] == nbytes:
                    return "ok"
                return "timeout" if th.is_alive() else "EOF"
            except TimeoutError:
                return "timeout"
            except OSError as e:
                return errno.errorcode.get(e.errno or 0, str(e))
        finally:
            cli.close()
            srv.close()

    # -- observation --------------------------------------------------------------------------
    def _link(self, ns_name: str, ifname: str) -> Any:
        with self._nl_lock:
            nl = self._nl(ns_name)
            idx = nl.link_lookup(ifname=ifname)
            if not idx:
                raise FabricError(f"no link {ifname} in netns {ns_name}")
            return nl.get_links(idx[0])[0]

    def nic_bytes(self, node: int, nic: int) -> NicCounters:
        """Counters of a NIC's node-side end (rx = into the node, tx = out of it)."""
        st = self._link(self.netns(node), self.ifname(nic)).get("IFLA_STATS64")
        return NicCounters(
            rx_bytes=int(st["rx_bytes"]),
            tx_bytes=int(st["tx_bytes"]),
            rx_packets=int(st["rx_packets"]),
            tx_packets=int(st["tx_packets"]),
        )

    def counters(self) -> dict[tuple[int, int], NicCounters]:
        """Counters of every NIC, one netlink dump per node."""
        out: dict[tuple[int, int], NicCounters] = {}
        with self._nl_lock:
            for n in range(self.nodes):
                for link in self._nl(self.netns(n)).get_links():
                    name = link.get("IFLA_IFNAME")
                    m = re.fullmatch(r"nic(\d+)", name or "")
                    if not m:
                        continue
                    st = link.get("IFLA_STATS64")
                    out[(n, int(m.group(1)))] = NicCounters(
                        int(st["rx_bytes"]),
                        int(st["tx_bytes"]),
                        int(st["rx_packets"]),
                        int(st["tx_packets"]),
                    )
        return out

    def link_state(self, node: int, nic: int) -> LinkState:
        np_ = self.plan.nic(node, nic)
        loc = self._link(self.netns(node), np_.ifname)
        rem = self._link(self.spine_netns, np_.peer)
        with self._nl_lock:
            brport = self._nl(self.spine_netns).brport("show", index=rem["index"])
        state = BR_STATE_FORWARDING
        for msg in brport:
            info = msg.get("IFLA_PROTINFO")
            if info is not None and info.get("IFLA_BRPORT_STATE") is not None:
                state = int(info.get("IFLA_BRPORT_STATE"))
        return LinkState(
            admin_up=bool(loc["flags"] & 1),
            carrier=bool(loc.get("IFLA_CARRIER")),
            operstate=str(loc.get("IFLA_OPERSTATE")),
            peer_admin_up=bool(rem["flags"] & 1),
            peer_carrier=bool(rem.get("IFLA_CARRIER")),
            forwarding=state == BR_STATE_FORWARDING,
        )

    def faults(self) -> dict[tuple[int, int], frozenset[FaultKind]]:
        return {k: frozenset(v) for k, v in self._faults.items() if v}

    # -- faults -------------------------------------------------------------------------------
    def _set_admin(self, ns_name: str, ifname: str, up: bool) -> None:
        with self._nl_lock:
            nl = self._nl(ns_name)
            nl.link("set", index=nl.link_lookup(ifname=ifname)[0], state="up" if up else "down")

    def _set_brport(self, node: int, nic: int, state: int) -> None:
        with self._nl_lock:
            sp = self._nl(self.spine_netns)
            idx = sp.link_lookup(ifname=self.plan.nic(node, nic).peer)[0]
        _brport_set_state(self.spine_netns, idx, state)

    def _mark(self, node: int, nic: int, kind: FaultKind) -> None:
        self._faults.setdefault((node, nic), set()).add(kind)

    def _carrier(self, node: int, nic: int, end: End, up: bool) -> None:
        np_ = self.plan.nic(node, nic)
        if end == "local":
            self._set_admin(self.netns(node), np_.ifname, up)
        elif end == "remote":
            self._set_admin(self.spine_netns, np_.peer, up)
        else:
            raise FabricError(f"end={end!r}: want 'local' or 'remote'")

    def carrier_down(self, node: int, nic: int, end: End = "local") -> None:
        """Carrier loss: ``local`` sets the node's NIC down; ``remote`` its spine-side peer."""
        self._carrier(node, nic, end, up=False)
        self._mark(
            node, nic, FaultKind.CARRIER_LOCAL if end == "local" else FaultKind.CARRIER_REMOTE
        )

    def blackhole(self, node: int, nic: int) -> None:
        """Silent blackhole: every frame to/from the NIC is dropped, carrier stays up."""
        self.plan.nic(node, nic)
        self._set_brport(node, nic, BR_STATE_LISTENING)
        self._mark(node, nic, FaultKind.BLACKHOLE)

    def flap(
        self, node: int, nic: int, hz: float, duration: float, end: End = "local"
    ) -> threading.Thread:
        """Toggle the NIC's carrier ``hz`` times a second for ``duration`` s (background thread).

        The thread ends by itself (carrier restored) after ``duration``, or on heal/close.
        Returns the thread (join it to wait for the end of the flapping).
        """
        if not 0 < hz <= 100:
            raise FabricError(f"hz={hz}: want (0, 100]")
        if not 0 < duration <= 3600:
            raise FabricError(f"duration={duration}: want (0, 3600]")
        if end not in ("local", "remote"):
            raise FabricError(f"end={end!r}: want 'local' or 'remote'")
        self._stop_flap(node, nic)
        stop = threading.Event()
        half = 0.5 / hz

        def body() -> None:
            t_end = time.monotonic() + duration
            try:
                while not stop.is_set() and time.monotonic() < t_end:
                    self._carrier(node, nic, end, up=False)
                    if stop.wait(min(half, max(0.0, t_end - time.monotonic()))):
                        break
                    self._carrier(node, nic, end, up=True)
                    stop.wait(min(half, max(0.0, t_end - time.monotonic())))
            finally:
                if not self._closed:
                    with contextlib.suppress(Exception):
                        self._carrier(node, nic, end, up=True)
                self._faults.get((node, nic), set()).discard(FaultKind.FLAP)

        th = threading.Thread(target=body, name=f"flap-{node}-{nic}", daemon=True)
        self._flappers[(node, nic)] = _Flapper(th, stop)
        self._mark(node, nic, FaultKind.FLAP)
        th.start()
        return th

    def _stop_flap(self, node: int, nic: int) -> None:
        fl = self._flappers.pop((node, nic), None)
        if fl is not None:
            fl.stop.set()
            fl.thread.join(5.0)

    def heal(self, node: int, nic: int, wait: float = 5.0) -> None:
        """Undo every fault on the NIC and wait (bounded) until it is up and forwarding."""
        self._stop_flap(node, nic)
        np_ = self.plan.nic(node, nic)
        self._set_admin(self.spine_netns, np_.peer, True)
        self._set_admin(self.netns(node), np_.ifname, True)
        self._faults.pop((node, nic), None)

        def healthy() -> bool:
            st = self.link_state(node, nic)
            if st.operstate == "UP" and st.peer_carrier and not st.forwarding:
                self._set_brport(node, nic, BR_STATE_FORWARDING)
                return False
            return st.operstate == "UP" and st.peer_carrier and st.forwarding

        self._set_brport(node, nic, BR_STATE_FORWARDING)
        self._wait(healthy, wait, f"node {node} nic{nic} to heal")

    def heal_all(self) -> None:
        for n, i in self._all_nics():
            self.heal(n, i)

    @staticmethod
    def _wait(cond: Callable[[], bool], timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        delay = 0.005
        while not cond():
            if time.monotonic() >= deadline:
                raise FabricError(f"timed out after {timeout} s waiting for {what}")
            time.sleep(delay)
            delay = min(delay * 2, 0.1)
