"""bench/vm_verbs_ratio.py's parser of ib_write_bw's report, without guests."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"

OUT = """\
---------------------------------------------------------------------------------------
                    RDMA_Write BW Test
 Dual-port       : OFF		Device         : rxe0
 Link type       : Ethernet
 GID index       : 1
---------------------------------------------------------------------------------------
 #bytes     #iterations    BW peak[Gb/sec]    BW average[Gb/sec]   MsgRate[Mpps]
 1048576    123              0.000000            0.104211            0.000012
---------------------------------------------------------------------------------------
"""


@pytest.fixture(scope="module")
def vb() -> Iterator[ModuleType]:
    sys.path.insert(0, str(BENCH))
    try:
        import vm_verbs_ratio

        yield vm_verbs_ratio
    finally:
        sys.path.remove(str(BENCH))


def test_parse_takes_the_average_column(vb: ModuleType) -> None:
    assert vb.parse_ib_write_bw(OUT) == pytest.approx(0.104211)


def test_parse_without_a_result_row_says_so(vb: ModuleType) -> None:
    with pytest.raises(ValueError, match="no result row"):
        vb.parse_ib_write_bw("Couldn't connect to 10.77.0.2:18515\n")
