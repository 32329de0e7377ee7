"""The railhop agent in a guest of the VM lab (:mod:`vmlab`): start it, wait until it is up.

The agent runs in a guest as on a node (``railhop agent --nic nic0,... --sources ...``) with its
run directory in the guest's own ``/tmp`` (the shared directory is 9p, which cannot hold the
agent's unix socket). A plugin in the same guest reaches it through ``RAILHOP_RUN_DIR`` set to
the same path (:data:`AGENT_RUN_DIR`). Its stdout and stderr go to the shared directory, so the
host can read the agent's log while it runs.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from railhop_lab.vmlab import GuestJob, VmLab, VmLabError

AGENT_RUN_DIR = "/tmp/railhop-agent"  # in each guest's own /tmp
# the sources that start in seconds under emulation (bcc compiles each eBPF program for minutes)
FAST_SOURCES = ("netlink", "sysfs", "verbs")


def railhop_cli() -> str:
    """The ``railhop`` command of the interpreter running this (the guests see the host's root)."""
    return str(Path(sys.executable).parent / "railhop")


def agent_status(lab: VmLab, node: int, run_dir: str = AGENT_RUN_DIR) -> dict[str, Any] | None:
    """``railhop status --json`` in ``node``; None while no agent answers."""
    r = lab.guests[node].run([railhop_cli(), "status", "--json", "--run-dir", run_dir], timeout=120)
    if r.rc != 0 or not r.stdout.strip():
        return None
    doc: dict[str, Any] = json.loads(r.stdout)
    return doc


def nic_states(doc: dict[str, Any] | None) -> dict[str, str]:
    """ifname -> state from a status document ({} for None)."""
    return {n["ifname"]: n["state"] for n in doc["nics"]} if doc else {}


class GuestAgent:
    """One agent in one guest. ``start()``, ``wait_up()``, ``stop()``; a context manager."""

    def __init__(
        self,
        lab: VmLab,
        node: int,
        *,
        sources: Sequence[str] = FAST_SOURCES,
        run_dir: str = AGENT_RUN_DIR,
        duration: float = 1800.0,
    ) -> None:
        self.lab = lab
        self.node = node
        self.sources = tuple(sources)
        self.run_dir = run_dir
        self.duration = duration
        self.log = lab.shared / f"agent-{node}.err"
        self.job: GuestJob | None = None

    def start(self) -> GuestAgent:
        if self.job is not None:
            raise VmLabError(f"node {self.node}: agent already started")
        nics = ",".join(self.lab.ifname(i) for i in range(self.lab.nics))
        argv = [railhop_cli(), "agent", "--nic", nics, "--sources", ",".join(self.sources)]
        argv += ["--run-dir", self.run_dir, "--no-traces", "--duration", f"{self.duration:g}"]
        self.job = self.lab.guests[self.node].start(
            argv,
            timeout=self.duration + 60,
            stdout=self.lab.shared / f"agent-{self.node}.out",
            stderr=self.log,
        )
        return self

    def log_text(self) -> str:
        try:
            return self.log.read_text(errors="replace")
        except OSError:
            return ""

    def wait_up(self, timeout: float = 240.0) -> dict[str, Any]:
        """Wait until the agent is alive with every NIC up in its table (bounded)."""
        if self.job is None:
            raise VmLabError(f"node {self.node}: agent not started")
        deadline = time.monotonic() + timeout
        want = {self.lab.ifname(i): "up" for i in range(self.lab.nics)}
        while True:
            doc = agent_status(self.lab, self.node, self.run_dir)
            if doc is not None and doc["agent"]["alive"] and nic_states(doc) == want:
                return doc
            if self.job.done():
                raise VmLabError(
                    f"node {self.node}: agent exited: {self.job.wait()} {self.log_text()[-3000:]}"
                )
            if time.monotonic() > deadline:
                raise VmLabError(
                    f"node {self.node}: agent not up in {timeout} s: {nic_states(doc)} "
                    f"{self.log_text()[-3000:]}"
                )
            time.sleep(1.0)

    def wait_state(self, ifname: str, state: str, timeout: float) -> None:
        """Wait until the agent's table holds ``ifname`` in ``state`` (bounded)."""
        deadline = time.monotonic() + timeout
        while True:
            states = nic_states(agent_status(self.lab, self.node, self.run_dir))
            if states.get(ifname) == state:
                return
            if time.monotonic() > deadline:
                raise VmLabError(f"node {self.node}: {ifname} not {state} in {timeout} s: {states}")
            time.sleep(0.5)

    def stop(self) -> None:
        if self.job is not None and not self.job.done():
            self.job.kill()

    def __enter__(self) -> GuestAgent:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
