"""Hostile peers on the fabric (issue 17): a stranger attacks a live connection (root).

A third host on the emulated fabric (node 2) speaks the plugin's TCP lane protocol (48-byte frame
header and hellos, plugin/src/core/wire.h) to the lane listeners of a harness pair whose receiver
checks every byte, while the pair moves data:

* a forged HELLO_LANE naming the live connection (finding 1; the id travels in clear, the test
  reads it from the plugin's log as a sniffer would from the wire), carrying a NIC table that
  points at 127.0.0.1:9 (finding 4), followed by forged DATA frames that claim an empty message
  (finding 2), carry in-bounds garbage or a size above the posted buffer (finding 3), and by
  forged ACKs to the sender; then a NIC fault makes the connection fail over on its tables;
* forged hellos with an epoch of UINT32_MAX, then a fault (finding 5);
* the first 64 KiB of each of the plugin's own lanes, captured on the wire and replayed on new
  connections to the same listeners, as sent and with bits flipped (finding 9), hellos for
  connections that do not exist, and interleaved garbage;
* an attacker in the path of live lanes (issue 29, 2): the sender's lanes to the receiver's
  first NIC run through a proxy on node 2 (nat rules: node 0's OUTPUT DNATs them to node 2,
  whose PREROUTING redirects them to the proxy, which reads the original destination and
  relays), and the proxy injects one forged frame at a frame boundary of a live stream: DATA
  for a chunk not yet placed (ahead of the genuine one), a first chunk with total 0, a BYE, a
  FAILREQ towards the receiver; an ACK or a CTS towards the sender.

Asserted: no receive completes with wrong bytes or size, no request fails (the harness), no
out-of-bounds access (plugin and harness are an AddressSanitizer build: no report, exit 0), the
legitimate connection keeps moving data through the attack and after the fault, and the
receiver's descriptors come back to their level and its CPU stays bounded.

The attacker speaks the protocol of the build under test (the magic in the handle: "RHH3" hellos
carry a nonce and a MAC, which the stranger cannot compute without the secret; "RHH2" had none;
"RHH4" hellos carry a stream nonce too and every frame after the hello a 16-byte tag, which the
stranger fills with random bytes), so the same file shows the findings on a build of the
previous protocol: point
RAILHOP_HOSTILE_PLUGIN_PATH and RAILHOP_HOSTILE_HARNESS_PATH at its ASan build. By default the
module uses the ASan build of `make ctest` (build/ctest-address, tests/sanbuild.py).
"""

from __future__ import annotations

import contextlib
import os
import random
import re
import select
import socket
import struct
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from conftest import fabric_fixture, require, until
from railhop_lab.fabric import Fabric, in_netns
from railhop_lab.harness import HarnessConfig, HarnessResult, HarnessRun, wait_for_bytes
from railhop_lab.peerwire import (
    CHUNK,
    F_ACK,
    F_BYE,
    F_CTS,
    F_DATA,
    F_FAILREQ,
    F_HELLO,
    F_HELLO_ACK,
    HDR,
    HELLO_CONN,
    HELLO_LANE,
    TAG,
    U32_MAX,
    Handle,
    frame,
    hello,
    nic_entry,
    parse_handle,
    tcp_segment,
)
from sanbuild import sanitizer_build

pytestmark = pytest.mark.privileged

REPO = Path(__file__).resolve().parents[2]
MiB = 1 << 20
RATE_MBIT = 200  # a rate-limited fabric: the receiver's CPU has headroom to measure


# ---------------------------------------------------------------------------------------------
# Fixtures


def asan_build() -> tuple[Path, Path]:
    plugin = os.environ.get("RAILHOP_HOSTILE_PLUGIN_PATH")
    harness = os.environ.get("RAILHOP_HOSTILE_HARNESS_PATH")
    if plugin and harness:
        return Path(plugin), Path(harness)
    return sanitizer_build("address")


@pytest.fixture(scope="module")
def build() -> tuple[Path, Path]:
    require(os.geteuid() == 0, "needs root (netns, veth, tc)")
    return asan_build()


fab = fabric_fixture("rhth", nodes=3, rate_mbit=RATE_MBIT, plugin=False)  # ASan builds


ENV = {
    "RAILHOP_TRANSPORT": "tcp",
    "NCCL_DEBUG": "INFO",  # the plugin's log: connection ids and listener ports
    "ASAN_OPTIONS": "detect_leaks=0:halt_on_error=1:exitcode=86",
}


def start(fab: Fabric, build: tuple[Path, Path], duration: float, seed: int) -> HarnessRun:
    cfg = HarnessConfig(
        conns=1, sizes=(MiB,), duration=duration, deadline=duration + 40, inflight=8, seed=seed
    )
    return HarnessRun(fab, cfg, env=ENV, plugin=build[0], harness=build[1]).start()


# ---------------------------------------------------------------------------------------------
# What the stranger learns


@dataclass
class Target:
    handle: Handle
    conn_id: int
    send_ports: dict[int, int]  # the sender's lane listeners: NIC index -> port
    recv_pid: int


def _log(run: HarnessRun, role: str) -> str:
    return (run.workdir / f"{role}.stderr").read_text(errors="replace")


def discover(fab: Fabric, run: HarnessRun) -> Target:
    hfile = run.workdir / "rendezvous" / "handle.0"
    until(hfile.is_file, 20, "the receiver's connect handle")
    handle = parse_handle(hfile.read_bytes())
    found: dict[str, int] = {}

    def conn_id() -> bool:
        m = re.search(r"conn ([0-9a-f]{16}) \(recv\): lane \d+ up", _log(run, "recv"))
        if m:
            found["id"] = int(m.group(1), 16)
        return m is not None

    until(conn_id, 20, "the connection id in the receiver's log")
    ports = {}
    for m in re.finditer(r"lane listener on (\S+) port (\d+)", _log(run, "send")):
        ports[[fab.ifname(k) for k in range(fab.nics)].index(m.group(1))] = int(m.group(2))
    assert len(ports) == fab.nics, _log(run, "send")[-2000:]
    return Target(handle, found["id"], ports, run.sides["recv"].proc.pid)


def open_fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@dataclass
class Attack:
    fab: Fabric
    socks: list[socket.socket] = field(default_factory=list)
    accepted: list[str] = field(default_factory=list)  # forged hellos the plugin answered

    def connect(self, ip: str, port: int) -> socket.socket | None:
        s = self.fab.socket(2)
        s.settimeout(3.0)
        try:
            s.connect((ip, port))
        except OSError:
            s.close()
            return None
        self.socks.append(s)
        return s

    @staticmethod
    def send(s: socket.socket, data: bytes) -> bool:
        try:
            s.sendall(data)
            return True
        except OSError:
            return False  # the plugin closed it (a refused hello)

    def hello(self, s: socket.socket, what: str, data: bytes) -> None:
        """Send a hello; record it when the plugin answers with a HELLO_ACK."""
        if not self.send(s, data):
            return
        got = b""
        s.settimeout(1.5)
        try:
            while len(got) < HDR.size:
                b = s.recv(HDR.size - len(got))
                if not b:
                    break
                got += b
        except OSError:
            pass
        if len(got) == HDR.size and got[0] == F_HELLO_ACK:
            self.accepted.append(what)
        s.settimeout(3.0)

    def close(self) -> None:
        for s in self.socks:
            s.close()
        self.socks.clear()


FRAMES = ("empty", "oversize", "garbage", "ack")


def forged_lanes(
    fab: Fabric,
    run: HarnessRun,
    t: Target,
    *,
    epoch: int = 1,
    table: bool = False,
    frames: tuple[str, ...] = (),
) -> Attack:
    """A HELLO_LANE naming the live connection to every listener of both ends; optionally with
    a NIC table pointing at 127.0.0.1:9, and followed by forged frames for the receives posted
    now: to the receiver DATA claiming an empty message ("empty"), a message above the posted
    size ("oversize"), garbage in bounds ("garbage", one listener); to the sender ACKs."""
    a = Attack(fab)
    poison = tuple(nic_entry("127.0.0.1", 9, rail=k) for k in range(fab.nics)) if table else ()
    ends = [(1, t.handle.nics[k], k) for k in range(fab.nics)]
    ends += [(0, (fab.address(0, k), t.send_ports[k]), k) for k in range(fab.nics)]
    for node, (ip, port), k in ends:
        s = a.connect(ip, port)
        assert s is not None, f"cannot reach the lane listener {ip}:{port} of node {node}"
        from_sender = 1 if node == 1 else 0
        h = hello(
            t.handle.magic, HELLO_LANE, from_sender, 1001 + 2 * k, src_nic=k, dst_nic=k, nics=poison
        )
        a.hello(s, f"node{node} NIC {k}", frame(F_HELLO, h, conn_id=t.conn_id, epoch=epoch))
    prog = run.progress("recv")
    base = prog[-1].msgs if prog else 0
    cid = t.conn_id
    for i, (s, (node, _, _)) in enumerate(zip(a.socks, ends, strict=True)):
        out = b""
        for seq in range(base, base + 16):
            if node == 0 and "ack" in frames:
                out += frame(F_ACK, conn_id=cid, seq=seq, total=MiB)
            if node == 1 and "empty" in frames:
                out += frame(F_DATA, conn_id=cid, seq=seq, total=0)
            if node == 1 and "oversize" in frames:
                out += frame(F_DATA, b"\xee" * 4096, conn_id=cid, seq=seq, total=4 * MiB)
            if node == 1 and "garbage" in frames and i == 0:
                out += frame(F_DATA, b"\xee" * CHUNK, conn_id=cid, seq=seq, off=CHUNK, total=MiB)
        if out:
            a.send(s, out)
    return a


# ---------------------------------------------------------------------------------------------
# Checks


def now_h(run: HarnessRun) -> float:
    return time.monotonic() - run.started_at


def close(run: HarnessRun) -> dict[str, str]:
    """Stop the pair (if still running) and keep both sides' logs."""
    run.kill()
    logs = {role: _log(run, role) for role in ("send", "recv")}
    run.close()
    return logs


def assert_clean(res: HarnessResult, logs: dict[str, str]) -> None:
    for role, log in logs.items():
        assert "AddressSanitizer" not in log, f"{role}: ASan report\n{log[-6000:]}"
    assert res.ok, res.describe()
    s, r = res.send.summary, res.recv.summary
    assert s is not None and r is not None
    assert s.msgs == r.msgs > 0 and s.bytes == r.bytes == r.msgs * MiB, res.describe()
    assert r.data_errors == 0 and s.data_errors == 0, res.describe()


def assert_moving_after(res: HarnessResult, t: float, what: str) -> None:
    prog = res.recv.progress
    before = max((p.bytes for p in prog if p.t <= t), default=0)
    assert prog and prog[-1].bytes > before + 4 * MiB, f"no data after {what}\n{res.describe()}"


# ---------------------------------------------------------------------------------------------
# Tests


@pytest.mark.parametrize("frames", FRAMES)
def test_forged_lane_and_frames_are_refused(
    fab: Fabric, build: tuple[Path, Path], frames: str
) -> None:
    """Findings 1-3: a stranger's HELLO_LANE naming the live connection is not answered and its
    frames reach nothing: no receive completes empty (2), with garbage or fails with EMSGSIZE
    (3), no send completes on a forged ACK."""
    run = start(fab, build, duration=7.0, seed=171)
    try:
        wait_for_bytes(run, 8 * MiB, timeout=30)
        t = discover(fab, run)
        attack = forged_lanes(fab, run, t, frames=(frames,))
        t_attack = now_h(run)
        attack.close()
        res = run.wait()
    finally:
        logs = close(run)
    assert_clean(res, logs)
    assert not attack.accepted, f"forged HELLO_LANE accepted on {attack.accepted} (finding 1)"
    assert_moving_after(res, t_attack, "the attack")


def test_forged_nic_table_cannot_steer_failover(fab: Fabric, build: tuple[Path, Path]) -> None:
    """Finding 4: a HELLO_LANE's NIC table (every NIC at 127.0.0.1:9) does not replace the
    peer's: when the connection's NIC fails afterwards, its backup lanes reach the real NICs."""
    run = start(fab, build, duration=9.0, seed=172)
    try:
        wait_for_bytes(run, 8 * MiB, timeout=30)
        t = discover(fab, run)
        attack = forged_lanes(fab, run, t, table=True)
        attack.close()
        t_fault = now_h(run)
        fab.carrier_down(1, 0)  # the connection's NIC (device 0) at the receiver
        res = run.wait()
    finally:
        logs = close(run)
    assert_clean(res, logs)
    assert not attack.accepted, f"forged HELLO_LANE accepted on {attack.accepted}"
    assert_moving_after(res, t_fault + 1.0, "the fault (failover on the real NIC table)")


def test_forged_epoch_cannot_wrap(fab: Fabric, build: tuple[Path, Path]) -> None:
    """Finding 5: a hello with epoch UINT32_MAX does not move the connection's epoch (which
    would wrap to 0 at the next failover); the failover after it works."""
    run = start(fab, build, duration=9.0, seed=173)
    try:
        wait_for_bytes(run, 8 * MiB, timeout=30)
        t = discover(fab, run)
        attack = forged_lanes(fab, run, t, epoch=U32_MAX)
        attack.close()
        t_fault = now_h(run)
        fab.carrier_down(0, 0)  # the connection's NIC at the sender
        res = run.wait()
    finally:
        logs = close(run)
    assert_clean(res, logs)
    assert not attack.accepted, f"forged hello with epoch UINT32_MAX accepted: {attack.accepted}"
    assert_moving_after(res, t_fault + 1.0, "the fault")
    assert "epoch 4294967295" not in logs["recv"] + logs["send"]


class Capture:
    """TCP payload on node 1's NICs, by flow (src, sport, dst, dport), the first 64 KiB each."""

    LIMIT = 64 * 1024

    def __init__(self, fab: Fabric) -> None:
        self.flows: dict[tuple[str, int, str, int], bytearray] = {}
        self.stop = threading.Event()
        self.socks = [
            in_netns(
                fab.netns(1),
                lambda: socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(0x0003)),
            )
            for _ in range(fab.nics)
        ]
        for k, s in enumerate(self.socks):
            s.bind((fab.ifname(k), 0))
        self.thread = threading.Thread(target=self._body, daemon=True)
        self.thread.start()

    def _body(self) -> None:
        while not self.stop.is_set():
            ready, _, _ = select.select(self.socks, [], [], 0.1)
            for s in ready:
                seg = tcp_segment(s.recv(262144))
                if seg is None or not seg.payload:
                    continue
                buf = self.flows.setdefault((seg.src, seg.sport, seg.dst, seg.dport), bytearray())
                if len(buf) < self.LIMIT:
                    buf += seg.payload[: self.LIMIT - len(buf)]

    def close(self) -> None:
        self.stop.set()
        self.thread.join(5)
        for s in self.socks:
            s.close()


def flip_bits(b: bytes, rng: random.Random, n: int) -> bytes:
    out = bytearray(b)
    for _ in range(n):
        i = rng.randrange(len(out))
        out[i] ^= 1 << rng.randrange(8)
    return bytes(out)


def test_replayed_and_garbled_bytes(fab: Fabric, build: tuple[Path, Path]) -> None:
    """Finding 9 and more: the plugin's own lane bytes replayed on new connections (as sent and
    with bits flipped), hellos for connections that do not exist, interleaved garbage. The
    connection keeps moving checked data; the receiver's descriptors come back and its CPU
    stays bounded while 64 stranger connections sit idle on its listeners."""
    rng = random.Random(179)
    cap = Capture(fab)
    try:
        run = start(fab, build, duration=12.0, seed=174)
        wait_for_bytes(run, 16 * MiB, timeout=30)
    finally:
        cap.close()
    try:
        t = discover(fab, run)
        listeners = {p for _, p in t.handle.nics} | set(t.send_ports.values())
        flows = [
            ((dst, dport), bytes(b))
            for (_, _, dst, dport), b in cap.flows.items()
            if dport in listeners
        ]
        assert flows, f"no lane bytes captured: {list(cap.flows)[:8]}"
        lanes_up = re.compile(r"\((?:recv|send)\): lane \d+ up")
        nlanes0 = len(lanes_up.findall(_log(run, "recv") + _log(run, "send")))
        fds0 = open_fds(t.recv_pid)
        cpu0, wall0 = cpu_s(t.recv_pid), time.monotonic()
        time.sleep(1.0)
        base_rate = (cpu_s(t.recv_pid) - cpu0) / (time.monotonic() - wall0)
        t_attack = now_h(run)
        a = Attack(fab)
        targets = list(t.handle.nics) + [(fab.address(0, k), p) for k, p in t.send_ports.items()]
        for (ip, port), data in flows[:16]:  # to the listener each was captured going to
            for payload in (data, flip_bits(data, rng, 16), flip_bits(data, rng, 256)):
                s = a.connect(ip, port)
                if s is not None:
                    a.send(s, payload)
        for i in range(64):
            ip, port = targets[i % len(targets)]
            s = a.connect(ip, port)
            if s is None:
                continue
            kind = i % 4
            if kind == 0:  # garbage
                a.send(s, rng.randbytes(4096))
            elif kind == 1:  # a header announcing a 4 GiB hello
                a.send(s, frame(F_HELLO, length=U32_MAX, conn_id=rng.getrandbits(64)))
            elif kind == 2:  # a hello for a connection that does not exist (or is closed)
                h = hello(t.handle.magic, HELLO_LANE, 1, 3, nics=())
                a.send(s, frame(F_HELLO, h, conn_id=rng.getrandbits(64)))
            else:  # a hello for a new connection of a listener that does not exist
                h = hello(t.handle.magic, HELLO_CONN, 1, 0, listen_id=rng.getrandbits(64))
                a.send(s, frame(F_HELLO, h, conn_id=rng.getrandbits(64)) + rng.randbytes(512))
        # 64+ stranger connections sit on the listeners: CPU stays near its level
        cpu1, wall1 = cpu_s(t.recv_pid), time.monotonic()
        time.sleep(1.5)
        held_rate = (cpu_s(t.recv_pid) - cpu1) / (time.monotonic() - wall1)
        a.close()
        # descriptors come back (the plugin closes what it refused, and what we closed)
        until(lambda: open_fds(t.recv_pid) <= fds0 + 4, 10, f"descriptors back to {fds0} + 4")
        res = run.wait()
    finally:
        logs = close(run)
    assert_clean(res, logs)
    assert_moving_after(res, t_attack + 2.0, "the replay")
    # no replayed hello opened a lane (no fault here: the lanes up before are all there are)
    assert len(lanes_up.findall(logs["recv"] + logs["send"])) == nlanes0, logs["recv"][-3000:]
    # bounded: at most half a core more than before (a spinning listener takes a whole one)
    assert held_rate < base_rate + 0.5, f"receiver CPU {held_rate:.2f} vs {base_rate:.2f} cores"


# ---------------------------------------------------------------------------------------------
# An attacker in the path of live lanes (issue 29, 2)


def _recv_exact(s: socket.socket, n: int, stop: threading.Event) -> bytes | None:
    """n bytes from s (None: closed or stopping); bounded by the socket's timeout per read."""
    out = bytearray()
    while len(out) < n:
        if stop.is_set():
            return None
        try:
            b = s.recv(min(n - len(out), 1 << 20))
        except TimeoutError:
            continue
        except OSError:
            return None
        if not b:
            return None
        out += b
    return bytes(out)


@dataclass
class Frame:
    hdr: tuple[int, ...]  # HDR fields: type slot flags len conn_id epoch aux seq off total
    raw: bytes  # as it came: header, tags, payload

    @property
    def type(self) -> int:
        return self.hdr[0]


INJECT = ("data", "empty", "bye", "failreq", "ack", "cts")
TOWARDS_SENDER = ("ack", "cts")


class InPathProxy:
    """Relays the sender's (node 0) lane streams to the receiver's (node 1) first NIC through
    node 2, frame by frame, and injects one forged frame of kind ``inject`` into a live stream
    at a frame boundary, after ``after`` genuine DATA frames went through."""

    def __init__(self, fab: Fabric, inject: str, after: int = 40) -> None:
        self.fab, self.inject, self.after = fab, inject, after
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.ndata = 0
        self.injected: list[str] = []
        self.streams = 0
        self.threads: list[threading.Thread] = []
        self.socks: list[socket.socket] = []
        self.lsock = fab.socket(2)
        self.lsock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.lsock.bind(("0.0.0.0", 0))
        self.lsock.listen(64)
        self.lsock.settimeout(0.2)
        port = self.lsock.getsockname()[1]
        dst, via = fab.address(1, 0), fab.address(2, 0)
        out = ["-t", "nat", "OUTPUT", "-p", "tcp", "-d", dst, "-j", "DNAT"]
        pre = ["-t", "nat", "PREROUTING", "-p", "tcp", "-s", fab.address(0, 0), "-j"]
        self.rules = [
            (0, [*out, "--to-destination", via]),
            (2, [*pre, "REDIRECT", "--to-ports", str(port)]),
        ]
        for node, rule in self.rules:
            r = fab.run(node, ["iptables", rule[0], rule[1], "-A", *rule[2:]], timeout=20)
            require(r.returncode == 0, f"iptables nat in node {node}: {r.stderr.strip()}")
        self._spawn(self._accept)

    def _spawn(self, fn: object, *args: object) -> None:
        t = threading.Thread(target=fn, args=args, daemon=True)  # type: ignore[arg-type]
        t.start()
        self.threads.append(t)

    def _accept(self) -> None:
        while not self.stop.is_set():
            try:
                c, _ = self.lsock.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            od = c.getsockopt(socket.SOL_IP, 80, 16)  # SO_ORIGINAL_DST: the listener's port
            port = struct.unpack(">H", od[2:4])[0]
            up = self.fab.socket(2)
            up.settimeout(3.0)
            try:
                up.connect((self.fab.address(1, 0), port))
            except OSError:
                c.close()
                up.close()
                continue
            c.settimeout(0.2)
            up.settimeout(0.2)
            with self.lock:
                self.socks += [c, up]
                self.streams += 1
            pending: list[bytes] = []  # forged frames for the way towards the sender
            self._spawn(self._pump, c, up, True, pending)
            self._spawn(self._pump, up, c, False, pending)

    def _read(self, src: socket.socket, tagged: bool) -> Frame | None:
        h = _recv_exact(src, HDR.size, self.stop)
        if h is None:
            return None
        f = HDR.unpack(h)
        extra = (TAG + (TAG if f[0] == F_DATA and f[2] & 1 else 0)) if tagged else 0
        rest = _recv_exact(src, extra + f[3], self.stop) if extra + f[3] else b""
        return None if rest is None else Frame(f, h + rest)

    def _pump(self, src: socket.socket, dst: socket.socket, up: bool, pending: list[bytes]) -> None:
        tagged = hello = False
        lane_id = 0
        try:
            while not self.stop.is_set():
                if not up and hello and pending:  # at a frame boundary towards the sender
                    with self.lock:
                        out, pending[:] = b"".join(pending), []
                    dst.sendall(out)
                if not up:
                    ready, _, _ = select.select([src], [], [], 0.05)
                    if not ready:
                        continue
                fr = self._read(src, tagged)
                if fr is None:
                    return
                if not hello:  # HELLO / HELLO_ACK: the protocol of the build, the lane's id
                    body = fr.raw[HDR.size :]
                    tagged, lane_id, hello = body[:4] == b"RHH4", hello_lane_id(body), True
                elif up and fr.type == F_DATA:
                    self._maybe_inject(fr, dst, tagged, lane_id, pending)
                dst.sendall(fr.raw)
        except OSError:
            return
        finally:
            for s in (src, dst):
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)

    def _maybe_inject(
        self, fr: Frame, dst: socket.socket, tagged: bool, lane_id: int, pending: list[bytes]
    ) -> None:
        _, slot, _, length, cid, epoch, _, seq, off, total = fr.hdr
        with self.lock:
            self.ndata += 1
            if self.injected or self.ndata < self.after or length == 0:
                return
            if self.inject == "empty" and off != 0:
                return  # a message's first chunk: total 0 would complete it at once
            self.injected.append(f"{self.inject} seq {seq} off {off} lane {lane_id}")

        def forged(ftype: int, payload: bytes = b"", **f: int) -> bytes:
            b = frame(ftype, payload, conn_id=cid, epoch=epoch, **f)
            return b[: HDR.size] + (os.urandom(TAG) if tagged else b"") + b[HDR.size :]

        k = self.inject
        if k == "data":  # ahead of the genuine chunk: on a build without frame MACs it is
            # placed and the genuine one dropped as a replay
            out = forged(F_DATA, b"\xee" * length, slot=slot, seq=seq, off=off, total=total)
        elif k == "empty":
            out = forged(F_DATA, slot=slot, seq=seq, off=0, total=0)
        elif k == "bye":
            out = forged(F_BYE, aux=lane_id)
        elif k == "failreq":
            out = forged(F_FAILREQ, bytes((1,)) + struct.pack("<I", lane_id))
        elif k == "ack":  # the message is in flight: an ACK completes it with nothing delivered
            out = forged(F_ACK, slot=slot, seq=seq, total=total)
        else:  # cts: the next receive posted, twice its real size
            out = forged(F_CTS, struct.pack("<iQ", 0, 2 * total), seq=seq + 1, aux=1)
        if k in TOWARDS_SENDER:
            with self.lock:
                pending.append(out)
        else:
            dst.sendall(out)

    def close(self) -> None:
        self.stop.set()
        for node, rule in self.rules:
            self.fab.run(node, ["iptables", rule[0], rule[1], "-D", *rule[2:]], timeout=20)
        self.lsock.close()
        for t in self.threads:
            t.join(5)
        with self.lock:
            for s in self.socks:
                s.close()


def hello_lane_id(body: bytes) -> int:
    """The lane id of a hello (its bytes after the frame header)."""
    return struct.unpack("<I", body[8:12])[0] if len(body) >= 12 else 0


@pytest.mark.parametrize("inject", INJECT)
def test_in_path_injection_fails_the_lane(
    fab: Fabric, build: tuple[Path, Path], inject: str
) -> None:
    """Issue 29, 2: a forged frame injected into a live lane by an attacker in its path is
    refused by its frame MAC (one WARN naming it), the lane fails over and the data arrives
    over another lane: every byte checked at the receiver, no send completes without its
    receive, both processes exit 0."""
    proxy = InPathProxy(fab, inject)
    try:
        run = start(fab, build, duration=8.0, seed=290 + INJECT.index(inject))
        try:
            wait_for_bytes(run, 8 * MiB, timeout=30)
            until(lambda: bool(proxy.injected), 20, f"the proxy injecting {inject}")
            t_inject = now_h(run)
            res = run.wait()
        finally:
            logs = close(run)
    finally:
        proxy.close()
    assert proxy.streams > 0, "no lane ran through the proxy"
    assert_clean(res, logs)
    victim = logs["send" if inject in TOWARDS_SENDER else "recv"]
    assert re.search(r"failed its MAC check.*failing the lane", victim), (
        f"no MAC failure logged for {proxy.injected}\n{victim[-3000:]}"
    )
    assert_moving_after(res, t_inject + 1.0, f"the injected {inject}")
