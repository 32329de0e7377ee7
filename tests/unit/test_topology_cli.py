"""``railhop topology`` (click.testing.CliRunner)."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from railhop.cli import cli

ROOT = Path(__file__).resolve().parents[2]
SYS = ROOT / "tests/fixtures/sys"


def run(*args: str) -> tuple[int, str, str]:
    r = CliRunner().invoke(cli, list(args))
    return r.exit_code, r.stdout, r.stderr


def test_table_dgx() -> None:
    code, out, _ = run("topology", "--root", str(SYS / "dgx-h100"))
    assert code == 0
    lines = out.splitlines()
    assert lines[0].split() == [
        "NIC",
        "NETDEV",
        "LINK",
        "RAIL",
        "NUMA",
        "PCI",
        "PATH",
        "GPU",
        "DIST",
        "STATE",
    ]
    row = next(line.split() for line in lines if line.startswith("mlx5_2 "))
    assert row == [
        "mlx5_2",
        "ibp76s0",
        "InfiniBand",
        "2",
        "0",
        "48:01.0/49:00.0/4a:01.0/4c:00.0",
        "2",
        "PIX",
        "up",
    ]
    storage = next(line.split() for line in lines if line.startswith("mlx5_9 "))
    assert storage[3] == "-" and storage[7] == "PHB"
    assert any(line.startswith("7 ") and "0000:dc:00.0" in line for line in lines)  # GPU table
    assert "NUMA nodes: 0 (cpus 0-55,112-167), 1 (cpus 56-111,168-223)" in out


def test_table_multiplane_with_policy_shows_planes() -> None:
    code, out, _ = run(
        "topology",
        "--root",
        str(SYS / "multiplane"),
        "--policy",
        str(ROOT / "policies/multi-plane.yaml"),
    )
    assert code == 0
    rails = {
        line.split()[0]: line.split()[3] for line in out.splitlines() if line.startswith("mlx5_")
    }
    assert rails == {"mlx5_0": "0", "mlx5_1": "0.1", "mlx5_2": "1", "mlx5_3": "1.1",
                     "mlx5_4": "2", "mlx5_5": "2.1", "mlx5_6": "3", "mlx5_7": "3.1"}  # fmt: skip


def test_json() -> None:
    code, out, _ = run("topology", "--root", str(SYS / "ethernet"), "--json", "--netdev", "veth0")
    assert code == 0
    d = json.loads(out)
    nics = {n["name"]: n for n in d["nics"]}
    assert set(nics) == {"eth0", "ens1f0", "ens1f1", "veth0"}
    assert nics["ens1f1"]["link"] == "down" and nics["ens1f0"]["rail"] == 1
    assert nics["veth0"]["pci"] is None and nics["veth0"]["rail"] == 3
    assert d["gpus"] == [] and d["numa_nodes"] == [{"id": 0, "cpulist": "0-15"}]


def test_policy_rails_and_unmatched_warning(tmp_path: Path) -> None:
    pol = tmp_path / "p.yaml"
    pol.write_text(
        "version: 1\nrails: {mode: explicit, assign: [{nic: eth0, rail: 5}, {nic: x9, rail: 1}]}\n"
    )
    code, out, err = run("topology", "--root", str(SYS / "ethernet"), "--policy", str(pol))
    assert code == 0
    assert next(line for line in out.splitlines() if line.startswith("eth0")).split()[3] == "5"
    assert "policy names NIC 'x9'" in err


def test_errors() -> None:
    code, _, err = run("topology", "--root", "/nonexistent/dir")
    assert code == 2 and "does not exist" in err  # click.BadParameter
    code, _, err = run("topology", "--root", str(ROOT / "policies"))
    assert code == 2 and "no sys/ directory" in err  # domain error


def test_invalid_policy_is_a_domain_error(tmp_path: Path) -> None:
    pol = tmp_path / "p.yaml"
    pol.write_text("version: 1\ndistance_limit: FAR\n")
    code, _, err = run("topology", "--root", str(SYS / "ethernet"), "--policy", str(pol))
    assert code == 2 and f"{pol}:2:17: distance_limit" in err


def test_live_tree() -> None:
    code, out, _ = run("topology")
    assert code == 0 and out.startswith("NIC ")
    code, out, _ = run("topology", "--json")
    assert code == 0 and "nics" in json.loads(out)


def test_version_and_plugin_path_still_there() -> None:
    code, out, _ = run("--version")
    assert code == 0 and out.startswith("railhop, version")
    code, out, _ = run("--help")
    assert {"topology", "policy", "plugin-path"} <= set(out.split())
