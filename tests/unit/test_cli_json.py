"""Every ``--json`` of every ``railhop`` command prints exactly one JSON document with a
``version`` field, on success and on failure (``{"version", "error", "exit_code"}`` and the
documented exit code)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click
import pytest
from click.testing import CliRunner

from railhop.cli import cli
from railhop.cliout import JSON_VERSION, JsonCommand, document
from railhop.control import NicHealth, NicState, TableWriter

ROOT = Path(__file__).resolve().parents[2]
SYS = ROOT / "tests/fixtures/sys"
POLICIES = ROOT / "policies"


def run_json(*args: str) -> tuple[int, dict[str, Any], str]:
    """Run ``railhop ARGS``; stdout must be exactly one JSON document (json.loads refuses
    JSON lines or trailing text)."""
    r = CliRunner().invoke(cli, list(args))
    assert r.exception is None or isinstance(r.exception, SystemExit), r.exception
    doc = json.loads(r.stdout)
    assert isinstance(doc, dict) and doc["version"] == JSON_VERSION, r.stdout
    return r.exit_code, doc, r.stderr


def assert_error(code: int, doc: dict[str, Any], want_code: int, *words: str) -> None:
    assert code == want_code
    assert set(doc) == {"version", "error", "exit_code"} and doc["exit_code"] == want_code
    for w in words:
        assert w in doc["error"], doc


def test_topology_json_ok_and_errors(tmp_path: Path) -> None:
    code, doc, _ = run_json("topology", "--root", str(SYS / "dgx-h100"), "--json")
    assert code == 0 and len(doc["nics"]) > 0 and "error" not in doc
    # a usage error found while parsing (--root must exist)
    code, doc, err = run_json("topology", "--json", "--root", str(tmp_path / "nope"))
    assert_error(code, doc, 2, "nope")
    assert "Error" in err
    # a domain error raised by the command (a policy that does not validate)
    bad = tmp_path / "bad.yaml"
    bad.write_text("version: 7\n")
    code, doc, _ = run_json(
        "topology", "--root", str(SYS / "dgx-h100"), "--policy", str(bad), "--json"
    )
    assert_error(code, doc, 2, "invalid policy")


def test_policy_check_json_ok_finding_and_error(tmp_path: Path) -> None:
    good = POLICIES / "permissive.yaml"
    code, doc, _ = run_json("policy", "check", "--json", str(good))
    assert code == 0 and doc["ok"] is True and doc["files"][0]["file"] == str(good)
    bad = tmp_path / "bad.yaml"
    bad.write_text("version: 1\ncolour: blue\n")
    code, doc, _ = run_json("policy", "check", "--json", str(good), str(bad))
    assert code == 1 and doc["ok"] is False and doc["files"][1]["issues"][0]["field"] == "colour"
    unreadable = tmp_path / "binary.yaml"
    unreadable.write_bytes(b"\xff\xfe: [")
    code, doc, _ = run_json("policy", "check", "--json", str(unreadable))
    assert_error(code, doc, 2, str(unreadable))
    code, doc, _ = run_json("policy", "check", "--json", "--bogus", str(good))
    assert_error(code, doc, 2, "--bogus")


def test_policy_plan_json_ok_and_bad_nic() -> None:
    pol = str(POLICIES / "rail-optimized-8nic.yaml")
    dgx = str(SYS / "dgx-h100")
    code, doc, _ = run_json("policy", "plan", pol, "--root", dgx, "--down", "mlx5_0", "--json")
    assert code == 0 and doc["entries"][0]["nic"] == "mlx5_0"
    code, doc, _ = run_json("policy", "plan", pol, "--root", dgx, "--down", "nic9", "--json")
    assert_error(code, doc, 2, "nic9")


def test_status_json_ok_and_no_agent(tmp_path: Path) -> None:
    """With no agent table the document is the error (exit 1), not an empty stdout."""
    code, doc, err = run_json("status", "--json", "--run-dir", str(tmp_path))
    assert_error(code, doc, 1, "no agent table", str(tmp_path))
    assert "no agent table" in err
    w = TableWriter(tmp_path / "health.tbl", heartbeat_ms=100)
    w.publish([NicHealth("nic0", NicState.UP, 1, rail=0)], {})
    code, doc, _ = run_json("status", "--json", "--run-dir", str(tmp_path))
    assert code == 0 and doc["nics"][0]["ifname"] == "nic0" and doc["agent"]["alive"]
    w.close()


def test_sources_json_is_one_document(monkeypatch: pytest.MonkeyPatch) -> None:
    from railhop.sources import cli as sources_cli
    from railhop.sources.base import Reason, attached, skipped

    caps = [
        attached("netlink", "link", "rtnetlink", ""),
        skipped("ebpf", "carrier", Reason.NOT_AVAILABLE, "no bcc"),
    ]
    monkeypatch.setattr(sources_cli, "capability_report", lambda _s: caps)
    code, doc, _ = run_json("sources", "--json")
    assert code == 0 and doc["attached"] is True
    assert [(c["source"], c["status"]) for c in doc["capabilities"]] == [
        ("netlink", "attached"),
        ("ebpf", "skipped"),
    ]
    caps = caps[1:]
    code, doc, _ = run_json("sources", "--json")
    assert code == 1 and doc["attached"] is False and len(doc["capabilities"]) == 1
    code, doc, _ = run_json("sources", "--json", "--bogus")
    assert_error(code, doc, 2, "--bogus")


def test_every_json_command_is_a_json_command() -> None:
    """A new command with --json that forgets cls=JsonCommand fails here."""

    def walk(cmd: click.Command, path: str) -> list[tuple[str, click.Command]]:
        out = [(path, cmd)]
        if isinstance(cmd, click.Group):
            for name, sub in cmd.commands.items():
                out += walk(sub, f"{path} {name}")
        return out

    with_json = [
        (p, c)
        for p, c in walk(cli, "railhop")
        if any("--json" in getattr(o, "opts", ()) for o in c.params)
    ]
    assert {p for p, _ in with_json} >= {
        "railhop topology",
        "railhop policy check",
        "railhop policy plan",
        "railhop status",
        "railhop sources",
    }
    assert [p for p, c in with_json if not isinstance(c, JsonCommand)] == []


def test_document_refuses_another_version() -> None:
    assert document({"a": 1}) == {"version": JSON_VERSION, "a": 1}
    with pytest.raises(ValueError, match="version"):
        document({"version": JSON_VERSION + 1})
