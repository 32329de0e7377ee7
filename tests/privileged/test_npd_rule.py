"""``railhop status --check --nics``, the node-problem-detector check for hosts where railhop is
installed (a systemd node, an NPD image with railhop), against a live agent in an emulated node
(root): exit 0 with every NIC up, 1 naming the NIC when one is set down (``ip link set down``)
or loses carrier at the remote end, 0 again once healed, and 3 (NPD's "unknown") with no agent.
The command reads the agent's table through RAILHOP_RUN_DIR and finds ``railhop`` on PATH. The
rule the chart ships (``files/npd-railhop.json``) runs ``files/railhop-check.sh`` with
``/bin/sh`` instead (NPD's own image has no railhop): tests/privileged/test_npd_check_live.py."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from conftest import until
from railhop_lab.fabric import Fabric, unique_prefix

pytestmark = pytest.mark.privileged

REPO = Path(__file__).resolve().parents[2]
AGENT = """
import sys
from pathlib import Path
from railhop import daemon, logfmt
logfmt.configure(20, "text")
cfg = daemon.AgentConfig(
    run_dir=Path(sys.argv[1]), nics=("nic0", "nic1", "nic2", "nic3"), sources=("netlink",),
    heartbeat_ms=100, duration_s=300)
sys.exit(daemon.run_agent(cfg))
"""


@pytest.fixture(scope="module")
def fab() -> Iterator[Fabric]:
    with Fabric(nodes=2, nics=4, rate_mbit=200, prefix=unique_prefix("rhnpd")) as f:
        yield f


def rule_argv() -> list[str]:
    return ["/usr/bin/env", "railhop", "status", "--check", "--nics"]


def run_rule(run_dir: Path) -> tuple[int, str]:
    """The command as NPD would run it: its stdout is the condition's message."""
    env = {
        **os.environ,
        "PATH": f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}",
        "PYTHONPATH": str(REPO / "agent"),
        "RAILHOP_RUN_DIR": str(run_dir),
    }
    r = subprocess.run(
        rule_argv(), env=env, capture_output=True, text=True, timeout=30, check=False
    )
    return r.returncode, r.stdout.strip()


def test_npd_rule_against_a_live_agent(fab: Fabric, tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    code, msg = run_rule(run_dir)
    assert code == 3 and msg.startswith("unknown:"), msg  # no agent ever ran here

    log = tmp_path / "agent.log"
    env = {**os.environ, "PYTHONPATH": str(REPO / "agent")}
    with log.open("w") as err:
        agent: subprocess.Popen[Any] = fab.popen(
            0, [sys.executable, "-c", AGENT, str(run_dir)], env, stderr=err
        )
    last: list[tuple[int, str]] = []

    def rule_says(want: int, *words: str) -> bool:
        assert agent.poll() is None, log.read_text()[-3000:]
        last[:] = [run_rule(run_dir)]
        code, msg = last[0]
        return code == want and all(w in msg for w in words)

    try:
        until(lambda: rule_says(0, "ok: 4 of 4 rails up"), 60, f"all up: {last}")
        for end in ("local", "remote"):  # ip link set down; carrier loss at the spine's end
            fab.carrier_down(0, 2, end=end)
            until(lambda: rule_says(1, "nic2 down"), 30, f"nic2 {end} down: {last}")
            code, msg = last[0]
            assert "\n" not in msg and "3 of 4 rails up" in msg
            assert "nic0" not in msg and "nic1" not in msg and "nic3" not in msg
            fab.heal(0, 2)
            until(lambda: rule_says(0, "ok: 4 of 4"), 60, f"nic2 healed ({end}): {last}")
    finally:
        agent.terminate()
        try:
            agent.wait(15)
        except subprocess.TimeoutExpired:
            agent.kill()
            agent.wait(5)
    code, msg = run_rule(run_dir)
    assert code == 3 and "not alive" in msg, msg  # the agent shut down: unknown
