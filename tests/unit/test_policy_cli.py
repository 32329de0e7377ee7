"""``railhop policy check`` and ``railhop policy plan`` (click.testing.CliRunner)."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from railhop.cli import cli

ROOT = Path(__file__).resolve().parents[2]
POLICIES = ROOT / "policies"
DGX = ROOT / "tests/fixtures/sys/dgx-h100"


def run(*args: str) -> tuple[int, str, str]:
    r = CliRunner().invoke(cli, list(args))
    return r.exit_code, r.stdout, r.stderr


def test_check_shipped_ok() -> None:
    files = sorted(str(p) for p in POLICIES.glob("*.yaml"))
    code, out, _ = run("policy", "check", *files)
    assert code == 0
    assert out.splitlines() == [f"{f}: ok" for f in files]


def test_check_reports_every_error_of_every_file(tmp_path: Path) -> None:
    a = tmp_path / "a.yaml"
    a.write_text("version: 1\ncolour: blue\ntimeouts:\n  completion_ms: fast\n")
    b = tmp_path / "b.yaml"
    b.write_text("version: 3\n")
    good = POLICIES / "permissive.yaml"
    code, out, err = run("policy", "check", str(a), str(good), str(b))
    assert code == 1
    assert out.splitlines() == [
        f"{a}:2:1: colour: unknown key (allowed: version, name, description, rails, rail_rule, "
        "distance_limit, timeouts, spreading, health, flap_damping) (got 'colour')",
        f"{a}:4:18: timeouts.completion_ms: must be of type integer (got 'fast')",
        f"{good}: ok",
        f"{b}:1:10: version: unsupported version (this railhop reads version 1) (got 3)",
    ]
    assert "2 of 3 policy file(s) have errors" in err


def test_check_json(tmp_path: Path) -> None:
    a = tmp_path / "a.yaml"
    a.write_text("version: 1\ntimeouts:\n  completion_ms: fast\n")
    good = POLICIES / "permissive.yaml"
    code, out, err = run("policy", "check", "--json", str(a), str(good))
    assert code == 1 and err == ""
    doc = json.loads(out)
    assert doc["ok"] is False
    assert doc["files"][0] == {
        "file": str(a),
        "ok": False,
        "issues": [
            {
                "line": 3,
                "column": 18,
                "field": "timeouts.completion_ms",
                "message": "must be of type integer",
                "value": "'fast'",
            }
        ],
    }
    assert doc["files"][1] == {"file": str(good), "ok": True, "issues": []}
    code, out, _ = run("policy", "check", "--json", str(good))
    assert code == 0 and json.loads(out)["ok"] is True
    code, _, err = run("policy", "check", "--json", "--bogus", str(good))
    assert code == 2 and "No such option" in err


def test_check_bad_input() -> None:
    code, _, err = run("policy", "check", "/no/such/file.yaml")
    assert code == 2 and "does not exist" in err
    code, _, err = run("policy", "check")
    assert code == 2 and "Missing argument" in err


def test_plan_text() -> None:
    code, out, _ = run(
        "policy",
        "plan",
        str(POLICIES / "rail-optimized-8nic.yaml"),
        "--root",
        str(DGX),
        "--down",
        "mlx5_2",
    )
    assert code == 0
    lines = out.splitlines()
    assert lines[0] == "mlx5_2 (rail 2, down): migrate"
    assert [line.split()[1] for line in lines[1:4]] == ["mlx5_0", "mlx5_1", "mlx5_3"]
    assert all("weight 0.333  NODE" in line for line in lines[1:4])
    assert "remote rail 0 (else 2,1,3)" in lines[1]


def test_plan_json_and_escalation() -> None:
    args = [
        "policy",
        "plan",
        str(POLICIES / "rail-optimized-8nic.yaml"),
        "--root",
        str(DGX),
        "--json",
    ]
    for i in range(4):
        args += ["--down", f"mlx5_{i}"]
    code, out, _ = run(*args, "--suspect", "ibp187s0")
    assert code == 0
    d = json.loads(out)
    assert [e["nic"] for e in d["entries"]] == ["mlx5_0", "mlx5_1", "mlx5_2", "mlx5_3", "mlx5_5"]
    assert all(e["escalate"] for e in d["entries"][:4])
    standby = d["entries"][4]
    assert standby["action"] == "standby" and {p["local"] for p in standby["pairs"]} == {
        "mlx5_4",
        "mlx5_6",
        "mlx5_7",
    }


def test_plan_nothing_down_and_unknown_nic() -> None:
    code, out, _ = run("policy", "plan", str(POLICIES / "permissive.yaml"), "--root", str(DGX))
    assert code == 0 and "nothing to plan" in out
    code, _, err = run(
        "policy", "plan", str(POLICIES / "permissive.yaml"), "--root", str(DGX), "--down", "eth9"
    )
    assert code == 2 and "no NIC named 'eth9'" in err
