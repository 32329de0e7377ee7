"""A stranger on the VM lab's fabric attacking the verbs lane's listeners (one attack a run).

``python3 -m railhop_lab.verbs_stranger ATTACK --handle H --src IP [--nic K]`` runs in a guest
(the system Python; ``PYTHONPATH`` names the tree's ``lab/``) against the lane listener of NIC
K of the connect handle H (a ``railhop-harness`` receiver's rendezvous file), from the local
address IP, and prints one JSON line saying what it did and what the listener answered. The
test (tests/vm/test_verbs_hostile.py) reads the listener's log and its queue pairs.

Attacks (the frames from :mod:`peerwire`):

* ``garbage``: 4 KiB that are no frame header; ``truncated``: a hello's header and half its
  body, then close; ``oversize``: a HELLO header announcing 4 GiB; ``drip``: a hello one byte
  every 0.5 s (the listener must close it at its handshake deadline); ``flood``: 300 idle
  connections at once (more than the listener keeps waiting for a hello);
* ``badmac``: a verbs lane's HELLO_CONN with a random MAC;
* with the handle's secret (a valid MAC; the test plays a peer that holds the handle) a
  HELLO_CONN whose queue pair address is bad: ``qpn0`` (QPN 0), ``qpnbig`` (QPN above 24
  bits), ``mtu`` (MTU 9), ``gid`` (the GID of another address than the one the handshake
  comes from). Their QPN and PSN are :data:`QPN` and :data:`PSN` (where in range), so the
  test can look for a queue pair towards them;
* ``replay FILE``: each lane's hello captured by ``capture`` (lines "src dst port hex"), sent
  again from and to the addresses it went between;
* ``capture FILE --ports P,... --stop F --ready R``: on the listener's guest, the first TCP
  payload bytes of each connection to those ports, from when R is created until F exists (or
  300 s), written to FILE.
"""

from __future__ import annotations

import argparse
import json
import random
import select
import socket
import sys
import time
from pathlib import Path

from railhop_lab.peerwire import (
    F_HELLO,
    F_HELLO_ACK,
    HDR,
    HELLO_CONN,
    HELLO_LANE,
    IBV_MTU_1024,
    U32_MAX,
    Hello,
    frame,
    ipv4_gid,
    nic_entry,
    parse_handle,
    tcp_segment,
    verbs_qp_info,
)

QPN = 0x00ABCDE  # the attacker's queue pair number where it is in range
PSN = 0x0012345
ATTACKS = (
    "garbage",
    "truncated",
    "oversize",
    "drip",
    "flood",
    "badmac",
    "qpn0",
    "qpnbig",
    "mtu",
    "gid",
    "replay",
    "capture",
)
LANE_KINDS = (HELLO_CONN, HELLO_LANE)
FLOOD = 300
DRIP_LIMIT_S = 90.0  # the listener's deadline is 2 s + 2 probe timeouts


def _connect(src: str, dst: tuple[str, int]) -> socket.socket:
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.settimeout(10.0)
    s.bind((src, 0))
    s.connect(dst)
    return s


def _closed(s: socket.socket) -> bool:
    """A readable socket: did the peer close it (EOF or reset)?"""
    try:
        return s.recv(1) == b""
    except OSError:
        return True


def _answer(s: socket.socket, timeout: float = 5.0) -> str:
    """What the listener did with what was sent: "ack" (a HELLO_ACK), "closed", "silent"."""
    s.settimeout(timeout)
    got = b""
    try:
        while len(got) < HDR.size:
            b = s.recv(HDR.size - len(got))
            if not b:
                return "closed"
            got += b
    except TimeoutError:
        return "silent"
    except OSError:
        return "closed"
    return "ack" if got[0] == F_HELLO_ACK else f"frame {got[0]}"


def conn_hello(handle_path: Path, nic: int, src: str, tp: bytes, signed: bool) -> bytes:
    """A HELLO_CONN to the handle's listener from NIC 0 at src, with transport bytes tp, under
    the handle's secret (signed) or a random MAC."""
    h = parse_handle(handle_path.read_bytes())
    conn_id = random.getrandbits(64)
    hello = Hello(
        kind=HELLO_CONN,
        from_sender=1,
        lane_id=1,
        listen_id=h.listen_id,
        src_nic=0,
        dst_nic=nic,
        nics=(nic_entry(src, 9),),
        tp=tp,
    )
    body = hello.signed(h.secret, conn_id, 1) if signed else hello.encode()
    return frame(F_HELLO, body, conn_id=conn_id, epoch=1)


def attack(
    name: str, handle_path: Path, nic: int, src: str, extra: str | None
) -> dict[str, object]:
    h = parse_handle(handle_path.read_bytes())
    dst = h.nics[nic]
    out: dict[str, object] = {"attack": name, "dst": f"{dst[0]}:{dst[1]}", "src": src}
    good_gid = ipv4_gid(src)
    if name == "garbage":
        s = _connect(src, dst)
        s.sendall(b"\xee" * 4096)
        out["answer"] = _answer(s)
        s.close()
    elif name == "truncated":
        msg = conn_hello(handle_path, nic, src, verbs_qp_info(QPN, PSN, good_gid), True)
        s = _connect(src, dst)
        s.sendall(msg[: HDR.size + (len(msg) - HDR.size) // 2])
        s.close()
    elif name == "oversize":
        s = _connect(src, dst)
        s.sendall(frame(F_HELLO, length=U32_MAX, conn_id=random.getrandbits(64)))
        out["answer"] = _answer(s)
        s.close()
    elif name == "drip":
        msg = conn_hello(handle_path, nic, src, verbs_qp_info(QPN, PSN, good_gid), True)
        s = _connect(src, dst)
        t0 = time.monotonic()
        sent = 0
        closed = False
        while time.monotonic() - t0 < DRIP_LIMIT_S and sent < len(msg) - 1:
            try:
                s.sendall(msg[sent : sent + 1])
            except OSError:
                closed = True
                break
            sent += 1
            r, _, _ = select.select([s], [], [], 0.5)
            if r and _closed(s):
                closed = True
                break
        out.update(closed=closed, after_s=round(time.monotonic() - t0, 1), sent=sent)
        s.close()
    elif name == "flood":
        socks = []
        for _ in range(FLOOD):
            try:
                socks.append(_connect(src, dst))
            except OSError:
                break
        out["opened"] = len(socks)
        # the listener closes the oldest ones once more than it keeps wait for their hello
        t0 = time.monotonic()
        nclosed = 0
        while time.monotonic() - t0 < 30 and nclosed == 0:
            r, _, _ = select.select(socks, [], [], 0.5)
            nclosed = sum(1 for s in r if _closed(s))
        out["closed_by_listener"] = nclosed
        for s in socks:
            s.close()
    elif name in ("badmac", "qpn0", "qpnbig", "mtu", "gid"):
        tp = {
            "badmac": verbs_qp_info(QPN, PSN, good_gid),
            "qpn0": verbs_qp_info(0, PSN, good_gid),
            "qpnbig": verbs_qp_info(1 << 24 | QPN, PSN, good_gid),
            "mtu": verbs_qp_info(QPN, PSN, good_gid, mtu=9),
            # the address of the listener's own NIC: writes would go there
            "gid": verbs_qp_info(QPN, PSN, ipv4_gid(dst[0]), mtu=IBV_MTU_1024),
        }[name]
        s = _connect(src, dst)
        s.sendall(conn_hello(handle_path, nic, src, tp, signed=name != "badmac"))
        out["answer"] = _answer(s, 15.0)
        s.close()
    elif name == "replay":
        assert extra, "replay needs the capture file"
        answers = []
        for line in Path(extra).read_text().splitlines():
            if not line.strip():
                continue
            fsrc, fdst, port, hexdata = line.split()
            s = _connect(fsrc, (fdst, int(port)))
            s.sendall(bytes.fromhex(hexdata))
            answers.append(_answer(s, 15.0))
            s.close()
        out["answers"] = answers
    return out


def capture(
    path: Path, ports: set[int], stop: Path, ready: Path, limit: int = 4096
) -> dict[str, object]:
    """TCP payload towards ports on every interface, the first limit bytes of each flow; ready
    is created once the capture runs."""
    s = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(0x0003))
    ready.touch()
    flows: dict[tuple[str, str, int, int], bytearray] = {}
    t0 = time.monotonic()
    while not stop.exists() and time.monotonic() - t0 < 300:
        r, _, _ = select.select([s], [], [], 0.1)
        if not r:
            continue
        pkt, addr = s.recvfrom(262144)
        if addr[2] == socket.PACKET_OUTGOING:
            continue
        seg = tcp_segment(pkt)
        if seg is None or seg.dport not in ports or not seg.payload:
            continue
        buf = flows.setdefault((seg.src, seg.dst, seg.sport, seg.dport), bytearray())
        if len(buf) < limit:
            buf += seg.payload[: limit - len(buf)]
    s.close()
    # the whole hello frame of each flow that opened a lane (header + its length; a probe's
    # answer proves nothing a replay could use)
    lines = []
    for (fsrc, fdst, _, dport), b in flows.items():
        if len(b) >= HDR.size + 5 and b[0] == F_HELLO and b[HDR.size + 4] in LANE_KINDS:
            n = HDR.size + HDR.unpack(bytes(b[: HDR.size]))[3]
            if len(b) >= n:
                lines.append(f"{fsrc} {fdst} {dport} {bytes(b[:n]).hex()}")
    path.write_text("\n".join(lines) + "\n")
    return {"attack": "capture", "flows": len(flows), "hellos": len(lines)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="verbs_stranger")
    p.add_argument("attack", choices=ATTACKS)
    p.add_argument("file", nargs="?", help="replay: the capture; capture: where to write it")
    p.add_argument("--handle", type=Path)
    p.add_argument("--src", help="the local address to attack from")
    p.add_argument("--nic", type=int, default=0, help="the handle's NIC to attack")
    p.add_argument("--ports", help="capture: the listener ports")
    p.add_argument("--stop", type=Path, help="capture: ends when this file exists")
    p.add_argument("--ready", type=Path, help="capture: created once it captures")
    a = p.parse_args(argv)
    if a.attack == "capture":
        if not (a.file and a.ports and a.stop and a.ready):
            p.error("capture needs FILE, --ports, --stop and --ready")
        res = capture(Path(a.file), {int(x) for x in a.ports.split(",")}, a.stop, a.ready)
    else:
        if not (a.handle and a.src):
            p.error(f"{a.attack} needs --handle and --src")
        res = attack(a.attack, a.handle, a.nic, a.src, a.file)
    print(json.dumps(res), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
