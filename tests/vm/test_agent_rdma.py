"""The agent's RDMA sources on real (rxe) devices in the Soft-RoCE guests: the eBPF RDMA driver
hooks attached (kprobe on ib_dispatch_event, the rdma_cma tracepoints), a carrier loss seen by
every source and recorded in the failover trace, a silent blackhole seen from the RDMA side.

bcc compiles each program for about 95 s on an emulated CPU, so the module starts ONE agent in
node 0 for all its tests (sources netlink, sysfs, verbs and the eBPF RDMA group: one trial
compile and one load, :mod:`railhop.sources.bpftrial`) and, at the same time, ``railhop
sources`` in node 1 (its own two compiles, on the other guest's vCPU). The shared session
``lab`` fixture (tests/conftest.py) boots the guests; ``_healed`` heals the rails after each
test. The blackhole test also needs ``railhop-verbs-check`` (``make ctest``). In CI a missing
prerequisite fails instead of skipping.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from conftest import verbs_check_path
from railhop_lab.vmlab import GuestJob, VmLab

pytestmark = [pytest.mark.privileged, pytest.mark.vm, pytest.mark.timeout(900)]

RAILHOP = str(Path(sys.executable).parent / "railhop")
REPO = Path(__file__).resolve().parents[2]
HW = "/sys/class/infiniband/rxe{nic}/ports/1/hw_counters"
IBV_WC_RETRY_EXC_ERR = 12
EBPF_TIMEOUT_S = 560  # one eBPF source's start (trial + load) in an emulated guest under load
AGENT_NODE = 0
RUN_DIR = "/tmp/railhop-agent-rdma"  # the guest's own /tmp: no unix socket on the 9p share

# the rxe hw_counters the agent watches (any increase is a breach): link_downed (the port went
# down) and retry_exceeded_err (a queue pair gave up after its retransmissions). Not
# completer_retry_err (one retransmission): healthy RC traffic between the emulated guests
# retransmits 0.75-5 times a second, which made the NIC SUSPECT with no fault. Counter breaches
# are soft evidence: SUSPECT, DOWN only after suspect_strikes of them within suspect_window_ms
# (docs/probes.md). suspect_clear_ms is a minute (the permissive policy's is 5 s): one breach
# keeps the NIC SUSPECT long enough for the table, read every few seconds, to show it.
RXE_COUNTERS = ("link_downed", "retry_exceeded_err")
POLICY = """\
version: 1
name: soft-roce-lab
description: The permissive policy with thresholds on rxe's hw_counters.
rails:
  mode: auto
rail_rule:
  kind: any
distance_limit: NODE
spreading:
  max_nics: 0
  min_weight: 0.0
health:
  suspect_strikes: 3
  suspect_window_ms: 2000
  suspect_clear_ms: 60000
  down_on: [lane_timeout]
  recover_stable_ms: 500
  recover_probes: 0
  migrate_on_suspect: false
  counter_window_ms: 10000
  counters:
""" + "".join(f"    {c}: 0\n" for c in RXE_COUNTERS)


@dataclass
class GuestAgent:
    job: GuestJob
    log: Path
    traces: Path
    sources: GuestJob  # `railhop sources --json` in the other node
    sources_out: Path

    def text(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def wait_log(self, needle: str, timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while needle not in self.text():
            assert not self.job.done(), f"agent exited: {self.job.wait()} {self.text()[-3000:]}"
            assert time.monotonic() < deadline, f"{what}: no {needle!r}: {self.text()[-3000:]}"
            time.sleep(1.0)


def _status(lab: VmLab) -> dict[str, Any] | None:
    r = lab.guests[AGENT_NODE].run([RAILHOP, "status", "--json", "--run-dir", RUN_DIR], timeout=120)
    if r.rc != 0 or not r.stdout.strip():
        return None
    doc: dict[str, Any] = json.loads(r.stdout)
    return doc


def _nics(doc: dict[str, Any] | None) -> dict[str, dict[str, Any]]:
    return {n["ifname"]: n for n in doc["nics"]} if doc else {}


def _wait_table(
    lab: VmLab, ok: Callable[[dict[str, dict[str, Any]]], bool], timeout: float, what: str
) -> dict[str, dict[str, Any]]:
    """The agent's table (``railhop status --json``: a Python start in the guest, seconds of
    its one vCPU, so asked every few seconds only) once ``ok`` holds for its NICs."""
    deadline = time.monotonic() + timeout
    while True:
        nics = _nics(_status(lab))
        if nics and ok(nics):
            return nics
        assert time.monotonic() < deadline, f"{what}: {nics}"
        time.sleep(3.0)


@pytest.fixture(scope="module")
def agent(lab: VmLab) -> Iterator[GuestAgent]:
    policy = lab.shared / "agent-rdma-policy.yaml"
    policy.write_text(POLICY)
    log, traces = lab.shared / "agent-rdma.err", lab.shared / "agent-rdma-traces.jsonl"
    traces.unlink(missing_ok=True)
    env = {"RAILHOP_EBPF_TIMEOUT_S": str(EBPF_TIMEOUT_S), "RAILHOP_SOURCE_TIMEOUT_S": "240"}
    nics = ",".join(lab.ifname(i) for i in range(lab.nics))
    argv = [RAILHOP, "agent", "--nic", nics, "--sources", "netlink,sysfs,verbs,rdma"]
    argv += ["--policy", str(policy), "--run-dir", RUN_DIR, "--trace-file", str(traces)]
    argv += ["--no-traces", "--duration", "1500"]
    job = lab.guests[AGENT_NODE].start(
        argv, env=env, timeout=1550, stdout=lab.shared / "agent-rdma.out", stderr=log
    )
    out = lab.shared / "sources-rdma.json"
    check = [RAILHOP, "sources", "--json", "--sources", "rdma,sysfs,verbs", *_nic_args(lab)]
    sources = lab.guests[1 - AGENT_NODE].start(
        check, env=env, timeout=2 * EBPF_TIMEOUT_S, stdout=out, stderr=lab.shared / "sources.err"
    )
    ga = GuestAgent(job, log, traces, sources, out)
    try:
        # the quick sources are up (read from the shared log: no load on the guest, whose
        # vCPU compiles the eBPF programs meanwhile), then the table has every NIC up
        ga.wait_log(f"verbs:rxe{lab.nics - 1} ", 400, "agent's quick sources")
        assert "failed to start" not in ga.text(), ga.text()[-3000:]
        _wait_table(
            lab,
            lambda n: len(n) == lab.nics and all(x["state"] == "up" for x in n.values()),
            120,
            "agent's table",
        )
        yield ga
    finally:
        job.kill()
        sources.kill()


def _nic_args(lab: VmLab) -> list[str]:
    return [a for i in range(lab.nics) for a in ("--nic", lab.ifname(i))]


def test_railhop_sources_shows_every_rdma_source_attached(lab: VmLab, agent: GuestAgent) -> None:
    """``railhop sources --json`` in a guest: sysfs on every rxe port, verbs on every rxe
    device, the eBPF RDMA driver hooks: ib_dispatch_event through a kprobe (fentry cannot reach
    a module's function), the rdma_cma tracepoints (rdma_cm is loaded: the lab loads
    rdma_ucm)."""
    r = agent.sources.wait(timeout=2 * EBPF_TIMEOUT_S + 60)
    err = (lab.shared / "sources.err").read_text(errors="replace")[-3000:]
    assert r.rc == 0 and not r.timed_out, f"{r} {err}"
    doc = json.loads(agent.sources_out.read_text())
    caps = {(c["source"], c["hook"]): c for c in doc["capabilities"]}
    for i in range(lab.nics):
        assert caps[("verbs", f"rxe{i}")]["status"] == "attached", caps
        assert caps[("sysfs", f"rxe{i}/1")]["status"] == "attached", caps
    ib = caps[("ebpf.rdma", "ib_event")]
    assert ib["status"] == "attached" and ib["mechanism"] == "kprobe:ib_dispatch_event", ib
    for hook in ("cm_event", "cm_remove"):
        cm = caps[("ebpf.rdma", hook)]
        assert cm["status"] == "attached" and cm["mechanism"].startswith("tp:rdma_cma:"), cm
    # no mlx5 in a guest: skipped for its missing tracepoint, not for a failed load
    assert caps[("ebpf.rdma", "mlx5_cmd")]["reason"] == "no tracepoint", caps


def _spans(path: Path) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    if not path.exists():
        return out
    for line in path.read_text().splitlines():
        if not line.strip():
            continue
        req = json.loads(line)
        for rs in req.get("resourceSpans", []):
            for ss in rs.get("scopeSpans", []):
                out += ss.get("spans", [])
    return out


def _value(v: dict[str, Any]) -> Any:
    if "arrayValue" in v:
        return tuple(_value(x) for x in v["arrayValue"].get("values", []))
    for k in ("stringValue", "boolValue", "doubleValue"):
        if k in v:
            return v[k]
    if "intValue" in v:
        return int(v["intValue"])
    return None


def _attrs(span: dict[str, Any]) -> dict[str, Any]:
    return {a["key"]: _value(a["value"]) for a in span.get("attributes", [])}


def test_a_carrier_loss_is_seen_by_every_rdma_source_and_traced(
    lab: VmLab, agent: GuestAgent
) -> None:
    """A QMP carrier loss on node 0's nic1: the NIC goes DOWN in the agent's table; a verbs
    async event (IBV_EVENT_PORT_ERR) and the eBPF driver hook (kprobe ib_dispatch_event) both
    report it; after the heal the failover trace lists every source that saw it (netlink,
    verbs, the eBPF hook, sysfs's link_downed), the first one and the others' delays."""
    nic = 1
    ifname = lab.ifname(nic)
    agent.wait_log("ebpf.rdma:ib_event", 2 * EBPF_TIMEOUT_S, "eBPF RDMA hooks")
    ib_line = next(ln for ln in agent.text().splitlines() if "ebpf.rdma:ib_event" in ln)
    assert "attached (kprobe:ib_dispatch_event)" in ib_line, ib_line
    lab.carrier_down(AGENT_NODE, nic, "local")
    agent.wait_log(f"{ifname}: up -> down (carrier", 90, "carrier loss")
    nics = _wait_table(lab, lambda n: n[ifname]["state"] == "down", 60, f"{ifname} not down")
    assert nics[ifname]["reason"] in ("carrier", "port_state"), nics
    assert all(n["state"] == "up" for name, n in nics.items() if name != ifname), nics
    agent.wait_log(f"{ifname}: carrier_down from verbs", 60, "verbs async event")
    agent.wait_log(f"{ifname}: carrier_down from ebpf.rdma", 60, "eBPF driver hook")
    lab.heal(nic)  # carrier up: the NIC recovers and its failover trace ends
    deadline = time.monotonic() + 120
    while True:
        roots = [
            s
            for s in _spans(agent.traces)
            if s["name"] == "railhop.failover" and _attrs(s).get("network.interface.name") == ifname
        ]
        if roots:
            break
        assert time.monotonic() < deadline, f"no trace for {ifname}: {agent.text()[-2000:]}"
        time.sleep(1.0)
    at = _attrs(roots[0])
    sources = at["railhop.failover.witness.sources"]
    assert {"netlink", "verbs", "ebpf.rdma", "sysfs"} <= set(sources), at
    offsets = at["railhop.failover.witness.offsets_ms"]
    assert len(offsets) == len(sources) and offsets[0] == 0.0, at
    assert list(offsets) == sorted(offsets), at
    assert at["railhop.failover.first_source"] == sources[0]
    kinds = dict(zip(sources, at["railhop.failover.witness.signals"], strict=True))
    assert kinds["verbs"] == kinds["ebpf.rdma"] == kinds["netlink"] == "carrier_down", kinds
    assert kinds["sysfs"] == "counter_breach", kinds
    seen = [e["name"] for e in roots[0].get("events", []) if e["name"].startswith("seen by ")]
    assert seen == [f"seen by {s}" for s in sources], seen


def _hw_counter(lab: VmLab, node: int, nic: int, name: str) -> int:
    path = f"/sys/class/infiniband/rxe{nic}/ports/1/hw_counters/{name}"
    return int(lab.guests[node].sh(f"cat {path}", timeout=60).stdout.split()[0])


def test_a_blackhole_under_rc_traffic_is_seen_from_the_rdma_side(
    lab: VmLab, agent: GuestAgent
) -> None:
    """Carrier up on both ends, everything dropped on node 0's nic2 while an RC queue pair
    writes over it (railhop-verbs-check, 1.07 s a try, 3 retries: ibv_rc_pingpong's retry_cnt
    7 retries forever on rxe and never gives up): no netlink or verbs event tells, but the
    queue pair gives up (IBV_WC_RETRY_EXC_ERR, rxe's retry_exceeded_err in sysfs hw_counters)
    and the agent marks the NIC SUSPECT for counters, the other NICs up."""
    tool = str(verbs_check_path())
    nic = 2
    ifname = lab.ifname(nic)
    names = lab.guests[AGENT_NODE].sh(f"ls {HW.format(nic=nic)}", timeout=60).stdout.split()
    assert {*RXE_COUNTERS, "completer_retry_err"} <= set(names), names
    exceeded0 = _hw_counter(lab, AGENT_NODE, nic, "retry_exceeded_err")
    retries0 = _hw_counter(lab, AGENT_NODE, nic, "completer_retry_err")
    env = {"RAILHOP_IB_TIMEOUT": "18", "RAILHOP_IB_RETRY_CNT": "3"}
    progress = lab.shared / "agent-rdma-verbs-recv.err"
    progress.unlink(missing_ok=True)
    dev, port = f"rxe{nic}", "18611"
    recv = lab.guests[1].start(
        [tool, "recv", dev, lab.address(1, nic), port, str(1 << 20), "1000000", "8"],
        env=env,
        stderr=progress,
        timeout=240,
    )
    a0, a1, size = lab.address(0, nic), lab.address(1, nic), str(1 << 20)
    send = lab.guests[AGENT_NODE].start(
        [tool, "send", dev, a0, a1, port, size, "1000000"], env=env, timeout=240
    )
    try:
        deadline = time.monotonic() + 120
        while sum(1 for ln in _lines(progress) if ln.startswith("round ")) < 3:
            assert not send.done() and not recv.done(), (send.wait(), recv.wait())
            assert time.monotonic() < deadline, "no RC traffic over verbs"
            time.sleep(0.5)
        before = len(agent.text())
        lab.blackhole(AGENT_NODE, nic)
        s = send.wait()
        assert s.rc == 3 and not s.timed_out, s  # the lane failed: its queue pair gave up
        fail = json.loads([ln for ln in s.stdout.splitlines() if ln.startswith("{")][-1])["fail"]
        assert fail["status"] == IBV_WC_RETRY_EXC_ERR, fail
        assert _hw_counter(lab, AGENT_NODE, nic, "retry_exceeded_err") > exceeded0
        assert _hw_counter(lab, AGENT_NODE, nic, "completer_retry_err") > retries0
        needle = f"{ifname}: up -> suspect (counter breach retry_exceeded_err"
        deadline = time.monotonic() + 60
        while needle not in agent.text()[before:]:
            assert time.monotonic() < deadline, f"no {needle!r}: {agent.text()[before:][-3000:]}"
            time.sleep(0.5)
        nics = _wait_table(
            lab,
            lambda n: (
                n[ifname]["state"] in ("suspect", "down") and n[ifname]["reason"] == "counters"
            ),
            60,
            f"{ifname} not suspect for counters",
        )
        assert all(n["state"] == "up" for name, n in nics.items() if name != ifname), nics
        # carrier stayed up: nothing from netlink or verbs about this NIC
        assert f"{ifname}: carrier_down from" not in agent.text()
    finally:
        send.kill()
        recv.kill()


def _lines(p: Path) -> list[str]:
    try:
        return p.read_text(errors="replace").splitlines()
    except OSError:
        return []
