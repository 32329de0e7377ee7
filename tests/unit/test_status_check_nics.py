"""``railhop status --check --nics``: rails up against the policy's ``health.min_rails_up``, with
node-problem-detector's exit contract (0 ok, 1 problem, 3 unknown); the NPD config that runs it
and the chart's ConfigMap of it. The live-agent version: tests/privileged/test_npd_rule.py."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner

from railhop.cli import cli
from railhop.control import NicHealth, NicState, NodeSettings, Reason, TableWriter, read_table
from railhop.control.status import check_nics
from railhop.daemon.publish import node_settings
from railhop.policy import PolicyError, load_policy

REPO = Path(__file__).resolve().parents[2]
NPD = REPO / "deploy/helm/railhop/files/npd-railhop.json"

FOUR = [
    NicHealth("nic0", NicState.UP, 1, rail=0),
    NicHealth("nic1", NicState.UP, 1, rail=1),
    NicHealth("nic2", NicState.UP, 1, rail=2),
    NicHealth("nic3", NicState.UP, 1, rail=3),
]


def _down(nics: list[NicHealth], name: str, state: NicState = NicState.DOWN) -> list[NicHealth]:
    return [
        NicHealth(n.ifname, state, 2, Reason.CARRIER, rail=n.rail) if n.ifname == name else n
        for n in nics
    ]


def table(tmp_path: Path, nics: list[NicHealth], min_up: int = 0) -> TableWriter:
    w = TableWriter(
        tmp_path / "health.tbl", heartbeat_ms=100, settings=NodeSettings(min_rails_up=min_up)
    )
    w.publish(nics, {})
    return w


def test_check_every_rail_by_default(tmp_path: Path) -> None:
    w = table(tmp_path, FOUR)
    r = check_nics(read_table(tmp_path / "health.tbl"))
    assert r.ok and (r.rails_up, r.rails_total, r.min_rails_up) == (4, 4, 4) and not r.failed
    w.publish(_down(FOUR, "nic2"), {})
    r = check_nics(read_table(tmp_path / "health.tbl"))
    assert not r.ok and r.rails_up == 3 and r.failed == (("nic2", "down", "carrier"),)
    assert "\n" not in r.message and "nic2 down (carrier)" in r.message
    assert "3 of 4 rails up (policy wants 4)" in r.message
    w.close()


def test_check_with_a_minimum_and_suspect_and_shared_rails(tmp_path: Path) -> None:
    w = table(tmp_path, _down(FOUR, "nic2"), min_up=3)
    assert check_nics(read_table(tmp_path / "health.tbl")).ok  # 3 of 4 is enough
    nics = _down(_down(FOUR, "nic2"), "nic3", NicState.SUSPECT)
    w.publish(nics, {})
    r = check_nics(read_table(tmp_path / "health.tbl"))
    assert not r.ok and r.rails_up == 2  # SUSPECT does not count as up
    assert [f[0] for f in r.failed] == ["nic2", "nic3"]
    # two NICs on rail 0: the rail is up while either is
    shared = [
        NicHealth("a", NicState.DOWN, 1, Reason.CARRIER, rail=0),
        NicHealth("b", NicState.UP, 1, rail=0),
        NicHealth("c", NicState.UP, 1),  # no rail: a rail of its own
    ]
    w.settings = NodeSettings()  # every rail
    w.publish(shared, {})
    r = check_nics(read_table(tmp_path / "health.tbl"))
    assert (
        r.ok and (r.rails_up, r.rails_total) == (2, 2) and r.failed == (("a", "down", "carrier"),)
    )
    w.publish([], {})
    r = check_nics(read_table(tmp_path / "health.tbl"))
    assert not r.ok and "no NICs" in r.message
    w.close()


def run(*args: str) -> tuple[int, str, str]:
    res = CliRunner().invoke(cli, list(args))
    return res.exit_code, res.stdout, res.stderr


def test_cli_exit_codes(tmp_path: Path) -> None:
    rd = str(tmp_path)
    code, out, _ = run("status", "--check", "--nics", "--run-dir", rd)
    assert code == 3 and out.startswith("unknown: no agent table")
    code, out, _ = run("status", "--check", "--nics", "--json", "--run-dir", rd)
    assert code == 3 and json.loads(out)["exit_code"] == 3
    w = table(tmp_path, FOUR)
    code, out, _ = run("status", "--check", "--nics", "--run-dir", rd)
    assert code == 0 and out.startswith("ok: 4 of 4 rails up") and out.count("\n") == 1
    w.publish(_down(FOUR, "nic1"), {})
    code, out, _ = run("status", "--check", "--nics", "--run-dir", rd)
    assert code == 1 and out.startswith("degraded: 3 of 4") and "nic1 down" in out
    code, out, _ = run("status", "--check", "--nics", "--json", "--run-dir", rd)
    doc = json.loads(out)
    assert (
        code == 1 and doc["check"]["ok"] is False and doc["check"]["failed"][0]["ifname"] == "nic1"
    )
    # an agent that shut down: unknown, not "healthy"
    w.mark_gone()
    code, out, _ = run("status", "--check", "--nics", "--run-dir", rd)
    assert code == 3 and "not alive" in out
    # without --check, --nics is a usage error; plain --check keeps its liveness meaning
    code, _, err = run("status", "--nics", "--run-dir", rd)
    assert code == 2 and "--check --nics" in err
    code, _, _ = run("status", "--check", "--run-dir", rd)
    assert code == 1
    w.close()


def test_stale_heartbeat_is_unknown(tmp_path: Path) -> None:
    base = time.monotonic_ns() - 60 * 10**9  # a writer whose clock says a minute ago
    w = TableWriter(tmp_path / "health.tbl", heartbeat_ms=100, clock=lambda: base)
    w.publish(FOUR, {})
    code, out, _ = run("status", "--check", "--nics", "--run-dir", str(tmp_path))
    assert code == 3 and "not alive" in out
    w.close()


def test_policy_min_rails_up(tmp_path: Path) -> None:
    p = tmp_path / "p.yaml"
    p.write_text("version: 1\nhealth:\n  min_rails_up: 6\n")
    assert node_settings(load_policy(p)).min_rails_up == 6
    p.write_text("version: 1\n")
    assert node_settings(load_policy(p)).min_rails_up == 0
    p.write_text("version: 1\nhealth:\n  min_rails_up: -1\n")
    with pytest.raises(PolicyError, match="min_rails_up"):
        load_policy(p)
    p.write_text("version: 1\nhealth:\n  min_rails_up: some\n")
    with pytest.raises(PolicyError, match="min_rails_up"):
        load_policy(p)


def test_npd_config_runs_the_check() -> None:
    """The shipped node-problem-detector config: a custom plugin whose permanent rule runs the
    chart's POSIX sh check on the agent's node-status file (NPD's image has /bin/sh, not
    railhop) from the ConfigMap's mount, and sets RailhopNICDegraded."""
    cfg = json.loads(NPD.read_text())
    assert cfg["plugin"] == "custom"
    (cond,) = cfg["conditions"]
    assert cond["type"] == "RailhopNICDegraded"
    (rule,) = cfg["rules"]
    assert rule["type"] == "permanent" and rule["condition"] == "RailhopNICDegraded"
    argv = [rule["path"], *rule["args"]]
    assert argv == ["/bin/sh", "/etc/railhop-npd/railhop-check.sh", "/run/railhop/node-status"]
    assert rule["reason"] and rule["timeout"]


def test_chart_renders_the_npd_configmap() -> None:
    import shutil
    import subprocess
    import sys

    from conftest import require

    helm = Path(sys.executable).parent / "helm"
    found = str(helm) if helm.exists() else shutil.which("helm")
    require(found is not None, "no helm binary: `make setup` installs one into .venv/bin")
    assert found is not None

    def render(*sets: str) -> list[dict[str, Any]]:
        args = [found, "template", "rh", str(REPO / "deploy/helm/railhop")]
        for s in sets:
            args += ["--set", s]
        r = subprocess.run(args, capture_output=True, text=True, timeout=120, check=False)
        assert r.returncode == 0, r.stderr
        return [d for d in yaml.safe_load_all(r.stdout) if d]

    def npd(docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return [
            d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"].endswith("-npd")
        ]

    assert npd(render()) == []  # off by default
    (cm,) = npd(render("nodeProblemDetector.enabled=true"))
    assert json.loads(cm["data"]["railhop-nic-monitor.json"]) == json.loads(NPD.read_text())
    # the check travels in the same ConfigMap, byte for byte (NPD mounts it at /etc/railhop-npd)
    script = NPD.parent / "railhop-check.sh"
    assert cm["data"]["railhop-check.sh"] == script.read_text()


def test_unreadable_table_is_unknown(tmp_path: Path) -> None:
    (tmp_path / "health.tbl").write_bytes(b"not a table")
    code, out, _ = run("status", "--check", "--nics", "--run-dir", str(tmp_path))
    assert code == 3 and out.startswith("unknown:") and "truncated" in out
    code, _, err = run("status", "--run-dir", str(tmp_path))  # without --nics: a finding
    assert code == 1 and "truncated" in err
