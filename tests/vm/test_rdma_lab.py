"""The Soft-RoCE VM lab (railhop_lab.vmlab): two QEMU guests, rxe on four point-to-point rails.

One boot of the two guests (the ``lab`` fixture in tests/conftest.py) serves every VM test.
Needs root, QEMU, virtme-ng (``make setup``) and a Debian kernel with rxe under /boot; in CI a
missing prerequisite fails the test instead of skipping it. The ofi-lane tests also need the
plugin and the harness (``make ctest``).
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from conftest import check_clean, until
from railhop_lab.harness import HarnessConfig
from railhop_lab.vmharness import VmHarnessRun, wait_for_bytes, wait_for_each_conn
from railhop_lab.vmlab import (
    CmdResult,
    End,
    GuestJob,
    VmLab,
)

# emulated guests on shared cores: the boot (in the first test's set-up) and the ofi runs take
# minutes under load, past the suite's 300 s default; every wait inside has its own bound
pytestmark = [pytest.mark.privileged, pytest.mark.vm, pytest.mark.timeout(900)]

MiB = 1 << 20
PINGPONG_PORT = 18515


def _listening_script(port: int) -> str:
    return f"grep -qi ':{port:04X} 00000000:0000 0A' /proc/net/tcp"


def _wait_listening(lab: VmLab, node: int, port: int, job: GuestJob, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while lab.guests[node].sh(_listening_script(port), check=False).rc != 0:
        assert not job.done(), f"server exited early: {job.wait()}"
        assert time.monotonic() < deadline, f"node {node}: nothing listens on {port}"
        time.sleep(0.2)


def rc_pingpong(lab: VmLab, nic: int, iters: int = 200, size: int = 64 << 10) -> CmdResult:
    """ibv_rc_pingpong over rail ``nic``: server on node 1, client on node 0."""
    dev = ["-d", f"rxe{nic}", "-g", "1", "-s", str(size), "-n", str(iters)]
    server = lab.guests[1].start(["ibv_rc_pingpong", *dev], timeout=180)
    _wait_listening(lab, 1, PINGPONG_PORT, server, 60)
    client = lab.guests[0].run(["ibv_rc_pingpong", *dev, lab.address(1, nic)], timeout=180)
    srv = server.wait()
    assert srv.ok, f"server: {srv}"
    return client


def test_rxe_active_on_every_nic(lab: VmLab) -> None:
    for node in range(2):
        states = lab.port_states(node)
        assert states == {i: ("ACTIVE", True) for i in range(4)}, f"node {node}: {states}"
        links = lab.guests[node].sh("rdma link show").stdout
        for i in range(4):
            assert f"link rxe{i}/1 state ACTIVE" in links and f"netdev nic{i}" in links, links
        addrs = lab.guests[node].sh("ip -4 -o addr show").stdout
        for i in range(4):
            assert f"nic{i}    inet {lab.address(node, i)}/24" in addrs, addrs
        routes = lab.guests[node].sh("ip route show table all").stdout
        assert "default" not in routes, f"node {node} has a route out: {routes}"


def test_rc_pingpong_across_a_rail(lab: VmLab) -> None:
    r = rc_pingpong(lab, nic=1)
    assert r.ok, r
    assert f"{2 * 200 * (64 << 10)} bytes" in r.stdout, r  # counted both ways


@pytest.mark.parametrize("end", ["local", "remote"])
def test_carrier_loss_takes_the_rxe_port_down(lab: VmLab, end: End) -> None:
    """QMP set_link on node 0's NIC (local) or node 1's (remote): that guest sees NO-CARRIER, its
    rxe port goes DOWN and verbs delivers IBV_EVENT_PORT_ERR; the heal brings it back ACTIVE."""
    nic = 2
    seer = 0 if end == "local" else 1
    g = lab.guests[seer]
    out = lab.shared / f"asyncwatch-{end}.out"
    watch = g.start(["stdbuf", "-oL", "ibv_asyncwatch", "-d", f"rxe{nic}"], stdout=out, timeout=240)
    try:
        deadline = time.monotonic() + 60
        # ibv_asyncwatch prints a banner once the device is open: a fault before it goes unseen
        while not (out.exists() and out.read_text().strip()):
            assert not watch.done(), f"ibv_asyncwatch exited: {watch.wait()}"
            assert time.monotonic() < deadline, "ibv_asyncwatch did not start"
            time.sleep(0.2)
        lab.carrier_down(0, nic, end)
        lab.wait_ports(seer, {nic: "DOWN"}, 30)
        assert lab.port_states(seer)[nic] == ("DOWN", False)
        other = lab.port_states(1 - seer)
        assert other[nic] == ("ACTIVE", True), "the other end keeps its carrier (silence only)"
        deadline = time.monotonic() + 30
        while "IBV_EVENT_PORT_ERR" not in out.read_text():
            assert time.monotonic() < deadline, f"no PORT_ERR: {out.read_text()!r}"
            time.sleep(0.2)
        lab.heal(nic)
        deadline = time.monotonic() + 30
        while "IBV_EVENT_PORT_ACTIVE" not in out.read_text():
            assert time.monotonic() < deadline, f"no PORT_ACTIVE: {out.read_text()!r}"
            time.sleep(0.2)
    finally:
        watch.kill()
    assert lab.port_states(seer)[nic] == ("ACTIVE", True)


def test_blackhole_drops_with_carrier_up_and_heals(lab: VmLab) -> None:
    nic = 3
    assert lab.rail_verdicts()[nic] == "ok"
    lab.blackhole(1, nic)
    assert lab.port_states(1)[nic] == ("ACTIVE", True), "blackhole keeps carrier and port up"
    verdicts = lab.rail_verdicts()
    assert verdicts[nic] in ("timeout", "EHOSTUNREACH"), verdicts  # SYN or ARP unanswered
    assert verdicts[2] == "ok", f"other rails unaffected: {verdicts}"
    lab.heal(nic)
    assert lab.rail_verdicts()[nic] == "ok"


def _rail_stream_backlog(lab: VmLab, nic: int) -> int | None:
    """Bytes node 1's QEMU has written to rail ``nic``'s socket stream that node 0's QEMU has not
    yet taken (the host's /proc/net/tcp: the connecting end's send queue plus the listening end's
    receive queue); None when the stream is gone."""
    port = f"0100007F:{lab.plan.links[nic].port:04X}"
    backlog, found = 0, False
    for row in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        f = row.split()
        if len(f) < 5 or f[3] != "01":  # established only
            continue
        tx, rx = (int(x, 16) for x in f[4].split(":"))
        if f[2] == port:  # node 1's end: local ephemeral -> node 0's listening port
            backlog, found = backlog + tx, True
        elif f[1] == port:  # node 0's accepted end
            backlog += rx
    return backlog if found else None


def _udp_flood(src: str, dst: str, secs: float) -> str:
    """A guest program: non-blocking UDP datagrams from ``src`` to ``dst`` for ``secs``; prints
    how many went out and how many times the socket was full."""
    return (
        "import socket, time\n"
        "s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.setblocking(False)\n"
        f"s.bind(({src!r}, 0)); end = time.monotonic() + {secs}; sent = full = 0\n"
        "while time.monotonic() < end:\n"
        "    try:\n"
        f"        s.sendto(b'x' * 1400, ({dst!r}, 9)); sent += 1\n"
        "    except BlockingIOError:\n"
        "        full += 1; time.sleep(0.001)\n"
        "print(sent, full)\n"
    )


def test_carrier_loss_mid_frame_leaves_the_rail_whole(lab: VmLab) -> None:
    """A carrier loss while a rail's stream is full (the rxe load of a busy rail, made certain
    here by pausing node 0's QEMU while node 1 floods the rail) must leave the rail passing frames
    after the heal. ``set_link`` on the socket backend broke exactly this: QEMU dropped the frame
    it had half written without forgetting the offset, so the next frame went out misaligned and
    the stream was closed or QEMU aborted; the rail stayed dead with carrier up at both ends
    (clean-clone run 13). The lab downs the NIC instead (:meth:`VmLab.set_link`)."""
    nic = 3
    assert lab.rail_verdicts()[nic] == "ok"
    node0 = lab.guests[0].qmp
    node0.execute("stop")  # node 0's QEMU stops taking frames: node 1's writes to the rail block
    try:
        flood = _udp_flood(lab.address(1, nic), lab.address(0, nic), 3.0)
        r = lab.guests[1].run(["/usr/bin/python3", "-c", flood], timeout=60)
        assert r.ok, r
        backlog = _rail_stream_backlog(lab, nic)
        assert backlog is not None and backlog > 0, (backlog, r.stdout)  # the stream is full
        lab.set_link(1, nic, False)
    finally:
        node0.execute("cont")
    until(lambda: _rail_stream_backlog(lab, nic) in (0, None), 60, "the rail's stream drained")
    lab.heal(nic)
    assert _rail_stream_backlog(lab, nic) is not None, "the rail's socket stream was closed"
    assert lab.rail_verdicts()[nic] == "ok"
    assert all(g.proc is not None and g.proc.poll() is None for g in lab.guests), "a QEMU exited"


def _carrier_downs(lab: VmLab, node: int, nic: int) -> int:
    path = f"/sys/class/net/{lab.ifname(nic)}/carrier_down_count"
    return int(lab.guests[node].sh(f"cat {path}", timeout=60).stdout.strip())


def test_flap_then_heal(lab: VmLab) -> None:
    nic = 0
    before = _carrier_downs(lab, 0, nic)
    lab.flap(0, nic, hz=2.0, duration=3.0)
    # the guest's counter keeps every loss it saw, however late this poll runs (polling the
    # port state instead raced the flap: under load the poll came after it had ended)
    until(lambda: _carrier_downs(lab, 0, nic) > before, 60, "a carrier loss seen by the guest")
    lab.heal(nic)
    assert lab.port_states(0)[nic] == ("ACTIVE", True)
    assert rc_pingpong(lab, nic, iters=20).ok


# ---------------------------------------------------------------------------------------------
# The ofi lane over libfabric's verbs provider between the two guests


def test_ofi_lane_over_verbs(lab: VmLab, built: None) -> None:
    cfg = HarnessConfig(conns=4, sizes=(1 * MiB,), count=48, inflight=4, deadline=240)
    with VmHarnessRun(lab, cfg, verbose=True) as run:
        res = run.wait()
    check_clean(res, 48 * MiB)
    for side in (res.send, res.recv):
        log = (run.dir / f"{side.role}.err").read_text()
        assert "transport ofi (RAILHOP_TRANSPORT=ofi" in log, log[-3000:]


def test_ofi_lane_over_verbs_through_a_remote_carrier_loss(lab: VmLab, built: None) -> None:
    """Carrier loss at the remote end of rail 0 (QMP on the receiver's guest) during traffic: the
    sender sees silence, the receiver loses its port. Traffic moves to the other rails, the rail
    heals, traffic keeps moving after the fail-back; every byte checked, both exit 0."""
    cfg = HarnessConfig(conns=4, sizes=(1 * MiB,), duration=100, inflight=4, deadline=300)
    with VmHarnessRun(lab, cfg, verbose=True) as run:
        wait_for_bytes(run, 8 * MiB, 180)
        lab.carrier_down(0, 0, "remote")
        lab.wait_ports(1, {0: "DOWN"}, 30)
        # every connection moves on, the one on rail 0 carried by the surviving rails
        wait_for_each_conn(run, 4 * MiB, 120)
        lab.heal(0)
        wait_for_each_conn(run, 4 * MiB, 120)  # and after the fail-back
        res = run.wait()
    check_clean(res, 24 * MiB)


# ---------------------------------------------------------------------------------------------
# The agent's RDMA sources on real (rxe) devices

_SOURCES_CODE = """
import json, sys
from railhop.sources.catalogue import SourceOptions, build_sources
from railhop.sources.report import capability_report
opts = SourceOptions(ifnames=sys.argv[1].split(","))
for c in capability_report(build_sources(opts, groups=("netlink", "sysfs", "verbs"))):
    print(json.dumps({"source": c.source, "hook": c.hook, "status": c.status.value,
                      "detail": c.detail}))
"""


def test_agent_sysfs_and_verbs_sources_attach_to_every_rxe_device(lab: VmLab) -> None:
    """What ``railhop sources`` reports for the netlink, sysfs and verbs groups in a guest (the
    eBPF groups are left out here: bcc compiles each program for minutes under emulation)."""
    nics = ",".join(lab.ifname(i) for i in range(lab.nics))
    r = lab.guests[0].run([sys.executable, "-c", _SOURCES_CODE, nics], timeout=300)
    assert r.ok, r
    caps = {(c["source"], c["hook"]): c for c in map(json.loads, r.stdout.splitlines())}
    for i in range(lab.nics):
        verbs = caps.get(("verbs", f"rxe{i}"))
        assert verbs is not None and verbs["status"] == "attached", caps
        assert "port 1 ACTIVE" in verbs["detail"], verbs  # read through pyverbs
        sysfs = caps.get(("sysfs", f"rxe{i}/1"))
        assert sysfs is not None and sysfs["status"] == "attached", caps


def _status(lab: VmLab, node: int, run_dir: str) -> dict[str, Any] | None:
    railhop = str(Path(sys.executable).parent / "railhop")
    r = lab.guests[node].run([railhop, "status", "--json", "--run-dir", run_dir], timeout=120)
    if r.rc != 0 or not r.stdout.strip():
        return None
    doc: dict[str, Any] = json.loads(r.stdout)
    return doc


def test_agent_in_a_guest_marks_a_carrier_loss_down(lab: VmLab) -> None:
    """The agent (netlink, sysfs and verbs sources) in node 0; a QMP carrier loss on its nic1
    takes nic1 DOWN in the agent's table, and the verbs source reports it as well."""
    node, nic = 0, 1
    run_dir = "/tmp/railhop-agent"  # in the guest's own /tmp: no unix socket on the 9p share
    railhop = str(Path(sys.executable).parent / "railhop")
    nics = ",".join(lab.ifname(i) for i in range(lab.nics))
    argv = [railhop, "agent", "--nic", nics, "--sources", "netlink,sysfs,verbs"]
    argv += ["--run-dir", run_dir, "--no-traces", "--duration", "400"]
    log = lab.shared / "agent.err"
    # a quick source may take over 30 s to start on the guest's one emulated vCPU under load
    env = {"RAILHOP_SOURCE_TIMEOUT_S": "200"}
    agent = lab.guests[node].start(
        argv, timeout=450, stdout=lab.shared / "agent.out", stderr=log, env=env
    )
    try:
        deadline = time.monotonic() + 240
        while True:
            doc = _status(lab, node, run_dir)
            if doc is not None and doc["agent"]["alive"] and len(doc["nics"]) == lab.nics:
                break
            assert not agent.done(), f"agent exited: {agent.wait()} {log.read_text()[-3000:]}"
            assert time.monotonic() < deadline, f"agent not up: {doc} {log.read_text()[-3000:]}"
            time.sleep(1.0)
        states = {n["ifname"]: n["state"] for n in doc["nics"]}
        assert states == {lab.ifname(i): "up" for i in range(lab.nics)}, states
        lab.carrier_down(node, nic, "local")
        deadline = time.monotonic() + 60
        while True:
            doc = _status(lab, node, run_dir)
            states = {n["ifname"]: n["state"] for n in doc["nics"]} if doc else {}
            if states.get(lab.ifname(nic)) == "down":
                break
            assert time.monotonic() < deadline, f"{lab.ifname(nic)} not down: {states}"
            time.sleep(0.5)
        assert all(s == "up" for n, s in states.items() if n != lab.ifname(nic)), states
        # the verbs source saw it too (IBV_EVENT_PORT_ERR on rxe1), not only netlink
        deadline = time.monotonic() + 30
        while f"{lab.ifname(nic)}: carrier_down from verbs" not in log.read_text():
            assert time.monotonic() < deadline, f"no verbs signal: {log.read_text()[-3000:]}"
            time.sleep(0.5)
    finally:
        agent.kill()
