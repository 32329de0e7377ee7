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
    if cc is None:
        pytest.skip("no C compiler")
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
