"""The node-problem-detector check ``deploy/helm/railhop/files/railhop-check.sh``, run by busybox
``sh`` with nothing but ``date`` on PATH (what NPD's own container has: no Python, no railhop)
against a live ``railhop agent`` in an emulated node with 4 veth NICs and a policy whose
``health.min_rails_up`` is 3 (root):

- no agent yet: 3 (unknown, no file);
- every NIC up: 0; one NIC down: still 0 (3 of 4 is the minimum); a second down (one local
  ``ip link set down``, one carrier loss at the spine's end): 1 naming both; healed: 0;
- the NFD feature file the agent writes (``--nfd-features-dir``) follows: degraded=true/false;
- the agent SIGKILLed (no clean-up): 3 once the heartbeat is older than the bound (refresh 1 s:
  10 s), polled, never slept for;
- the agent restarted, then stopped with SIGTERM: 3 at once ("shut down"), NFD file removed.
The rule as NPD runs it: ``rule_argv()`` from ``files/npd-railhop.json`` with the status
file's path rewritten to this test's run directory."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from conftest import require, until
from railhop_lab.fabric import Fabric, unique_prefix

pytestmark = pytest.mark.privileged

REPO = Path(__file__).resolve().parents[2]
NPD = REPO / "deploy/helm/railhop/files/npd-railhop.json"
STATUS_IN_NPD = "/run/railhop/node-status"  # where the rule reads it (NPD's hostPath mount)


@pytest.fixture(scope="module")
def fab() -> Iterator[Fabric]:
    with Fabric(nodes=2, nics=4, rate_mbit=200, prefix=unique_prefix("rhnpc")) as f:
        yield f


def rule_argv(status: Path) -> list[str]:
    """The shipped rule's command, with busybox as its /bin/sh, the chart's script for the
    ConfigMap's copy, and this test's run directory for the host's /run/railhop."""
    (rule,) = [r for r in json.loads(NPD.read_text())["rules"] if r["type"] == "permanent"]
    assert rule["path"] == "/bin/sh"
    script, path = rule["args"]
    assert Path(script).name == "railhop-check.sh" and path == STATUS_IN_NPD
    busybox = shutil.which("busybox")
    require(busybox is not None, "no busybox (Debian: busybox-static)")
    assert busybox is not None
    return [busybox, "sh", str(REPO / "deploy/helm/railhop/files/railhop-check.sh"), str(status)]


def run_rule(argv: list[str]) -> tuple[int, str]:
    r = subprocess.run(
        argv, env={"PATH": "/usr/bin:/bin"}, capture_output=True, text=True, timeout=30, check=False
    )
    assert r.stderr == "" and r.stdout.count("\n") == 1, (r.stdout, r.stderr)
    return r.returncode, r.stdout.strip()


class LiveAgent:
    def __init__(self, fab: Fabric, tmp: Path, run_dir: Path, nfd: Path) -> None:
        policy = tmp / "policy.yaml"
        policy.write_text("version: 1\nname: min3\nhealth:\n  min_rails_up: 3\n")
        argv = [
            sys.executable, "-m", "railhop", "agent", "--run-dir", str(run_dir),
            "--nic", "nic0,nic1,nic2,nic3", "--sources", "netlink", "--policy", str(policy),
            "--heartbeat-ms", "100", "--node-status-interval", "1",
            "--nfd-features-dir", str(nfd), "--no-traces", "--duration", "300",
        ]  # fmt: skip
        env = {**os.environ, "PYTHONPATH": str(REPO / "agent")}
        self.log = tmp / "agent.log"
        with self.log.open("a") as err:
            self.proc: subprocess.Popen[Any] = fab.popen(0, argv, env, stderr=err)

    def alive(self) -> None:
        assert self.proc.poll() is None, self.log.read_text()[-3000:]

    def stop(self, sig: int = signal.SIGTERM) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            return self.proc.wait(15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait(5)


def test_npd_check_against_a_live_agent_with_busybox(fab: Fabric, tmp_path: Path) -> None:
    run_dir, nfd = tmp_path / "run", tmp_path / "features.d"
    status = run_dir / "node-status"
    argv = rule_argv(status)
    code, msg = run_rule(argv)
    assert code == 3 and msg.startswith("unknown: no railhop node status"), msg

    last: list[tuple[int, str]] = [(-1, "")]

    def says(agent: LiveAgent | None, want: int, *words: str) -> bool:
        if agent is not None:
            agent.alive()
        last[0] = run_rule(argv)
        code, msg = last[0]
        return code == want and all(w in msg for w in words)

    def label(name: str) -> str | None:
        try:
            lines = (nfd / "railhop").read_text().splitlines()
        except FileNotFoundError:
            return None
        return next(
            (x.split("=", 1)[1] for x in lines if x.startswith(f"railhop.io/{name}=")), None
        )

    agent = LiveAgent(fab, tmp_path, run_dir, nfd)
    try:
        until(lambda: says(agent, 0, "ok: 4 of 4 rails up (policy wants 3)"), 60, f"up: {last}")
        assert label("degraded") == "false" and label("rails-up") == "4"
        fab.carrier_down(0, 2, end="local")
        until(lambda: says(agent, 0, "ok: 3 of 4", "nic2 down (carrier)"), 30, f"nic2: {last}")
        fab.carrier_down(0, 3, end="remote")
        until(lambda: says(agent, 1, "degraded: 2 of 4 rails up (policy wants 3)"), 30, str(last))
        assert "nic2 down (carrier), nic3 down (carrier)" in last[0][1]
        assert "nic0" not in last[0][1] and "nic1" not in last[0][1]
        until(lambda: label("degraded") == "true", 10, "NFD label degraded=true")
        assert label("rails-up") == "2" and label("min-rails-up") == "3"
        fab.heal(0, 2)
        fab.heal(0, 3)
        until(lambda: says(agent, 0, "ok: 4 of 4", "not up: none"), 60, f"healed: {last}")
        until(lambda: label("degraded") == "false", 10, "NFD label degraded=false")

        # SIGKILL: no clean-up, the file keeps saying "ok": the heartbeat's age decides
        agent.stop(signal.SIGKILL)
        t_kill = time.monotonic()
        until(lambda: says(None, 3, "heartbeat is", "s old (bound 10 s)"), 30, f"stale: {last}")
        assert time.monotonic() - t_kill > 5  # not before the bound (10 s, less the last age)
        assert "verdict ok" in status.read_text()  # what the dead agent left

        # a new agent takes over the file; a clean stop says "gone" at once
        agent = LiveAgent(fab, tmp_path, run_dir, nfd)
        until(lambda: says(agent, 0, "ok: 4 of 4"), 60, f"restarted: {last}")
        assert agent.stop(signal.SIGTERM) == 0
        code, msg = run_rule(argv)
        assert code == 3 and "shut down" in msg, msg
        assert not (nfd / "railhop").exists()
    finally:
        agent.stop()
        fab.heal_all()
