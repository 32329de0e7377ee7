"""Issue 19, 4 and 7: the root agent writes into a directory it shares with jobs: it must never
write through a symlink or into a file someone else created, and must write every byte."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from railhop.control.rundir import write_file, write_file_at
from railhop.daemon.lanes import write_status


def test_write_status_never_follows_a_planted_symlink(tmp_path: Path) -> None:
    secret = tmp_path / "secret"
    secret.write_text("precious")
    run = tmp_path / "run"
    run.mkdir()
    # the temp name main used was predictable: .status.json.<pid>.tmp
    (run / f".status.json.{os.getpid()}.tmp").symlink_to(secret)
    (run / "status.json").symlink_to(secret)
    write_status(run / "status.json", {"version": 1})
    assert secret.read_text() == "precious"
    assert not (run / "status.json").is_symlink()
    assert json.loads((run / "status.json").read_text()) == {"version": 1}


def test_a_symlinked_directory_is_refused(tmp_path: Path) -> None:
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "real")
    with pytest.raises(OSError):
        write_file_at(tmp_path / "link" / "status.json", b"{}")
    assert not (tmp_path / "real" / "status.json").exists()


def test_short_writes_are_continued(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real = os.write

    def one_byte(fd: int, data: bytes | memoryview) -> int:
        return real(fd, bytes(data[:1]))

    monkeypatch.setattr(os, "write", one_byte)
    doc = {"version": 1, "nics": {f"nic{i}": {"lanes": i} for i in range(50)}}
    write_status(tmp_path / "status.json", doc)
    monkeypatch.undo()
    assert json.loads((tmp_path / "status.json").read_text()) == doc


def test_a_failed_write_leaves_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "status.json").write_text('{"old": 1}')

    def nothing(fd: int, data: bytes | memoryview) -> int:
        return 0

    monkeypatch.setattr(os, "write", nothing)
    fd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        with pytest.raises(OSError, match="wrote 0"):
            write_file(fd, "status.json", b'{"new": 1}')
    finally:
        os.close(fd)
    monkeypatch.undo()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["status.json"]
    assert (tmp_path / "status.json").read_text() == '{"old": 1}'
