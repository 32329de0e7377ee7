"""Health table: pure codecs and the seqlock writer (Python side)."""

from __future__ import annotations

import os
import stat
import struct
import zlib
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from railhop.control import layout
from railhop.control.errors import TableError
from railhop.control.layout import Backup, Distance, NicHealth, NicState, Reason
from railhop.control.table import TableWriter, previous_generation, proc_identity, read_table


def nics4() -> list[NicHealth]:
    return [
        NicHealth(
            "nic0",
            NicState.UP,
            10,
            Reason.NONE,
            rail=0,
            pci="0000:17:00.0",
            numa=0,
            speed_mbps=400000,
        ),
        NicHealth("nic1", NicState.DOWN, 20, Reason.CARRIER, rail=1, pci="0000:3a:00.0", numa=0),
        NicHealth("nic2", NicState.SUSPECT, 30, Reason.TCP, rail=2),
        NicHealth("nic3", NicState.RECOVERING, 40, Reason.FLAPPING, rail=None, numa=None),
    ]


PLANS = {
    "nic1": [
        Backup("nic0", remote_rail=1, weight=3, distance=Distance.PXB),
        Backup("nic2", remote_rail=None, weight=1, distance=None),
    ]
}


def test_writer_creates_on_first_publish_and_reads_back(tmp_path: Path) -> None:
    path = tmp_path / "health.tbl"
    w = TableWriter(path, heartbeat_ms=100, clock=lambda: 12345)
    assert not path.exists()
    assert w.publish(nics4(), PLANS) == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["health.tbl"]  # temp renamed away
    assert stat.S_IMODE(path.stat().st_mode) == 0o644
    assert path.stat().st_size == layout.TABLE_SIZE
    snap = read_table(path)
    assert snap.nics == tuple(nics4())
    assert snap.plans == {"nic1": tuple(PLANS["nic1"])}
    assert snap.publish_count == 1 and snap.publish_ns == 12345 and snap.heartbeat_ms == 100
    assert snap.generation == 1 and snap.agent_pid == os.getpid()
    assert (snap.agent_start_ticks, snap.agent_pidns) == proc_identity(os.getpid())
    assert snap.agent_start_ticks > 0
    assert snap.seq == 2 and not snap.agent_gone
    assert snap.changes == (0, 0, 0, 0)
    assert snap.plan_versions == {"nic0": 1, "nic1": 1, "nic2": 1, "nic3": 1}
    w.close()


def test_changes_and_plan_versions_track_updates(tmp_path: Path) -> None:
    w = TableWriter(tmp_path / "health.tbl")
    w.publish(nics4(), PLANS)
    n = nics4()
    n[1] = NicHealth("nic1", NicState.UP, 50, Reason.CARRIER, rail=1)
    w.publish(n, PLANS)  # nic1 changed state, plans unchanged
    n[1] = NicHealth("nic1", NicState.DOWN, 60, Reason.CARRIER, rail=1)
    w.publish(n, {"nic1": [Backup("nic0", weight=1)]})  # changed again, new plan
    snap = read_table(tmp_path / "health.tbl")
    assert snap.publish_count == 3 and snap.seq == 6
    assert snap.changes == (0, 2, 0, 0)
    assert snap.plan_versions["nic1"] == 3 and snap.plan_versions["nic0"] == 1
    assert snap.plans == {"nic1": (Backup("nic0", weight=1),)}
    w.close()


def test_long_plans_are_cut_to_the_best_entries(tmp_path: Path) -> None:
    nics = [NicHealth(f"eth{i}", NicState.UP) for i in range(20)]
    ranked = [Backup(f"eth{i}", weight=i) for i in range(1, 20)]
    w = TableWriter(tmp_path / "health.tbl")
    w.publish(nics, {"eth0": ranked})
    assert w.truncated_plans == 1
    assert read_table(tmp_path / "health.tbl").plans["eth0"] == tuple(ranked[:15])
    w.close()


@pytest.mark.parametrize(
    ("nics", "plans", "match"),
    [
        ([NicHealth("", NicState.UP)], {}, "NIC name"),
        ([NicHealth("a" * 16, NicState.UP)], {}, "NIC name"),
        ([NicHealth("a b", NicState.UP)], {}, "NIC name"),
        ([NicHealth("nic0", NicState.UP, pci="x" * 16)], {}, "PCI"),
        ([NicHealth("nic0", NicState.UP, rail=70000)], {}, "rail"),
        ([NicHealth("nic0", NicState.UP, rail=0xFFFF)], {}, "rail"),
        ([NicHealth("nic0", NicState.UP, numa=-2)], {}, "NUMA"),
        ([NicHealth("nic0", NicState.UP), NicHealth("nic0", NicState.UP)], {}, "twice"),
        ([NicHealth(f"n{i}", NicState.UP) for i in range(65)], {}, "at most 64"),
        ([NicHealth("nic0", NicState.UP)], {"nic9": [Backup("nic0")]}, "not a published"),
        ([NicHealth("nic0", NicState.UP)], {"nic0": [Backup("nic7")]}, "not published"),
        ([NicHealth("nic0", NicState.UP)], {"nic0": [Backup("nic0", weight=70000)]}, "weight"),
        ([NicHealth("nic0", NicState.UP)], {"nic0": [Backup("nic0", remote_rail=-1)]}, "rail"),
    ],
)
def test_bad_input_is_rejected_and_the_table_is_unchanged(
    tmp_path: Path, nics: list[NicHealth], plans: layout.Plans, match: str
) -> None:
    path = tmp_path / "health.tbl"
    w = TableWriter(path)
    w.publish(nics4(), PLANS)
    before = path.read_bytes()
    with pytest.raises(TableError, match=match):
        w.publish(nics, plans)
    assert path.read_bytes() == before
    assert w.publish_count == 1
    w.close()


def test_restart_bumps_generation_and_replaces_the_file(tmp_path: Path) -> None:
    path = tmp_path / "health.tbl"
    w1 = TableWriter(path)
    w1.publish(nics4(), {})
    ino1 = path.stat().st_ino
    w2 = TableWriter(path)  # a new agent; the old one died without cleaning up
    w2.publish(nics4()[:2], {})
    assert path.stat().st_ino != ino1
    snap = read_table(path)
    assert snap.generation == 2 and snap.publish_count == 1 and len(snap.nics) == 2
    w1.close()
    w2.close()
    path.write_bytes(b"garbage")
    assert previous_generation(path) == 0


def test_mark_gone_and_heartbeat(tmp_path: Path) -> None:
    now = [1000]
    path = tmp_path / "health.tbl"
    w = TableWriter(path, heartbeat_ms=50, clock=lambda: now[0])
    w.heartbeat()  # no table yet: nothing happens
    assert not path.exists()
    w.publish(nics4(), PLANS)
    now[0] = 7777
    w.heartbeat()
    snap = read_table(path)
    assert snap.heartbeat_ns == 7777 and snap.seq == 2  # heartbeat is outside the seqlock
    w.mark_gone()
    snap = read_table(path)
    assert snap.agent_gone and snap.seq == 4
    assert snap.nics == tuple(nics4()) and snap.plans["nic1"] == tuple(PLANS["nic1"])
    w.close()


def test_a_truncated_table_is_rewritten_whole(tmp_path: Path) -> None:
    """Issue 29, 7: the writer stored through a shared mapping, so a truncated file raised
    SIGBUS in the agent. It writes with pwrite now and restores a short table (header and the
    last publish) at the next heartbeat or publish."""
    now = [1000]
    path = tmp_path / "health.tbl"
    w = TableWriter(path, heartbeat_ms=50, clock=lambda: now[0])
    w.publish(nics4(), PLANS)
    before = read_table(path)
    for cut in (0, 100, layout.TABLE_SIZE - 1):
        os.truncate(path, cut)
        with pytest.raises(TableError):
            read_table(path)
        now[0] += 1
        w.heartbeat()
        snap = read_table(path)
        assert snap.heartbeat_ns == now[0] and snap.generation == before.generation
        assert snap.nics == before.nics and snap.plans == before.plans
    os.truncate(path, 0)
    w.publish(nics4()[:2], {})  # a publish restores too
    assert read_table(path).nics == tuple(nics4()[:2])
    assert w.restored == 4 and w.write_errors == 0
    w.close()


def _image(tmp_path: Path) -> bytearray:
    w = TableWriter(tmp_path / "health.tbl")
    w.publish(nics4(), PLANS)
    w.close()
    return bytearray((tmp_path / "health.tbl").read_bytes())


def test_decoder_rejects_corruption(tmp_path: Path) -> None:
    img = _image(tmp_path)
    layout.decode_table(bytes(img))
    for offset in (layout.BODY_OFFSET + 8, layout.NICS_OFFSET + 64 + 33, layout.PLANS_OFFSET + 5):
        bad = bytearray(img)
        bad[offset] ^= 0x40
        with pytest.raises(TableError, match="CRC"):
            layout.decode_table(bytes(bad))
    bad = bytearray(img)
    bad[0] ^= 1
    with pytest.raises(TableError, match="magic"):
        layout.decode_table(bytes(bad))
    bad = bytearray(img)
    struct.pack_into("<H", bad, 4, layout.LAYOUT_VERSION + 1)
    with pytest.raises(TableError, match=f"layout {layout.LAYOUT_VERSION + 1}"):
        layout.decode_table(bytes(bad))
    with pytest.raises(TableError, match="truncated"):
        layout.decode_table(bytes(img[:-1]))
    # CRC-clean nonsense: a state that is not a state
    bad = bytearray(img)
    bad[layout.NICS_OFFSET + 46] = 9
    n = struct.unpack_from("<H", bad, layout.BODY_OFFSET + 24)[0]
    crc = layout.payload_crc(
        bytes(bad[64:128]),
        bytes(bad[layout.NICS_OFFSET : layout.NICS_OFFSET + 64 * n]),
        bytes(bad[layout.PLANS_OFFSET : layout.PLANS_OFFSET + 128 * n]),
    )
    struct.pack_into("<I", bad, layout.BODY_OFFSET, crc)
    with pytest.raises(TableError, match="state 9"):
        layout.decode_table(bytes(bad))


def test_read_table_errors(tmp_path: Path) -> None:
    with pytest.raises(TableError, match="cannot read"):
        read_table(tmp_path / "missing.tbl")
    (tmp_path / "short.tbl").write_bytes(b"\0" * 100)
    with pytest.raises(TableError, match="truncated"):
        read_table(tmp_path / "short.tbl")
    img = _image(tmp_path)
    struct.pack_into("<Q", img, layout.SEQ_OFFSET, 7)  # a writer that died mid-update
    (tmp_path / "busy.tbl").write_bytes(bytes(img))
    with pytest.raises(TableError, match="no consistent copy"):
        read_table(tmp_path / "busy.tbl", tries=3)


def test_crc_is_zlib_crc32() -> None:
    assert layout.payload_crc(b"\0\0\0\0" + b"1234", b"56", b"789") == zlib.crc32(b"123456789")


names = st.text(
    alphabet=st.characters(min_codepoint=0x21, max_codepoint=0x7E, blacklist_characters="/"),
    min_size=1,
    max_size=15,
)


@st.composite
def tables(draw: st.DrawFn) -> tuple[list[NicHealth], dict[str, list[Backup]]]:
    ifnames = draw(st.lists(names, min_size=0, max_size=layout.MAX_NICS, unique=True))
    nics = [
        NicHealth(
            ifname=n,
            state=draw(st.sampled_from(NicState)),
            since_ns=draw(st.integers(0, 2**64 - 1)),
            reason=draw(st.sampled_from(Reason)),
            rail=draw(st.none() | st.integers(0, 0xFFFE)),
            pci=draw(st.just("") | names),
            numa=draw(st.none() | st.integers(0, 0x7FFF)),
            speed_mbps=draw(st.integers(0, 2**32 - 1)),
        )
        for n in ifnames
    ]
    plans: dict[str, list[Backup]] = {}
    for n in draw(st.lists(st.sampled_from(ifnames), unique=True)) if ifnames else []:
        plans[n] = [
            Backup(
                local_nic=draw(st.sampled_from(ifnames)),
                remote_rail=draw(st.none() | st.integers(0, 0xFFFE)),
                weight=draw(st.integers(0, 0xFFFF)),
                distance=draw(st.none() | st.sampled_from(Distance)),
            )
            for _ in range(draw(st.integers(1, layout.MAX_BACKUPS)))
        ]
    return nics, plans


@settings(max_examples=60, deadline=None)
@given(tables())
def test_encode_decode_roundtrip(t: tuple[list[NicHealth], dict[str, list[Backup]]]) -> None:
    nics, plans = t
    p = layout.encode_payload(
        nics,
        plans,
        changes=[7] * len(nics),
        plan_versions=[3] * len(nics),
        publish_count=9,
        publish_ns=5,
        flags=0,
        heartbeat_ms=250,
    )
    image = (
        layout.encode_header(
            agent_pid=1, agent_start_ticks=2, agent_pidns=3, generation=4, heartbeat_ns=6
        )
        + p.body
        + p.nics
        + p.plans
    )
    assert len(image) == layout.TABLE_SIZE
    snap = layout.decode_table(image)
    assert snap.nics == tuple(nics)
    assert snap.plans == {k: tuple(v) for k, v in plans.items()}
    assert snap.changes == (7,) * len(nics)
    assert (snap.generation, snap.agent_pid, snap.publish_count, snap.heartbeat_ns) == (4, 1, 9, 6)


def test_read_table_survives_truncation_while_reading(tmp_path: Path) -> None:
    """Issue 19, 1: ``railhop status`` (read_table) must not die by SIGBUS when the table is
    truncated while it reads: a child process reads in a loop while this one truncates and
    restores the file; the child must exit normally with every read either a valid copy or a
    TableError."""
    import subprocess
    import sys
    import time

    path = tmp_path / "health.tbl"
    w = TableWriter(path, heartbeat_ms=100)
    w.publish(nics4(), PLANS)
    reader = (
        "import sys, time\n"
        "from railhop.control.errors import TableError\n"
        "from railhop.control.table import read_table\n"
        "ok = bad = 0\n"
        "end = time.monotonic() + 1.0\n"
        "while time.monotonic() < end:\n"
        "    try:\n"
        "        read_table(__import__('pathlib').Path(sys.argv[1])); ok += 1\n"
        "    except TableError:\n"
        "        bad += 1\n"
        "print(ok, bad)\n"
    )
    child = subprocess.Popen(
        [sys.executable, "-c", reader, str(path)], stdout=subprocess.PIPE, text=True
    )
    deadline = time.monotonic() + 30
    i = 0
    while child.poll() is None and time.monotonic() < deadline:
        os.truncate(path, layout.TABLE_SIZE if i % 2 else 64)
        i += 1
    os.truncate(path, layout.TABLE_SIZE)
    out, _ = child.communicate(timeout=30)
    w.close()
    assert child.returncode == 0, f"reader died with {child.returncode} (-7 is SIGBUS)"
    ok, bad = (int(x) for x in out.split())
    assert ok + bad > 0 and i > 0
    with pytest.raises(TableError, match="truncated"):
        os.truncate(path, 100)
        read_table(path)


def test_node_settings_roundtrip_and_range(tmp_path: Path) -> None:
    """The node policy's settings ride in the body (CRC-covered); 0 ms = not set."""
    s = layout.NodeSettings(
        completion_ms=1500, probe_ms=200, failback_interval_ms=4000, migrate_on_suspect=True
    )
    w = TableWriter(tmp_path / "health.tbl", settings=s)
    w.publish(nics4(), PLANS)
    assert read_table(tmp_path / "health.tbl").settings == s
    w.settings = layout.NodeSettings()
    w.publish(nics4(), PLANS)
    assert read_table(tmp_path / "health.tbl").settings == layout.NodeSettings()
    w.close()
    with pytest.raises(TableError, match="completion_ms"):
        TableWriter(tmp_path / "x.tbl", settings=layout.NodeSettings(completion_ms=-1))
