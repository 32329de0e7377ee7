"""railhop.topology against the fixture trees (tests/fixtures/sys) and the live /sys."""

from __future__ import annotations

import dataclasses
import filecmp
import importlib.util
import json
import os
import shutil
from pathlib import Path
from typing import Any

import pytest

from conftest import require
from railhop.topology import (
    DistanceClass,
    PciDevice,
    Topology,
    TopologyError,
    auto_rails,
    pci_distance,
    read_topology,
    to_dict,
)

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
SYS = FIXTURES / "sys"
D = DistanceClass


@pytest.fixture(scope="module")
def dgx() -> Topology:
    return read_topology(SYS / "dgx-h100")


@pytest.fixture(scope="module")
def multiplane() -> Topology:
    return read_topology(SYS / "multiplane")


@pytest.fixture(scope="module")
def ethernet() -> Topology:
    return read_topology(SYS / "ethernet")


# --- the fixture trees are what the generator makes ------------------------------------------


def _tree(root: Path) -> dict[str, str]:
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            p = Path(dirpath) / name
            rel = str(p.relative_to(root))
            if p.is_symlink():
                out[rel] = "-> " + os.readlink(p)
            elif p.is_file():
                out[rel] = p.read_text()
            else:
                out[rel] = "<dir>"
    return out


def test_fixtures_match_generator(tmp_path: Path) -> None:
    _gen().generate(tmp_path)
    for name in ("dgx-h100", "multiplane", "ethernet", "amd-mi300x"):
        want, have = _tree(tmp_path / name), _tree(SYS / name)
        assert have == want, f"{name}: regenerate with tests/fixtures/gen_sys_fixtures.py"
    assert not filecmp.dircmp(tmp_path, SYS).left_only


# --- DGX H100 ---------------------------------------------------------------------------------


def test_dgx_inventory(dgx: Topology) -> None:
    assert [n.id for n in dgx.numa_nodes] == [0, 1]
    assert dgx.numa_nodes[0].cpulist == "0-55,112-167"
    assert len(dgx.gpus) == 8  # NVSwitches (class 0x0680, NVIDIA) are not GPUs
    assert [g.numa_node for g in dgx.gpus] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert dgx.gpus[0].pci.bdf == "0000:18:00.0" and dgx.gpus[0].pci.driver == "nvidia"
    names = {n.name for n in dgx.nics}
    assert names == {f"mlx5_{i}" for i in range(10)} | {"eno1"}  # lo, docker0 are virtual


def test_dgx_compute_nics(dgx: Topology) -> None:
    for i in range(8):
        n = dgx.nic(f"mlx5_{i}")
        assert n.rdma_device == f"mlx5_{i}"
        assert n.link_layer == "InfiniBand"
        assert n.netdev is not None and n.netdev.startswith("ibp")  # IPoIB, found by PCI function
        assert len(n.ports) == 1 and n.ports[0].state == "ACTIVE"
        assert n.ports[0].phys_state == "LinkUp" and n.ports[0].netdev is None
        assert n.link_up is True
        assert n.numa_node == (0 if i < 4 else 1)
        assert n.speed_mbps == 400000
        near = dgx.nearest_gpu(n)
        assert near is not None and near[0].index == i and near[1] is D.PIX


def test_dgx_storage_nics_roce_netdev(dgx: Topology) -> None:
    s8, s9 = dgx.nic("mlx5_8"), dgx.nic("mlx5_9")
    assert s8.link_layer == s9.link_layer == "Ethernet"
    assert s8.netdev == "enp28s0np0" and s8.ports[0].netdev == "enp28s0np0"  # gid_attrs/ndevs
    assert s9.netdev == "enp157s0np0"
    assert s8.speed_mbps == 200000
    # lookups by netdev name and PCI address find the same NIC
    assert dgx.nic("enp28s0np0") == s8 == dgx.nic("0000:1c:00.0")


def test_dgx_pci_tree(dgx: Topology) -> None:
    n = dgx.nic("mlx5_0")
    assert n.pci is not None
    assert n.pci.root_complex == "pci0000:15"
    assert n.pci.chain == ("0000:15:01.0", "0000:16:00.0", "0000:17:01.0", "0000:19:00.0")
    assert n.pci.sysfs_path == "/sys/devices/pci0000:15/" + "/".join(n.pci.chain)
    assert n.pci.vendor == 0x15B3 and n.pci.class_code == 0x020700
    assert n.pci.driver == "mlx5_core"
    bridge = dgx.pci("0000:16:00.0")
    assert bridge is not None and bridge.class_code == 0x060400


@pytest.mark.parametrize(
    ("gpu", "nic", "want"),
    [
        (0, "mlx5_0", D.PIX),  # same PCIe switch
        (0, "mlx5_8", D.PXB),  # GPU0's switch, then a second switch level
        (4, "mlx5_9", D.PHB),  # same root complex, different root port
        (0, "mlx5_1", D.NODE),  # another root complex, same socket
        (0, "mlx5_3", D.NODE),
        (0, "mlx5_4", D.SYS),  # other socket
        (7, "mlx5_0", D.SYS),
        (0, "eno1", D.NODE),
    ],
)
def test_dgx_gpu_nic_distance(dgx: Topology, gpu: int, nic: str, want: DistanceClass) -> None:
    n = dgx.nic(nic)
    assert n.pci is not None
    assert pci_distance(dgx.gpus[gpu].pci, n.pci) is want
    assert pci_distance(n.pci, dgx.gpus[gpu].pci) is want  # symmetric


def test_dgx_nic_nic_distance(dgx: Topology) -> None:
    n = {x.name: x for x in dgx.nics}
    assert dgx.nic_distance(n["mlx5_2"], n["mlx5_2"]) is D.LOC
    assert dgx.nic_distance(n["mlx5_0"], n["mlx5_8"]) is D.PXB
    assert dgx.nic_distance(n["mlx5_2"], n["mlx5_0"]) is D.NODE
    assert dgx.nic_distance(n["mlx5_2"], n["mlx5_5"]) is D.SYS


def test_dgx_auto_rails(dgx: Topology) -> None:
    rails = auto_rails(dgx)
    # compute NICs only (storage mlx5_8 is PXB from GPU0, which has mlx5_0 at PIX)
    assert rails == {f"mlx5_{i}": (i, 0) for i in range(8)}
    t = dgx.with_rails(rails)
    assert t.nic("mlx5_3").rail == 3 and t.nic("mlx5_8").rail is None


# --- multi-plane --------------------------------------------------------------------------------


def test_multiplane(multiplane: Topology) -> None:
    assert len(multiplane.gpus) == 4
    # GPU 2 has an unusual class; it is found through /sys/bus/pci/drivers/nvidia
    assert multiplane.gpus[2].pci.class_code == 0x038000
    rails = auto_rails(multiplane)
    assert rails == {f"mlx5_{i}": (i // 2, i % 2) for i in range(8)}
    a, b = multiplane.nic("mlx5_0"), multiplane.nic("mlx5_1")
    assert multiplane.nic_distance(a, b) is D.PIX
    assert a.netdev == "enp20s0np0" and a.link_layer == "Ethernet"


# --- plain Ethernet host --------------------------------------------------------------------


def test_ethernet_host(ethernet: Topology) -> None:
    assert ethernet.gpus == ()
    assert [n.name for n in ethernet.nics] == ["eth0", "ens1f0", "ens1f1"]
    eth0 = ethernet.nic("eth0")
    # netdev below a virtio device below the PCI function
    assert eth0.pci is not None and eth0.pci.bdf == "0000:00:03.0"
    assert eth0.rdma_device is None and eth0.link_layer == "Ethernet"
    assert eth0.numa_node == 0  # numa_node -1 on a one-node machine
    assert eth0.speed_mbps is None  # speed -1
    f0, f1 = ethernet.nic("ens1f0"), ethernet.nic("ens1f1")
    assert f0.link_up is True and f1.link_up is False and f1.operstate == "down"
    assert ethernet.nic_distance(f0, f1) is D.PIX  # two functions of one device
    assert ethernet.nic_distance(eth0, f0) is D.PHB
    assert auto_rails(ethernet) == {"eth0": (0, 0), "ens1f0": (1, 0), "ens1f1": (2, 0)}
    assert ethernet.nearest_gpu(eth0) is None


def _gen() -> Any:
    spec = importlib.util.spec_from_file_location("gen", FIXTURES / "gen_sys_fixtures.py")
    assert spec is not None and spec.loader is not None
    gen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen)
    return gen


def test_roce_lag_names_its_bond(tmp_path: Path) -> None:
    """mlx5_bond_0's GIDs point at bond0 (virtual); both member netdevs belong to the NIC."""
    gen = _gen()
    t = gen.Tree(tmp_path / "lag")
    gen.ethernet(t)
    pf0 = t.sys / "devices/pci0000:00/0000:00:01.0/0000:3b:00.0"
    t.netdev("bond0", None, mac="3c:fd:fe:00:00:00", speed=20000)
    t.rdma("mlx5_bond_0", pf0, [{"link_layer": "Ethernet", "ndev": "bond0"}])
    topo = read_topology(t.root)
    nic = topo.nic("mlx5_bond_0")
    assert nic.netdev == "bond0" and nic.speed_mbps == 20000
    assert nic.pci is not None and nic.pci.bdf == "0000:3b:00.0"
    # ens1f0 is PF0's netdev: part of the bond NIC now, not a NIC of its own
    assert {n.name for n in topo.nics} == {"eth0", "mlx5_bond_0", "ens1f1"}


def test_virtual_netdevs_on_request() -> None:
    t = read_topology(SYS / "ethernet", netdevs=["veth0"])
    v = t.nic("veth0")
    assert v.pci is None and v.numa_node == 0 and v.link_up is True
    assert t.nic_distance(v, t.nic("eth0")) is D.NODE  # same NUMA node, no PCI information
    # named virtual NICs follow the physical ones, in natural name order
    assert auto_rails(t) == {"eth0": (0, 0), "ens1f0": (1, 0), "ens1f1": (2, 0), "veth0": (3, 0)}


def test_emulated_fabric_nics_get_rails_in_name_order() -> None:
    """The daemon keeps only the named veths: they are rails 0..n-1, even on a GPU node."""
    t = read_topology(SYS / "ethernet", netdevs=["veth0", "br0"])
    only_virtual = dataclasses.replace(t, nics=tuple(n for n in t.nics if n.pci is None))
    assert auto_rails(only_virtual) == {"br0": (0, 0), "veth0": (1, 0)}
    dgx = read_topology(SYS / "dgx-h100", netdevs=["docker0"])
    assert auto_rails(dgx)["docker0"] == (8, 0)  # after the 8 compute rails


# --- degraded trees: a missing file drops a value, not the read ---------------------------


def _copy(name: str, tmp_path: Path) -> Path:
    dst = tmp_path / name
    shutil.copytree(SYS / name, dst, symlinks=True)
    return dst


def test_missing_files_drop_values(tmp_path: Path) -> None:
    root = _copy("dgx-h100", tmp_path)
    dev = root / "sys/devices/pci0000:15/0000:15:01.0/0000:16:00.0/0000:17:01.0/0000:19:00.0"
    (dev / "numa_node").unlink()
    (dev / "class").unlink()
    port = dev / "infiniband/mlx5_0/ports/1"
    (port / "state").unlink()
    (port / "rate").unlink()
    (dev / "net/ibp25s0/carrier").unlink()
    (dev / "net/ibp25s0/speed").unlink()
    (root / "sys/devices/system/node/node1/cpulist").unlink()
    t = read_topology(root)
    n = t.nic("mlx5_0")
    assert n.pci is not None and n.pci.numa_node is None and n.pci.class_code is None
    assert n.numa_node is None
    assert n.ports[0].state is None and n.ports[0].link_layer == "InfiniBand"
    assert n.speed_mbps is None
    assert n.link_up is True  # falls back to operstate
    assert [(x.id, x.cpulist) for x in t.numa_nodes] == [(0, "0-55,112-167"), (1, None)]
    # unknown NUMA node: distance to another root complex is SYS (conservative)
    assert t.nic_distance(n, t.nic("mlx5_1")) is D.SYS


def test_broken_and_escaping_links_are_skipped(tmp_path: Path) -> None:
    root = _copy("ethernet", tmp_path)
    (root / "sys/class/net/dangling").symlink_to("../../devices/nowhere/net/dangling")
    outside = tmp_path / "outside/net/evil"
    outside.mkdir(parents=True)
    (outside / "device").mkdir()
    (root / "sys/class/net/evil").symlink_to(outside)  # absolute, leaves the root
    (root / "sys/bus/pci/devices/0000:ff:00.0").symlink_to("/sys/devices/pci0000:00")
    t = read_topology(root)
    assert {n.name for n in t.nics} == {"eth0", "ens1f0", "ens1f1"}
    assert t.pci("0000:ff:00.0") is None


def test_empty_and_bad_roots(tmp_path: Path) -> None:
    with pytest.raises(TopologyError, match="no sys/"):
        read_topology(tmp_path)
    (tmp_path / "sys").mkdir()
    t = read_topology(tmp_path)
    assert t.nics == () and t.gpus == () and t.numa_nodes == ()
    with pytest.raises(TopologyError, match="no NIC named"):
        t.nic("mlx5_0")


# --- pure distance rules ----------------------------------------------------------------------


def _dev(bdf: str, rc: str, bridges: list[str], numa: int | None = 0) -> PciDevice:
    chain = (*bridges, bdf)
    return PciDevice(bdf, rc, chain, "/sys/devices/" + rc + "/" + "/".join(chain), numa_node=numa)


def test_pci_distance_rules() -> None:
    rp, up, d1, d2 = "0000:10:01.0", "0000:11:00.0", "0000:12:00.0", "0000:12:01.0"
    a = _dev("0000:13:00.0", "pci0000:10", [rp, up, d1])
    b = _dev("0000:14:00.0", "pci0000:10", [rp, up, d2])
    assert pci_distance(a, a) is D.LOC
    assert pci_distance(a, b) is D.PIX
    # b behind a second switch under the same first switch: PXB
    deep = _dev("0000:17:00.0", "pci0000:10", [rp, up, d2, "0000:15:00.0", "0000:16:00.0"])
    assert pci_distance(a, deep) is D.PXB
    # different root ports of one host bridge: PHB
    other_rp = _dev("0000:20:00.0", "pci0000:10", ["0000:10:02.0"])
    assert pci_distance(a, other_rp) is D.PHB
    # integrated endpoints on the root bus
    assert pci_distance(_dev("0000:10:03.0", "pci0000:10", []), other_rp) is D.PHB
    # directly under the same root port (functions of one device): PIX
    f0 = _dev("0000:20:00.0", "pci0000:10", ["0000:10:02.0"])
    f1 = _dev("0000:20:00.1", "pci0000:10", ["0000:10:02.0"])
    assert pci_distance(f0, f1) is D.PIX
    # different root complexes
    c = _dev("0000:31:00.0", "pci0000:30", ["0000:30:01.0"], numa=0)
    s = _dev("0000:91:00.0", "pci0000:90", ["0000:90:01.0"], numa=1)
    u = _dev("0000:a1:00.0", "pci0000:a0", ["0000:a0:01.0"], numa=None)
    assert pci_distance(a, c) is D.NODE
    assert pci_distance(a, s) is D.SYS
    assert pci_distance(a, u) is D.SYS


def test_distance_class_parse_and_order() -> None:
    assert DistanceClass.parse("node") is D.NODE
    assert D.PIX < D.PXB < D.PHB < D.NODE < D.SYS
    with pytest.raises(TopologyError, match="unknown distance class"):
        DistanceClass.parse("NV18")


def test_to_dict_is_json(dgx: Topology) -> None:
    d = json.loads(json.dumps(to_dict(dgx.with_rails(auto_rails(dgx)))))
    nic = next(x for x in d["nics"] if x["name"] == "mlx5_2")
    assert nic["rail"] == 2 and nic["nearest_gpu"] == {"index": 2, "distance": "PIX"}
    assert nic["gpu_distance"] == ["NODE", "NODE", "PIX", "NODE", "SYS", "SYS", "SYS", "SYS"]
    assert nic["pci"]["path"].endswith("0000:4c:00.0")
    assert len(d["gpus"]) == 8


# --- the live tree of this machine ------------------------------------------------------------


LIVE = Path("/sys/class/net").is_dir()


def test_live_tree() -> None:
    require(LIVE, "no /sys/class/net on this machine")
    t = read_topology("/")
    netdevs = set(os.listdir("/sys/class/net"))
    pci = (
        set(os.listdir("/sys/bus/pci/devices")) if Path("/sys/bus/pci/devices").is_dir() else set()
    )
    for n in t.nics:
        assert n.netdev is None or n.netdev in netdevs
        if n.netdev is not None and n.rdma_device is None:
            # only netdevs backed by a device are NICs
            assert Path(f"/sys/class/net/{n.netdev}/device").exists()
        if n.pci is not None:
            assert n.pci.bdf in pci
            assert (
                Path(n.pci.sysfs_path).resolve()
                == Path(f"/sys/bus/pci/devices/{n.pci.bdf}").resolve()
            )
        assert t.nic_distance(n, n) is D.LOC
    assert "lo" not in {n.netdev for n in t.nics}
    for g in t.gpus:
        assert g.pci.bdf in pci
    if Path("/sys/devices/system/node/node0").is_dir():
        assert 0 in {x.id for x in t.numa_nodes}
    json.dumps(to_dict(t))
    rails = auto_rails(t)
    assert set(rails) <= {n.name for n in t.nics}
