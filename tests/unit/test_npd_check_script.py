"""The node-problem-detector check ``deploy/helm/railhop/files/railhop-check.sh`` run by
busybox ``sh`` (what a minimal NPD image has) and by dash (Debian's POSIX ``/bin/sh``) on files
the agent's own formatter writes (railhop.daemon.nodestatus) and on crafted ones: exit 0 ok,
1 degraded (too few rails up for the policy's minimum), 3 unknown (no file, another version,
missing or malformed fields, the agent gone, a stale or future heartbeat), one line on stdout.
The live-agent version: tests/privileged/test_npd_check_live.py."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from conftest import require
from railhop.control import NicHealth, NicState, Reason
from railhop.daemon.nodestatus import format_node_status, node_status

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "deploy/helm/railhop/files/railhop-check.sh"
NICS = [
    NicHealth("nic0", NicState.UP, rail=0),
    NicHealth("nic1", NicState.UP, rail=1),
    NicHealth("nic2", NicState.DOWN, reason=Reason.CARRIER, rail=2),
    NicHealth("nic3", NicState.UP, rail=3),
]


@pytest.fixture(params=["busybox", "dash"])
def shell(request: pytest.FixtureRequest) -> list[str]:
    name = str(request.param)
    found = shutil.which(name)
    require(found is not None, f"no {name} (Debian: busybox-static, dash)")
    assert found is not None
    return [found, "sh"] if name == "busybox" else [found]


def check(
    shell: list[str], path: Path | None, env: dict[str, str] | None = None
) -> tuple[int, str]:
    # a bare environment: PATH for `date` only (busybox sh runs its applets as builtins)
    full = {"PATH": "/usr/bin:/bin", **(env or {})}
    argv = [*shell, str(SCRIPT)] + ([str(path)] if path is not None else [])
    r = subprocess.run(argv, env=full, capture_output=True, text=True, timeout=30, check=False)
    assert r.stderr == "", r.stderr
    lines = r.stdout.splitlines()
    assert len(lines) == 1, r.stdout  # NPD's message: one line
    return r.returncode, lines[0]


def write(tmp_path: Path, min_up: int = 0, age_s: int = 0, gone: bool = False) -> Path:
    st = node_status(
        NICS, min_up, heartbeat_s=int(time.time()) - age_s, refresh_s=5, agent_pid=4242, gone=gone
    )
    p = tmp_path / "node-status"
    p.write_bytes(format_node_status(st))
    return p


def test_ok_and_degraded_follow_the_policys_minimum(shell: list[str], tmp_path: Path) -> None:
    code, msg = check(shell, write(tmp_path, min_up=0))  # 0: every rail
    assert code == 1, msg
    assert msg == "degraded: 3 of 4 rails up (policy wants 4); NICs not up: nic2 down (carrier)"
    code, msg = check(shell, write(tmp_path, min_up=3))
    assert code == 0, msg
    assert msg == "ok: 3 of 4 rails up (policy wants 3); NICs not up: nic2 down (carrier)"
    code, msg = check(shell, write(tmp_path, min_up=4))
    assert (code, msg.split(":")[0]) == (1, "degraded")


def test_the_file_path_comes_from_the_argument_the_env_or_the_default(
    shell: list[str], tmp_path: Path
) -> None:
    p = write(tmp_path, min_up=3)
    assert check(shell, None, {"RAILHOP_NODE_STATUS": str(p)})[0] == 0
    if not Path("/run/railhop/node-status").exists():
        code, msg = check(shell, None)
        assert code == 3 and "/run/railhop/node-status" in msg, msg


def test_stale_future_and_gone_are_unknown(shell: list[str], tmp_path: Path) -> None:
    # refresh 5: the bound is 15 s
    assert check(shell, write(tmp_path, min_up=3, age_s=10))[0] == 0
    code, msg = check(shell, write(tmp_path, min_up=3, age_s=60))
    assert code == 3 and re.fullmatch(r"unknown: railhop agent heartbeat is 6\d s old.*", msg), msg
    code, msg = check(shell, write(tmp_path, min_up=3, age_s=-60))
    assert code == 3 and "in the future" in msg, msg
    # RAILHOP_STALE_S overrides the bound
    p = write(tmp_path, min_up=3, age_s=60)
    assert check(shell, p, {"RAILHOP_STALE_S": "120"})[0] == 0
    code, msg = check(shell, write(tmp_path, min_up=3, gone=True))
    assert code == 3 and "shut down" in msg and "4242" in msg, msg


def test_no_file_is_unknown(shell: list[str], tmp_path: Path) -> None:
    code, msg = check(shell, tmp_path / "missing")
    assert code == 3 and msg.startswith("unknown: no railhop node status at"), msg
    code, msg = check(shell, tmp_path)  # a directory
    assert code == 3 and msg.startswith("unknown:"), msg


def _drop(field: str) -> Callable[[str], str]:
    return lambda t: re.sub(rf"(?m)^{field} .*\n", "", t)


@pytest.mark.parametrize(
    ("edit", "words"),
    [
        (lambda t: t.replace("version 1", "version 2"), "format version '2'"),
        (_drop("version"), "format version ''"),
        (_drop("heartbeat"), "field heartbeat missing"),
        (_drop("refresh"), "field refresh missing"),
        (_drop("rails_up"), "field rails_up missing"),
        (_drop("rails_total"), "field rails_total missing"),
        (_drop("min_rails_up"), "field min_rails_up missing"),
        (_drop("verdict"), "verdict ''"),
        (lambda t: t.replace("verdict degraded", "verdict fine"), "verdict 'fine'"),
        (lambda t: re.sub(r"(?m)^rails_up \d+", "rails_up -1", t), "rails_up"),
        (lambda t: re.sub(r"(?m)^heartbeat \d+", "heartbeat 1e9", t), "heartbeat"),
        (lambda t: t.replace("nic nic0 0 up none", "nic nic0 0 up"), "bad nic line"),
        (lambda t: "", "format version ''"),
        (lambda t: "garbage\x00\xff\n" * 3, "format version"),
    ],
)
def test_malformed_files_are_unknown(
    shell: list[str], tmp_path: Path, edit: Callable[[str], str], words: str
) -> None:
    p = write(tmp_path, min_up=0)
    p.write_text(edit(p.read_text()), errors="surrogateescape")
    code, msg = check(shell, p)
    assert code == 3 and msg.startswith("unknown:") and words in msg, msg


def test_the_script_is_posix_sh_without_bashisms() -> None:
    text = SCRIPT.read_text()
    assert text.startswith("#!/bin/sh\n")
    assert os.access(SCRIPT, os.X_OK)
    for bashism in ("[[", "function ", "local ", "$'", "<<<", "${!", "pipefail", "declare"):
        assert bashism not in text, bashism
