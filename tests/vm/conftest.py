"""Fixtures shared by the VM lab's suites (tests/vm).

One boot of the two Soft-RoCE guests serves every VM test of the session: a boot under
emulation takes about a minute on two busy cores, so each module booting its own lab cost CI
minutes for nothing. Each test leaves the rails healed for the next (``_healed``). Needs root,
QEMU, virtme-ng and a Debian kernel with rxe under /boot (``make setup``); in CI a missing
prerequisite fails the test instead of skipping it.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator

import pytest

from conftest import require
from railhop_lab.vmlab import VmLab, VmLabError, find_guest_kernel, find_vng


@pytest.fixture(scope="session")
def lab() -> Iterator[VmLab]:
    require(os.geteuid() == 0, "needs root")
    require(shutil.which("qemu-system-x86_64") is not None, "no qemu-system-x86_64 (make setup)")
    try:
        find_vng()
        find_guest_kernel()
    except VmLabError as e:
        require(False, str(e))
    with VmLab(nics=4) as vm:
        yield vm


@pytest.fixture(autouse=True)
def _healed(request: pytest.FixtureRequest) -> Iterator[None]:
    yield
    if "lab" in request.fixturenames:
        request.getfixturevalue("lab").heal_all()
