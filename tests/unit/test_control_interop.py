"""The Python agent and the C plugin code talk: the C reader (plugin/src/ctl.c) reads tables the
Python writer hammers (restart and shutdown included) and never accepts a torn copy; events sent
by the C sender arrive in the Python server field for field."""

from __future__ import annotations

import asyncio
import ipaddress
import json
import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from conftest import require
from railhop.control import (
    Backup,
    ControlPlane,
    Distance,
    EventType,
    NicHealth,
    NicState,
    NodeSettings,
    Reason,
    ReceivedEvent,
    TableWriter,
    layout,
)

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def test_ctl(tmp_path_factory: pytest.TempPathFactory) -> Path:
    cc = shutil.which("cc") or shutil.which("gcc")
    require(cc is not None, "no C compiler (make setup installs gcc)")
    out = tmp_path_factory.mktemp("ctl") / "test_ctl"
    subprocess.run(
        [
            cc,
            "-std=gnu11",
            "-O2",
            "-Wall",
            "-Wextra",
            "-Werror",
            f"-I{REPO / 'plugin/include'}",
            f"-I{REPO / 'plugin/src'}",
            str(REPO / "plugin/src/ctl.c"),
            str(REPO / "plugin/tests/test_ctl.c"),
            "-o",
            str(out),
            "-pthread",
        ],
        check=True,
        timeout=120,
    )
    return out


def pattern(k: int) -> tuple[list[NicHealth], dict[str, list[Backup]]]:
    """Publish k of the hammer pattern (mirrors pattern_fill() in plugin/tests/test_ctl.c)."""
    n = 4 + k % 5
    nics = [
        NicHealth(
            ifname=f"nic{i}",
            state=NicState(1 + (k + i) % 4),
            since_ns=k * 1000 + i,
            reason=Reason((k + i) % 11),
            rail=i,
            pci=f"{k % 10000:04d}:00:{i:02x}.0",
            numa=i % 2,
            speed_mbps=k % 100000,
        )
        for i in range(n)
    ]
    plans = {
        f"nic{i}": [
            Backup(
                f"nic{(i + j + 1) % n}",
                remote_rail=j,
                weight=(k + j) & 0xFFFF,
                distance=Distance(j % 5),
            )
            for j in range((k + i) % 16)
        ]
        for i in range(n)
    }
    return nics, plans


SETTINGS = NodeSettings(
    completion_ms=2000, probe_ms=400, failback_interval_ms=3000, migrate_on_suspect=True
)


def test_c_reader_never_accepts_a_torn_python_publish(test_ctl: Path, tmp_path: Path) -> None:
    seconds = 2.5
    reader = subprocess.Popen(
        [str(test_ctl), "--reader", str(tmp_path), str(seconds)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "RAILHOP_TEST_VERBOSE": "1"},
    )
    try:
        assert reader.stderr is not None
        assert "control plane in" in reader.stderr.readline()  # the reader is up: start writing
        published = 0
        for generation in (1, 2):  # the second writer is a restarted agent
            w = TableWriter(tmp_path / "health.tbl", heartbeat_ms=250, settings=SETTINGS)
            end = time.monotonic() + seconds / 3
            k = 0
            while time.monotonic() < end:
                k += 1
                w.publish(*pattern(k))
                w.heartbeat()
            published += k
            assert w.generation == generation
            if generation == 2:
                w.mark_gone()  # the reader must now refuse the table
            w.close()
        out, _ = reader.communicate(timeout=30)
    finally:
        reader.kill()
    res = json.loads(out)
    assert reader.returncode == 0, res
    assert res["bad"] == 0 and res["proto"] == 0
    assert res["generations"] == 2
    assert res["distinct"] > 10 and res["accepted"] > 10
    assert res["stale"] > 0  # after mark_gone (and before the first table)
    # the node policy's settings reach the plugin: completion, probe, fail-back ms, flags
    assert res["settings"] == [2000, 400, 3000, layout.S_MIGRATE_ON_SUSPECT]
    print(f"python writer: {published} publishes; C reader: {res}")


def test_c_sender_events_reach_the_python_server(test_ctl: Path, tmp_path: Path) -> None:
    n = 40

    async def body() -> tuple[list[ReceivedEvent], dict[str, int], int]:
        async with ControlPlane(tmp_path, heartbeat_ms=0) as cp:
            proc = await asyncio.create_subprocess_exec(
                str(test_ctl), "--send", str(tmp_path), str(n), stdout=asyncio.subprocess.PIPE
            )
            got: list[ReceivedEvent] = []
            async for rx in cp.events():
                got.append(rx)
                if len(got) == n:
                    break
            out, _ = await asyncio.wait_for(proc.communicate(), 30)
            return got, json.loads(out), cp.counters.malformed

    got, res, malformed = asyncio.run(asyncio.wait_for(body(), 60))
    assert res["sent"] == n and malformed == 0
    for i, rx in enumerate(got):
        e = rx.event
        assert rx.peer.pid == res["pid"] == e.pid
        assert rx.peer.uid == os.geteuid()
        assert e.type == EventType(1 + i % 7)
        assert e.nic == f"nic{i % 4}"
        assert e.remote_nic == (f"peer{i % 3}" if i % 2 else "")
        assert (e.conn_id, e.epoch, e.lane) == (1000 + i, 3 * i, i % 5)
        assert (e.duration_ns, e.error) == (1000 * i, 0 if i % 3 else 110)
        nports = i % 9
        assert e.local_ports == tuple(40000 + i + p for p in range(nports))
        assert e.remote_ports == tuple(50000 + i + p for p in range(nports))
        assert e.local_addr == ipaddress.IPv4Address(f"10.77.{i % 4}.1")
        assert e.remote_addr is None
        assert 0 < e.t_ns <= rx.recv_ns


POLICY_SETTINGS = NodeSettings(
    completion_ms=2000,
    rail_rule="allowed-pairs",
    rail_pairs=frozenset({frozenset((0, 1)), frozenset((2, 3))}),
    distance_limit=Distance.PHB,
    backup_lanes=5,
    min_rails_up=3,
)
FOUR = [NicHealth(f"nic{i}", NicState.UP, 1, rail=i) for i in range(4)]


def _dump(test_ctl: Path, run_dir: Path) -> dict[str, object]:
    r = subprocess.run(
        [str(test_ctl), "--dump", str(run_dir)],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert r.returncode == 0, r.stderr
    doc: dict[str, object] = json.loads(r.stdout)
    return doc


def test_c_reader_takes_the_policy_of_layout_minor_1(test_ctl: Path, tmp_path: Path) -> None:
    """A table written by this agent (layout 2, minor 1) read by the plugin's reader: the rail
    rule, distance limit, backup lanes, min_rails_up and each NIC's rail peers arrive."""
    w = TableWriter(tmp_path / "health.tbl", heartbeat_ms=250, settings=POLICY_SETTINGS)
    w.publish(FOUR, {})
    try:
        doc = _dump(test_ctl, tmp_path)
    finally:
        w.close()
    assert doc == {
        "layout_minor": 1,
        "rail_rule": layout.RAIL_RULE_CODES["allowed-pairs"],
        "distance_limit": int(Distance.PHB),
        "min_rails_up": 3,
        "backup_lanes": 5,
        "completion_ms": 2000,
        "rail_peers": [str(0b0011), str(0b0011), str(0b1100), str(0b1100)],
    }
    snap = layout.decode_table((tmp_path / "health.tbl").read_bytes())
    assert snap.layout_minor == 1 and snap.settings.rail_pairs == POLICY_SETTINGS.rail_pairs


def test_c_reader_ignores_those_bytes_in_a_minor_0_table(test_ctl: Path, tmp_path: Path) -> None:
    """A table of an agent from before minor 1 (layout_minor 0): the bytes that became settings
    were reserved there; the plugin must not take them for settings, even non-zero ones, and
    reads the rest as before."""
    w = TableWriter(tmp_path / "health.tbl", heartbeat_ms=250, settings=POLICY_SETTINGS)
    w.publish(FOUR, {})
    path = tmp_path / "health.tbl"
    image = bytearray(path.read_bytes())
    body_minor = layout.BODY_OFFSET + layout.offsets_of(layout.BODY_FIELDS)["layout_minor"]
    image[body_minor : body_minor + 2] = b"\0\0"
    n = len(FOUR)
    body = bytes(image[layout.BODY_OFFSET : layout.BODY_OFFSET + layout.BODY.size])
    nics = bytes(image[layout.NICS_OFFSET : layout.NICS_OFFSET + n * layout.NIC.size])
    plans = bytes(image[layout.PLANS_OFFSET : layout.PLANS_OFFSET + n * layout.PLAN_SIZE])
    crc = layout.payload_crc(body, nics, plans)
    image[layout.BODY_OFFSET : layout.BODY_OFFSET + 4] = crc.to_bytes(4, "little")
    with path.open("r+b") as f:  # in place: the writer's file, same inode
        f.write(image)
    try:
        doc = _dump(test_ctl, tmp_path)
    finally:
        w.close()
    assert doc == {
        "layout_minor": 0,
        "rail_rule": 0,
        "distance_limit": layout.NO_DISTANCE,
        "min_rails_up": 0,
        "backup_lanes": 0,
        "completion_ms": 2000,  # a layout-2 setting: still read
        "rail_peers": ["0", "0", "0", "0"],
    }
    snap = layout.decode_table(bytes(image))
    assert snap.layout_minor == 0 and snap.settings.rail_rule is None
    assert snap.settings.min_rails_up == 0 and snap.settings.completion_ms == 2000


def test_the_policy_reaches_the_table(tmp_path: Path) -> None:
    """node_settings(): what the policy file says is what the plugins get; rail_rule and
    distance_limit only when the file sets them."""
    from railhop.daemon.publish import node_settings
    from railhop.policy import load_policy

    p = tmp_path / "p.yaml"
    p.write_text(
        "version: 1\nrail_rule:\n  kind: allowed-pairs\n  groups: [[0, 1, 2]]\n"
        "distance_limit: PXB\nspreading:\n  max_nics: 12\nhealth:\n  min_rails_up: 2\n"
    )
    s = node_settings(load_policy(p))
    assert s.rail_rule == "allowed-pairs" and s.distance_limit == Distance.PXB
    assert s.backup_lanes == 8 and s.min_rails_up == 2  # max_nics capped at the plugin's 8
    assert s.rail_peers(0) == 0b111 and s.rail_peers(3) == 0b1000 and s.rail_peers(None) == 0
    p.write_text("version: 1\n")
    s = node_settings(load_policy(p))
    assert s.rail_rule is None and s.distance_limit is None and s.backup_lanes == 0
