"""GPUs of both vendors in the topology (NVIDIA for NCCL, AMD 0x1002 for RCCL), and
``railhop topology`` compared with a captured ``nvidia-smi topo -m`` of the machine the
dgx-h100 fixture tree models (tests/fixtures/nvidia-smi/dgx-h100-topo-m.txt)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from typing import Any

from click.testing import CliRunner

from railhop.cli import cli
from railhop.topology import DistanceClass, pci_distance, read_topology

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
SYS = FIXTURES / "sys"
SMI = FIXTURES / "nvidia-smi" / "dgx-h100-topo-m.txt"


def _gen() -> Any:
    spec = importlib.util.spec_from_file_location("gen", FIXTURES / "gen_sys_fixtures.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def topology_json(root: Path) -> dict[str, Any]:
    r = CliRunner().invoke(cli, ["topology", "--root", str(root), "--json"])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert isinstance(doc, dict)
    return doc


def test_amd_instinct_gpus_are_gpus_and_the_bmc_vga_is_not() -> None:
    root = SYS / "amd-mi300x"
    topo = read_topology(root)
    assert [(g.index, g.vendor, g.pci.bdf) for g in topo.gpus] == [
        (i, "amd", f"0000:{b:02x}:00.0")
        for i, b in enumerate([0x08, 0x18, 0x68, 0x78, 0x88, 0x98, 0xE8, 0xF8])
    ]
    assert "0000:03:00.0" not in {g.pci.bdf for g in topo.gpus}  # ASPEED VGA
    # every RoCE NIC is next to its GPU (PIX) and gets the rail of that GPU
    for i in range(8):
        nic = topo.find_nic(f"bnxt_re{i}")
        assert nic is not None
        near = topo.nearest_gpu(nic)
        assert near is not None and (near[0].index, near[1]) == (i, DistanceClass.PIX)
    doc = topology_json(root)
    assert {g["vendor"] for g in doc["gpus"]} == {"amd"}
    text = CliRunner().invoke(cli, ["topology", "--root", str(root)]).stdout
    assert "GPU  VENDOR  PCI" in text and "\n0    amd     0000:08:00.0" in text


def test_amd_gpu_by_driver_and_non_gpu_functions(tmp_path: Path) -> None:
    """amdgpu-bound functions count even without a class file; other AMD functions (HD audio)
    and AMD CPU devices (0x1022) do not; both vendors share one PCI-order index."""
    t = _gen().Tree(tmp_path)
    t.numa(0, "0-7")
    t.pci("0000:00", ["0000:00:01.1", "0000:c1:00.0"], vendor=0x1002, device=0x740F,
          cls=0x038000, numa=0, driver="amdgpu")  # fmt: skip
    t.pci("0000:00", ["0000:00:01.1", "0000:c1:00.1"], vendor=0x1002, device=0xAB28,
          cls=0x040300, numa=0, driver="snd_hda_intel")  # fmt: skip
    t.pci("0000:00", ["0000:00:02.1", "0000:a1:00.0"], vendor=0x1022, device=0x14DA,
          cls=0x130000, numa=0, driver=None)  # fmt: skip
    t.pci("0000:00", ["0000:00:03.1", "0000:41:00.0"], vendor=0x10DE, device=0x2330,
          cls=0x030200, numa=0, driver="nvidia")  # fmt: skip
    gpu = t.pci("0000:00", ["0000:00:04.1", "0000:e1:00.0"], vendor=0x1002, device=0x74A1,
                cls=0x120000, numa=0, driver="amdgpu")  # fmt: skip
    (gpu / "class").unlink()
    topo = read_topology(tmp_path)
    assert [(g.index, g.vendor, g.pci.bdf) for g in topo.gpus] == [
        (0, "nvidia", "0000:41:00.0"),
        (1, "amd", "0000:c1:00.0"),
        (2, "amd", "0000:e1:00.0"),
    ]


# --- nvidia-smi topo -m ------------------------------------------------------------------------


def parse_topo_m(text: str) -> tuple[dict[tuple[str, str], str], dict[str, str], dict[str, str]]:
    """The matrix (row, column) -> level, the NIC legend (NICk -> name) and each GPU's NUMA
    affinity, from ``nvidia-smi topo -m`` output (tab-separated)."""
    lines = text.splitlines()
    header = lines[0].split("\t")[1:]
    matrix: dict[tuple[str, str], str] = {}
    numa: dict[str, str] = {}
    for line in lines[1:]:
        if not line.strip():
            break
        cells = line.split("\t")
        row, values = cells[0], [c.strip() for c in cells[1:]]
        for col, v in zip(header, values, strict=False):
            if col.startswith(("GPU", "NIC")) and col[3:].isdigit():
                matrix[(row, col)] = v
            elif col == "NUMA Affinity":
                numa[row] = v
    legend = {}
    for line in lines:
        name, sep, dev = line.strip().partition(": ")
        if sep and name.startswith("NIC") and name[3:].isdigit():
            legend[name] = dev
    return matrix, legend, numa


def test_railhop_topology_agrees_with_nvidia_smi_topo_m() -> None:
    """Every GPU-NIC and NIC-NIC level of the capture equals railhop's PCI distance class,
    every NIC's nearest GPU and DIST in `railhop topology --json` is the closest GPU of the
    capture's row, and the GPUs' NUMA affinity matches."""
    root = SYS / "dgx-h100"
    matrix, legend, numa = parse_topo_m(SMI.read_text())
    assert len(legend) == 10
    topo = read_topology(root)
    gpus = {f"GPU{g.index}": g for g in topo.gpus}
    assert set(gpus) == {r for r, _c in matrix if r.startswith("GPU")}
    nics = {}
    for k, name in legend.items():
        nic = topo.find_nic(name)
        assert nic is not None and nic.pci is not None, name
        nics[k] = nic
    compared = 0
    for (row, col), level in matrix.items():
        a = gpus.get(row) or nics.get(row)
        b = gpus.get(col) or nics.get(col)
        assert a is not None and b is not None
        if row == col:
            assert level == "X"
            continue
        if row.startswith("GPU") and col.startswith("GPU"):
            assert level.startswith("NV")  # NVLink: not a PCI distance
            continue
        assert a.pci is not None and b.pci is not None
        assert pci_distance(a.pci, b.pci).name == level, (row, col)
        compared += 1
    assert compared == 8 * 10 * 2 + 10 * 9
    for g, want in numa.items():
        assert str(gpus[g].numa_node) == want, g

    doc = topology_json(root)
    by_name = {n["name"]: n for n in doc["nics"]}
    for k, name in legend.items():
        levels = [(DistanceClass[matrix[(k, g)]], int(g[3:])) for g in sorted(gpus)]
        best, idx = min(levels)
        got = by_name[name]
        assert got["nearest_gpu"] == {"index": idx, "distance": best.name}, name
        assert got["gpu_distance"] == [matrix[(k, f"GPU{i}")] for i in range(8)], name
