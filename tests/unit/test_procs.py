"""railhop.procs: whether a process exists, its network namespace."""

from __future__ import annotations

import os
import subprocess
import sys

from railhop.procs import netns_ino, pid_alive


def test_pid_alive() -> None:
    assert pid_alive(os.getpid())
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait(30)  # reaped: the pid names no process now
    assert not pid_alive(child.pid)
    assert pid_alive(1)  # init: alive, whoever we are (EPERM counts as alive)


def test_netns_ino() -> None:
    assert netns_ino(os.getpid()) == os.stat("/proc/self/ns/net").st_ino
    assert netns_ino(os.getpid(), proc="/nonexistent") is None
