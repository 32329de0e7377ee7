"""``railhop status`` rendering of a table snapshot."""

from __future__ import annotations

from pathlib import Path

from railhop.control import Backup, NicHealth, NicState, Reason, TableWriter, read_table
from railhop.control.status import format_status


def test_format_status(tmp_path: Path) -> None:
    w = TableWriter(tmp_path / "health.tbl", heartbeat_ms=100, clock=lambda: 10_000_000_000)
    w.publish(
        [
            NicHealth("nic0", NicState.UP, 1_000_000_000, rail=0, pci="0000:17:00.0"),
            NicHealth("nic1", NicState.DOWN, 9_000_000_000, Reason.CARRIER, rail=1),
        ],
        {"nic1": [Backup("nic0", remote_rail=1, weight=7), Backup("nic0", weight=1)]},
    )
    snap = read_table(tmp_path / "health.tbl")
    text = format_status(snap, 10_500_000_000)
    lines = text.splitlines()
    assert lines[0].startswith(f"agent pid {snap.agent_pid} generation 1: alive; publish #1")
    assert lines[2].split()[:6] == ["nic0", "0", "up", "9.5s", "none", "0000:17:00.0"]
    assert lines[3].split()[:6] == ["nic1", "1", "down", "1.5s", "carrier", "-"]
    assert lines[3].endswith("nic0(rail 1, w 7), nic0(rail *, w 1)")
    assert "silent for 5.0s" in format_status(snap, 15_000_000_000)
    w.mark_gone()
    assert "gone" in format_status(read_table(tmp_path / "health.tbl"), 10_500_000_000)
    w.close()
