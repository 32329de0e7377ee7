"""``railhop status`` rendering of a table snapshot."""

from __future__ import annotations

from pathlib import Path

from railhop.control import (
    Backup,
    EventType,
    LaneEvent,
    NicHealth,
    NicState,
    Reason,
    TableWriter,
    read_table,
)
from railhop.control.status import format_lanes, format_status, read_status_doc, status_to_dict
from railhop.daemon import LaneBook, write_status


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


def test_status_shows_lanes_and_failovers(tmp_path: Path) -> None:
    w = TableWriter(tmp_path / "health.tbl", heartbeat_ms=100, clock=lambda: 10_000_000_000)
    w.publish([NicHealth("nic0", NicState.UP, 1_000_000_000, rail=0)], {})
    snap = read_table(tmp_path / "health.tbl")
    book = LaneBook()
    book.update(
        LaneEvent(
            EventType.LANE_UP, 1, "nic0", conn_id=1, local_ports=(5001,), remote_ports=(4000,)
        ),
        77,
    )
    book.update(LaneEvent(EventType.LANE_UP, 1, "nic0", conn_id=2, lane=0), 78)
    book.update(
        LaneEvent(EventType.FAILOVER_START, 1, "nic1", conn_id=0xAB, t_ns=9_000_000_000, error=110),
        77,
    )
    book.update(
        LaneEvent(EventType.FAILOVER_END, 1, "nic1", conn_id=0xAB, duration_ns=3_250_000), 77
    )
    path = tmp_path / "status.json"
    write_status(path, book.status(agent_pid=snap.agent_pid, now_ns=10_000_000_000))
    assert not list(tmp_path.glob(".status.json.*"))  # temp file renamed away
    doc = read_status_doc(path)
    assert doc is not None
    text = format_status(snap, 10_500_000_000, lanes=doc)
    lines = text.splitlines()
    i = lines.index("")
    assert lines[i + 1].split() == ["NIC", "lanes", "conns", "procs"]
    assert lines[i + 2].split() == ["nic0", "2", "2", "2"]
    assert lines[i + 3] == "failovers 1, fail-backs 0; recent:"
    assert lines[i + 4].split() == [
        "1.5s",
        "ago",
        "failover",
        "nic1",
        "pid",
        "77",
        "conn",
        f"{0xAB:016x}",
        "in",
        "3.2",
        "ms",
        "errno",
        "110",
    ]
    # another agent's file (a restart) is not shown; garbage is not a status
    assert "lanes" not in format_status(snap, 10_500_000_000, lanes={**doc, "agent_pid": 1})
    path.write_text("{not json")
    assert read_status_doc(path) is None
    assert read_status_doc(tmp_path / "missing.json") is None
    assert format_lanes({"version": 1, "nics": "junk", "recent": [1, "x"]}, 0)[1] == (
        "(no lanes reported by plugins)"
    )
    w.close()


def test_status_json_and_exit_codes(tmp_path: Path) -> None:
    """``railhop status --json``: the table's facts as one document; no table is a finding
    (exit 1), a bad option a usage error (exit 2)."""
    import json

    from click.testing import CliRunner

    from railhop.cli import cli

    w = TableWriter(tmp_path / "health.tbl", heartbeat_ms=100, clock=lambda: 10_000_000_000)
    w.publish(
        [
            NicHealth("nic0", NicState.UP, 1_000_000_000, rail=0, pci="0000:17:00.0"),
            NicHealth("nic1", NicState.DOWN, 9_000_000_000, Reason.CARRIER, rail=1),
        ],
        {"nic1": [Backup("nic0", remote_rail=1, weight=7)]},
    )
    snap = read_table(tmp_path / "health.tbl")
    doc = status_to_dict(snap, 10_500_000_000)
    assert doc["agent"]["liveness"] == "alive" and doc["agent"]["pid"] == snap.agent_pid
    assert doc["agent"]["heartbeat_age_s"] == 0.5
    assert doc["nics"][1] == {
        "ifname": "nic1",
        "rail": 1,
        "state": "down",
        "since_age_s": 1.5,
        "reason": "carrier",
        "pci": None,
        "numa": None,
        "speed_mbps": 0,
        "backups": [{"nic": "nic0", "remote_rail": 1, "weight": 7, "distance": None}],
    }
    assert doc["status"] is None
    assert status_to_dict(snap, 15_000_000_000)["agent"]["liveness"] == "silent"

    r = CliRunner().invoke(cli, ["status", "--json", "--run-dir", str(tmp_path)])
    # the writer's clock is fake (10 s of monotonic time): the real now finds it silent
    out = json.loads(r.stdout)
    assert [n["ifname"] for n in out["nics"]] == ["nic0", "nic1"]
    assert out["agent"]["liveness"] in ("alive", "silent") and r.exit_code == 0
    r = CliRunner().invoke(cli, ["status", "--json", "--check", "--run-dir", str(tmp_path)])
    assert r.exit_code == (0 if json.loads(r.stdout)["agent"]["alive"] else 1)
    w.close()
    r = CliRunner().invoke(cli, ["status", "--run-dir", str(tmp_path / "none")])
    assert r.exit_code == 1 and "no agent table" in r.stderr
    r = CliRunner().invoke(cli, ["status", "--bogus"])
    assert r.exit_code == 2
