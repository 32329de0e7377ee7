"""Shared pytest configuration.

Tests marked ``privileged`` need root (network namespaces, veth, tc, eBPF). Outside CI they are
skipped without root; in CI (``CI`` set) a missing prerequisite is a failure, never a skip.
"""

from __future__ import annotations

import os

import pytest


def in_ci() -> bool:
    return os.environ.get("CI", "").lower() not in ("", "0", "false", "no")


def require(condition: bool, why: str) -> None:
    """Skip (locally) or fail (in CI) when a prerequisite of a privileged test is missing."""
    if condition:
        return
    if in_ci():
        pytest.fail(f"prerequisite missing in CI: {why}", pytrace=False)
    pytest.skip(why)


@pytest.fixture(autouse=True)
def _privileged_gate(request: pytest.FixtureRequest) -> None:
    if request.node.get_closest_marker("privileged") is not None:
        require(os.geteuid() == 0, "needs root (netns, veth, tc, eBPF)")
