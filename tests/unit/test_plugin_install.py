"""`railhop plugin-install`: both plugin names land in the host directory, each replaced
atomically (a job that has the old file mapped keeps it), identical files are left alone."""

from __future__ import annotations

import mmap
import os
import subprocess
import sys
from pathlib import Path

import pytest

from railhop import paths, plugin_install
from railhop.plugin_install import Action, PluginInstallError, install, plan_install


def sources(tmp_path: Path, nccl: bytes = b"nccl-v1", rccl: bytes = b"rccl-v1") -> dict[str, Path]:
    src = tmp_path / "src"
    src.mkdir(exist_ok=True)
    (src / "a.so").write_bytes(nccl)
    (src / "b.so").write_bytes(rccl)
    return {paths.NCCL_PLUGIN_NAME: src / "a.so", paths.RCCL_PLUGIN_NAME: src / "b.so"}


def test_plan_is_pure_and_decides_per_file() -> None:
    srcs = {"x.so": Path("/s/x"), "y.so": Path("/s/y"), "z.so": Path("/s/z")}
    steps = plan_install(
        srcs,
        Path("/d"),
        {"x.so": "1", "y.so": "2", "z.so": "3"},
        {"x.so": None, "y.so": "2", "z.so": "old"},
    )
    assert [(s.name, s.action) for s in steps] == [
        ("x.so", Action.INSTALL),
        ("y.so", Action.KEEP),
        ("z.so", Action.REPLACE),
    ]
    assert steps[0].dest == Path("/d/x.so")


def test_installs_both_names_creating_the_directory(tmp_path: Path) -> None:
    dest = tmp_path / "opt" / "railhop" / "lib"
    steps = install(dest, sources(tmp_path))
    assert {s.action for s in steps} == {Action.INSTALL}
    assert (dest / "libnccl-net-railhop.so").read_bytes() == b"nccl-v1"
    assert (dest / "librccl-net-railhop.so").read_bytes() == b"rccl-v1"
    assert (dest / "libnccl-net-railhop.so").stat().st_mode & 0o777 == 0o644
    assert sorted(p.name for p in dest.iterdir()) == [
        "libnccl-net-railhop.so",
        "librccl-net-railhop.so",
    ]  # no temp file left


def test_replacement_is_a_rename_a_mapped_old_file_keeps_its_content(tmp_path: Path) -> None:
    dest = tmp_path / "lib"
    install(dest, sources(tmp_path))
    target = dest / "libnccl-net-railhop.so"
    old_ino = target.stat().st_ino
    # a "running job": the old library mapped, as the dynamic loader maps it
    with target.open("rb") as f, mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ) as m:
        steps = install(dest, sources(tmp_path, nccl=b"nccl-v2-longer", rccl=b"rccl-v1"))
        assert {s.name: s.action for s in steps} == {
            paths.NCCL_PLUGIN_NAME: Action.REPLACE,
            paths.RCCL_PLUGIN_NAME: Action.KEEP,
        }
        assert m[:] == b"nccl-v1"  # the mapped file was never written into
    assert target.read_bytes() == b"nccl-v2-longer"
    assert target.stat().st_ino != old_ino


def test_unchanged_files_keep_their_inode(tmp_path: Path) -> None:
    dest = tmp_path / "lib"
    install(dest, sources(tmp_path))
    inos = {p.name: p.stat().st_ino for p in dest.iterdir()}
    steps = install(dest, sources(tmp_path))
    assert {s.action for s in steps} == {Action.KEEP}
    assert {p.name: p.stat().st_ino for p in dest.iterdir()} == inos


def test_a_failed_copy_leaves_the_old_file_and_no_temp_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    dest = tmp_path / "lib"
    install(dest, sources(tmp_path))

    def broken_fsync(fd: int) -> None:
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(plugin_install.os, "fsync", broken_fsync)
    with pytest.raises(PluginInstallError, match="Input/output error"):
        install(dest, sources(tmp_path, nccl=b"nccl-v3"))
    assert (dest / "libnccl-net-railhop.so").read_bytes() == b"nccl-v1"
    assert not [p for p in dest.iterdir() if p.name.startswith(".")]


def test_bad_inputs_are_clear_errors(tmp_path: Path) -> None:
    with pytest.raises(PluginInstallError, match=r"missing\.so.*not a readable file"):
        install(tmp_path / "lib", {paths.NCCL_PLUGIN_NAME: tmp_path / "missing.so"})
    (tmp_path / "file").write_text("x")
    with pytest.raises(PluginInstallError, match="cannot create"):
        install(tmp_path / "file" / "lib", sources(tmp_path))


def test_cli_installs_the_packages_plugin(tmp_path: Path) -> None:
    """The installed package's own files (what the DaemonSet's initContainer runs)."""
    dest = tmp_path / "lib"
    run = [sys.executable, "-m", "railhop", "plugin-install", "--dest", str(dest)]
    out = subprocess.run(run, capture_output=True, text=True, timeout=60, check=False)
    assert out.returncode == 0, out.stderr
    assert out.stdout.count("installed: ") == 2
    for rccl in (False, True):
        src = paths.plugin_path(rccl=rccl)
        assert (dest / src.name).read_bytes() == src.read_bytes()
    again = subprocess.run(run, capture_output=True, text=True, timeout=60, check=False)
    assert again.returncode == 0 and again.stdout.count("unchanged: ") == 2
    (tmp_path / "file").write_text("x")
    bad = subprocess.run(
        [*run[:-1], str(tmp_path / "file" / "lib")],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert bad.returncode == 2 and "Error: cannot create" in bad.stderr, bad
    assert os.access(dest / paths.NCCL_PLUGIN_NAME, os.R_OK)
