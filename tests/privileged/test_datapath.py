"""The plugin's data path through the harness on the emulated fabric (root; every byte checked).

The harness (railhop-harness) drives the plugin like NCCL's proxy thread; the receiver verifies
every byte and the size of every message. Run from the source tree after `make ctest` with
RAILHOP_PLUGIN_PATH=build/ctest/plugin/libnccl-net-railhop.so and
RAILHOP_HARNESS_PATH=build/ctest/plugin/railhop-harness.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence

import pytest

from conftest import require, require_built
from railhop_lab.fabric import Fabric, unique_prefix
from railhop_lab.harness import HarnessConfig, HarnessResult, run_pair

pytestmark = pytest.mark.privileged

MiB = 1 << 20

# Every test runs over both lane transports: TCP sockets and libfabric (FI_EP_MSG + FI_RMA
# writes with immediate data) through its tcp provider (docs/transports.md).
TRANSPORTS = {
    "tcp": {"RAILHOP_TRANSPORT": "tcp"},
    "ofi": {"RAILHOP_TRANSPORT": "ofi", "FI_PROVIDER": "tcp"},
}


def expected_bytes(sizes: Sequence[int], count: int) -> int:
    return sum(sizes[k % len(sizes)] for k in range(count))


@pytest.fixture(scope="module")
def built() -> None:
    require(os.geteuid() == 0, "needs root (netns, veth, tc)")  # module fixtures run first
    require_built()


@pytest.fixture(scope="module", params=sorted(TRANSPORTS))
def lanes(request: pytest.FixtureRequest) -> dict[str, str]:
    """The harness environment selecting the lane transport."""
    return TRANSPORTS[str(request.param)]


@pytest.fixture(scope="module")
def fab(built: None) -> Iterator[Fabric]:
    with Fabric(nodes=2, nics=4, prefix=unique_prefix("rhtd")) as f:
        yield f


def check_count_run(res: HarnessResult, conns: int, sizes: Sequence[int], count: int) -> None:
    assert res.ok, res.describe()
    per_conn = expected_bytes(sizes, count)
    for side in (res.send, res.recv):
        s = side.summary
        assert s is not None, res.describe()
        assert s.msgs == conns * count, res.describe()
        assert s.bytes == conns * per_conn, res.describe()
        assert s.data_errors == 0 and s.request_errors == 0
    last = res.recv.progress[-1] if res.recv.progress else None
    if last is not None and len(last.per_conn) == conns:
        assert all(b <= per_conn for b in last.per_conn)


def test_many_connections_eight_in_flight(fab: Fabric, lanes: dict[str, str]) -> None:
    conns, sizes, count = 16, (MiB,), 24
    cfg = HarnessConfig(conns=conns, sizes=sizes, count=count, inflight=8, deadline=60, seed=1)
    check_count_run(run_pair(fab, cfg, env=lanes), conns, sizes, count)


def test_mixed_sizes_zero_to_64mib(fab: Fabric, lanes: dict[str, str]) -> None:
    sizes = (0, 1, 4095, 65537, MiB, 64 * MiB, 0, 3 * MiB + 17)
    conns, count = 2, len(sizes) + 3
    cfg = HarnessConfig(conns=conns, sizes=sizes, count=count, inflight=8, deadline=90, seed=2)
    check_count_run(run_pair(fab, cfg, env=lanes), conns, sizes, count)


def test_many_small_messages(fab: Fabric, lanes: dict[str, str]) -> None:
    conns, sizes, count = 8, (1, 100, 4096, 0), 1500
    cfg = HarnessConfig(conns=conns, sizes=sizes, count=count, inflight=8, deadline=60, seed=3)
    check_count_run(run_pair(fab, cfg, env=lanes), conns, sizes, count)


@pytest.mark.parametrize("group", [2, 8])
def test_grouped_receives(fab: Fabric, lanes: dict[str, str], group: int) -> None:
    conns, sizes, count = 4, (0, 8192, MiB, 77), 8 * group
    cfg = HarnessConfig(
        conns=conns, sizes=sizes, count=count, grouped=group, inflight=8, deadline=60, seed=4
    )
    check_count_run(run_pair(fab, cfg, env=lanes), conns, sizes, count)


def test_same_host_connections(fab: Fabric, lanes: dict[str, str]) -> None:
    conns, sizes, count = 4, (0, 4096, 2 * MiB), 30
    cfg = HarnessConfig(conns=conns, sizes=sizes, count=count, deadline=60, seed=5)
    check_count_run(run_pair(fab, cfg, send_node=0, recv_node=0, env=lanes), conns, sizes, count)


def test_one_device_many_connections(fab: Fabric, lanes: dict[str, str]) -> None:
    conns, sizes, count = 12, (256 * 1024,), 16
    cfg = HarnessConfig(conns=conns, devs=(2,), sizes=sizes, count=count, deadline=60, seed=6)
    res = run_pair(fab, cfg, env=lanes)
    check_count_run(res, conns, sizes, count)


@pytest.mark.parametrize("api", [8, 9, 10, 11, 12])
def test_every_api_version(fab: Fabric, lanes: dict[str, str], api: int) -> None:
    conns, sizes, count = 4, (0, 12345, MiB), 9
    cfg = HarnessConfig(conns=conns, sizes=sizes, count=count, api=api, deadline=60, seed=api)
    check_count_run(run_pair(fab, cfg, env=lanes), conns, sizes, count)


def test_duration_mode_moves_everything_it_sends(fab: Fabric, lanes: dict[str, str]) -> None:
    cfg = HarnessConfig(conns=4, sizes=(MiB, 4096), duration=1.5, deadline=30, seed=7)
    res = run_pair(fab, cfg, env=lanes)
    assert res.ok, res.describe()
    assert res.send.summary is not None and res.recv.summary is not None
    assert res.recv.summary.msgs == res.send.summary.msgs > 0
    assert res.recv.summary.bytes == res.send.summary.bytes > 0
    assert 1.2 <= res.recv.summary.elapsed_s <= 15
    # the progress lines add up to the summary
    assert res.recv.progress and res.recv.progress[-1].bytes <= res.recv.summary.bytes
    assert sum(res.recv.progress[-1].per_conn) == res.recv.progress[-1].bytes
