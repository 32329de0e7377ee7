"""Node topology read from sysfs: NICs, GPUs, the PCI tree, NUMA nodes and PCIe distance classes.

Everything is read under a ``root`` directory (``/`` on a live node, a fixture tree in tests), so
``read_topology(root)`` looks at ``<root>/sys/...``. A file that is missing or unreadable drops
that one value (``None``), never the whole read; only an unusable ``root`` raises.

Distance classes follow ``nvidia-smi topo -m`` (NCCL uses the same ladder but folds NODE into
PHB); see ``docs/policy.md`` for the definitions the C plugin shares:

* ``PIX``  - the two devices meet below at most one PCIe bridge (typically one PCIe switch);
* ``PXB``  - they meet below several bridges, but not at the host bridge;
* ``PHB``  - their paths meet only at a PCIe host bridge (same root complex);
* ``NODE`` - different root complexes within one NUMA node;
* ``SYS``  - different NUMA nodes (the path crosses the inter-socket link).

``LOC`` is the same PCI function (a device compared with itself).
"""

from __future__ import annotations

import enum
import os
import re
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path

__all__ = [
    "GPU_VENDOR_AMD",
    "GPU_VENDOR_NVIDIA",
    "DistanceClass",
    "Gpu",
    "Nic",
    "NumaNode",
    "PciDevice",
    "RdmaPort",
    "Topology",
    "TopologyError",
    "auto_rails",
    "compact_pci_path",
    "pci_distance",
    "read_topology",
    "to_dict",
]

GPU_VENDOR_NVIDIA = 0x10DE
GPU_VENDOR_AMD = 0x1002  # AMD/ATI graphics (RCCL); AMD's CPUs and chipsets are 0x1022
_GPU_CLASSES = (0x0302, 0x0300)  # 3D controller (data-centre GPUs), VGA controller
# AMD Instinct: MI300 are processing accelerators (0x1200), MI100/MI200 display controllers
_AMD_GPU_CLASSES = (0x0302, 0x0300, 0x0380, 0x1200)
GPU_DRIVERS = {"nvidia": GPU_VENDOR_NVIDIA, "amdgpu": GPU_VENDOR_AMD}
_BDF_RE = re.compile(r"^[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$")
_ROOT_COMPLEX_RE = re.compile(r"^pci[0-9a-f]{4}:[0-9a-f]{2}$")


class TopologyError(Exception):
    """Base class of every error raised by :mod:`railhop.topology`."""


class DistanceClass(enum.IntEnum):
    """How far apart two PCI devices are; larger is farther (ordered like NVML's levels)."""

    LOC = 0
    PIX = 1
    PXB = 2
    PHB = 3
    NODE = 4
    SYS = 5

    @classmethod
    def parse(cls, text: str) -> DistanceClass:
        """``"node"`` / ``"NODE"`` -> ``DistanceClass.NODE``; raises :class:`TopologyError`."""
        try:
            return cls[text.strip().upper()]
        except KeyError:
            names = ", ".join(c.name for c in cls)
            raise TopologyError(
                f"unknown distance class {text!r} (expected one of {names})"
            ) from None


@dataclass(frozen=True)
class PciDevice:
    """One PCI function and the bridges above it.

    ``chain`` lists the BDFs from the root port down to this function (inclusive), so bridges are
    ``chain[:-1]``; ``root_complex`` is the ``pciDDDD:BB`` host bridge directory name.
    """

    bdf: str
    root_complex: str
    chain: tuple[str, ...]
    sysfs_path: str  # e.g. /sys/devices/pci0000:15/0000:15:01.0/.../0000:19:00.0 (root-relative)
    vendor: int | None = None
    device: int | None = None
    class_code: int | None = None  # 24-bit class, e.g. 0x030200
    numa_node: int | None = None
    driver: str | None = None

    @property
    def bridges(self) -> tuple[str, ...]:
        return self.chain[:-1]


@dataclass(frozen=True)
class RdmaPort:
    """One port of an RDMA device (``/sys/class/infiniband/<dev>/ports/<n>``)."""

    num: int
    state: str | None = None  # "ACTIVE", "DOWN", ... (text after "N: ")
    phys_state: str | None = None  # "LinkUp", "Disabled", ...
    link_layer: str | None = None  # "InfiniBand" | "Ethernet"
    rate: str | None = None  # "400 Gb/sec (4X NDR)"
    netdev: str | None = None  # RoCE: netdev behind the port's GIDs (gid_attrs/ndevs)

    @property
    def active(self) -> bool:
        return self.state == "ACTIVE"


@dataclass(frozen=True)
class Nic:
    """A network interface: an RDMA device (with its netdev, if any) or a plain netdev.

    ``name`` is the RDMA device name when there is one (``mlx5_0``), else the netdev name.
    ``rail``/``plane`` are ``None`` until rails are assigned (:func:`auto_rails` or a policy).
    """

    name: str
    netdev: str | None = None
    rdma_device: str | None = None
    ports: tuple[RdmaPort, ...] = ()
    pci: PciDevice | None = None
    numa_node: int | None = None
    operstate: str | None = None  # netdev operstate ("up", "down", ...)
    carrier: bool | None = None
    speed_mbps: int | None = None
    mac: str | None = None
    rail: int | None = None
    plane: int | None = None

    @property
    def link_layer(self) -> str | None:
        for p in self.ports:
            if p.link_layer:
                return p.link_layer
        return "Ethernet" if self.netdev is not None and self.rdma_device is None else None

    @property
    def link_up(self) -> bool | None:
        """Port ACTIVE (RDMA) or carrier/operstate up (netdev); ``None`` when nothing is known."""
        if self.ports and any(p.state is not None for p in self.ports):
            return any(p.active for p in self.ports)
        if self.carrier is not None:
            return self.carrier
        if self.operstate is not None and self.operstate != "unknown":
            return self.operstate == "up"
        return None

    @property
    def names(self) -> frozenset[str]:
        """Every name a policy may use for this NIC: RDMA device, netdev, PCI address."""
        out = {self.name}
        if self.netdev:
            out.add(self.netdev)
        if self.rdma_device:
            out.add(self.rdma_device)
        if self.pci:
            out.add(self.pci.bdf)
        return frozenset(out)


@dataclass(frozen=True)
class Gpu:
    """A GPU; ``index`` is its position in PCI bus order (``CUDA_DEVICE_ORDER=PCI_BUS_ID``)."""

    index: int
    pci: PciDevice

    @property
    def numa_node(self) -> int | None:
        return self.pci.numa_node

    @property
    def vendor(self) -> str:
        """``nvidia`` (NCCL), ``amd`` (RCCL) or the PCI vendor id."""
        v = self.pci.vendor
        if v == GPU_VENDOR_NVIDIA or self.pci.driver == "nvidia":
            return "nvidia"
        if v == GPU_VENDOR_AMD or self.pci.driver == "amdgpu":
            return "amd"
        return f"0x{v:04x}" if v is not None else "unknown"


@dataclass(frozen=True)
class NumaNode:
    id: int
    cpulist: str | None = None


@dataclass(frozen=True)
class Topology:
    """A snapshot of one node. Build with :func:`read_topology`; never mutated."""

    root: str
    nics: tuple[Nic, ...]
    gpus: tuple[Gpu, ...]
    numa_nodes: tuple[NumaNode, ...]
    pci_devices: tuple[PciDevice, ...] = field(repr=False, default=())

    def nic(self, name: str) -> Nic:
        """The NIC called ``name`` (RDMA device, netdev or PCI address)."""
        for n in self.nics:
            if name in n.names:
                return n
        raise TopologyError(f"no NIC named {name!r} (have: {', '.join(n.name for n in self.nics)})")

    def find_nic(self, name: str) -> Nic | None:
        try:
            return self.nic(name)
        except TopologyError:
            return None

    def pci(self, bdf: str) -> PciDevice | None:
        for d in self.pci_devices:
            if d.bdf == bdf:
                return d
        return None

    def nic_distance(self, a: Nic, b: Nic) -> DistanceClass:
        """Distance between two NICs; NICs without a PCI device compare by NUMA node only."""
        if a.name == b.name:
            return DistanceClass.LOC
        if a.pci is not None and b.pci is not None:
            return pci_distance(a.pci, b.pci)
        if a.numa_node is not None and a.numa_node == b.numa_node:
            return DistanceClass.NODE
        return DistanceClass.SYS

    def nearest_gpu(self, nic: Nic) -> tuple[Gpu, DistanceClass] | None:
        """The GPU closest to ``nic`` (ties: lowest index), or ``None`` without GPUs/PCI info."""
        if nic.pci is None or not self.gpus:
            return None
        return min(
            ((g, pci_distance(g.pci, nic.pci)) for g in self.gpus),
            key=lambda gd: (gd[1], gd[0].index),
        )

    def with_rails(self, rails: Mapping[str, tuple[int, int]]) -> Topology:
        """A copy where NIC ``name`` gets ``(rail, plane)`` from ``rails``; others lose theirs."""
        nics = tuple(
            replace(n, rail=rails[n.name][0], plane=rails[n.name][1])
            if n.name in rails
            else replace(n, rail=None, plane=None)
            for n in self.nics
        )
        return replace(self, nics=nics)


def pci_distance(a: PciDevice, b: PciDevice) -> DistanceClass:
    """The ``nvidia-smi topo -m`` class of the PCIe path between two functions.

    Different root complexes: ``NODE`` when both sit on the same known NUMA node, else ``SYS``.
    Same root complex: strip the bridges both paths share; if none is shared the path goes
    through the host bridge (``PHB``); if at most one bridge level is left on each side the two
    meet below a single switch (``PIX``), else ``PXB``. Two functions of one device (same
    bridges) are ``PIX``; a device with itself is ``LOC``.
    """
    if a.bdf == b.bdf:
        return DistanceClass.LOC
    if a.root_complex != b.root_complex:
        if a.numa_node is not None and a.numa_node == b.numa_node:
            return DistanceClass.NODE
        return DistanceClass.SYS
    ba, bb = a.bridges, b.bridges
    shared = 0
    while shared < min(len(ba), len(bb)) and ba[shared] == bb[shared]:
        shared += 1
    if shared == 0:  # paths meet at the host bridge (also: integrated endpoints on the root bus)
        return DistanceClass.PHB
    # A PCIe switch is an upstream port plus a downstream port: meeting below one switch leaves
    # exactly the downstream port on each side.
    if len(ba) - shared <= 1 and len(bb) - shared <= 1:
        return DistanceClass.PIX
    return DistanceClass.PXB


def auto_rails(topo: Topology) -> dict[str, tuple[int, int]]:
    """Derive ``name -> (rail, plane)`` for the node's compute NICs.

    With GPUs: a NIC is a compute NIC when it is the closest NIC (at PIX or PXB) of some GPU.
    Compute NICs are grouped by their nearest GPU; groups are numbered in GPU order (rail), NICs
    inside a group in PCI order (plane). Without GPUs every NIC with a PCI device is a compute
    NIC, one rail each in PCI order. Virtual NICs (no PCI device; present only when named to
    :func:`read_topology`, as on the emulated fabric) follow, one rail each in natural name
    order (``nic2`` before ``nic10``).
    """
    physical = [n for n in topo.nics if n.pci is not None]
    rails: dict[str, tuple[int, int]] = {}
    if not topo.gpus:
        ordered = sorted(physical, key=lambda n: _bdf_key(n.pci.bdf if n.pci else ""))
        rails = {n.name: (i, 0) for i, n in enumerate(ordered)}
    else:
        best_per_gpu: dict[int, DistanceClass] = {}
        for g in topo.gpus:
            ds = [pci_distance(g.pci, n.pci) for n in physical if n.pci is not None]
            if ds:
                best_per_gpu[g.index] = min(ds)
        groups: dict[int, list[Nic]] = {}
        for n in physical:
            near = topo.nearest_gpu(n)
            if near is None:
                continue
            gpu, dist = near
            if dist > DistanceClass.PXB or dist != best_per_gpu.get(gpu.index):
                continue
            groups.setdefault(gpu.index, []).append(n)
        for rail, gpu_index in enumerate(sorted(groups)):
            members = sorted(groups[gpu_index], key=lambda n: _bdf_key(n.pci.bdf if n.pci else ""))
            for plane, n in enumerate(members):
                rails[n.name] = (rail, plane)
    virtual = sorted((n for n in topo.nics if n.pci is None), key=lambda n: _natural(n.name))
    first = max((r for r, _ in rails.values()), default=-1) + 1
    for i, n in enumerate(virtual):
        rails[n.name] = (first + i, 0)
    return rails


def _natural(name: str) -> tuple[tuple[int, int | str], ...]:
    return tuple((0, int(p)) if p.isdigit() else (1, p) for p in re.split(r"(\d+)", name) if p)


# --------------------------------------------------------------------------------------------
# reading sysfs


def read_topology(root: str | os.PathLike[str] = "/", *, netdevs: Collection[str] = ()) -> Topology:
    """Read the node's topology under ``root``.

    NICs are RDMA devices plus netdevs backed by a device (physical or SR-IOV); virtual netdevs
    (loopback, veth, bridges, ...) are skipped unless named in ``netdevs``.
    Raises :class:`TopologyError` only when ``root`` has no ``sys`` directory.
    """
    sysfs = _Sysfs(Path(root))
    if not (sysfs.root / "sys").is_dir():
        raise TopologyError(f"{sysfs.root}: no sys/ directory under this root")
    numa = _read_numa(sysfs)
    single_node = numa[0].id if len(numa) == 1 else None
    pci = _read_pci(sysfs, single_node)
    by_bdf = {d.bdf: d for d in pci}
    gpus = _read_gpus(sysfs, pci)
    nics = _read_nics(sysfs, by_bdf, single_node, set(netdevs))
    return Topology(
        root=str(sysfs.root), nics=nics, gpus=gpus, numa_nodes=numa, pci_devices=tuple(pci)
    )


class _Sysfs:
    """Small helpers that read files under a root and turn every OSError into ``None``."""

    def __init__(self, root: Path) -> None:
        self.root = root.resolve()

    def path(self, rel: str) -> Path:
        return self.root / rel.lstrip("/")

    def read(self, p: Path) -> str | None:
        try:
            return p.read_text(errors="replace").strip()
        except (OSError, ValueError):
            return None

    def listdir(self, p: Path) -> list[str]:
        try:
            return sorted(os.listdir(p))
        except OSError:
            return []

    def realpath(self, p: Path) -> Path | None:
        """Resolve symlinks; ``None`` when the target leaves the root or does not exist."""
        try:
            real = Path(os.path.realpath(p, strict=True))
        except (OSError, RuntimeError):
            return None
        if real != self.root and self.root not in real.parents:
            return None
        return real

    def rel(self, p: Path) -> str:
        return "/" + str(p.relative_to(self.root))


def _int(text: str | None, base: int = 10) -> int | None:
    if text is None:
        return None
    try:
        return int(text, base)
    except ValueError:
        return None


def _bdf_key(bdf: str) -> tuple[int, ...]:
    parts = re.split(r"[:.]", bdf)
    try:
        return tuple(int(x, 16) for x in parts)
    except ValueError:
        return (1 << 30,)


def _pci_chain(sysfs: _Sysfs, real: Path) -> tuple[str, tuple[str, ...]] | None:
    """``(root_complex, (bdf, ...))`` from a resolved ``/sys/devices/...`` path, or ``None``."""
    parts = real.relative_to(sysfs.root).parts
    for i, part in enumerate(parts):
        if _ROOT_COMPLEX_RE.match(part):
            chain: list[str] = []
            for comp in parts[i + 1 :]:
                if not _BDF_RE.match(comp):
                    break
                chain.append(comp)
            return (part, tuple(chain)) if chain else None
    return None


def _read_numa(sysfs: _Sysfs) -> tuple[NumaNode, ...]:
    base = sysfs.path("sys/devices/system/node")
    nodes = []
    for name in sysfs.listdir(base):
        m = re.fullmatch(r"node(\d+)", name)
        if m:
            nodes.append(NumaNode(int(m.group(1)), sysfs.read(base / name / "cpulist")))
    return tuple(sorted(nodes, key=lambda n: n.id))


def _numa_of(sysfs: _Sysfs, dev_dir: Path, single_node: int | None) -> int | None:
    v = _int(sysfs.read(dev_dir / "numa_node"))
    if v is None or v < 0:
        return single_node  # -1 = unknown; on a one-node machine it can only be that node
    return v


def _read_pci(sysfs: _Sysfs, single_node: int | None) -> list[PciDevice]:
    base = sysfs.path("sys/bus/pci/devices")
    out = []
    for bdf in sysfs.listdir(base):
        real = sysfs.realpath(base / bdf)
        if real is None:
            continue
        rc = _pci_chain(sysfs, real)
        if rc is None or rc[1][-1] != bdf:
            continue
        drv = sysfs.realpath(real / "driver")
        out.append(
            PciDevice(
                bdf=bdf,
                root_complex=rc[0],
                chain=rc[1],
                sysfs_path=sysfs.rel(real),
                vendor=_int(sysfs.read(real / "vendor"), 16),
                device=_int(sysfs.read(real / "device"), 16),
                class_code=_int(sysfs.read(real / "class"), 16),
                numa_node=_numa_of(sysfs, real, single_node),
                driver=drv.name if drv is not None else None,
            )
        )
    return sorted(out, key=lambda d: _bdf_key(d.bdf))


def _read_gpus(sysfs: _Sysfs, pci: Iterable[PciDevice]) -> tuple[Gpu, ...]:
    """NVIDIA (0x10de) and AMD (0x1002) GPUs, by PCI class or by the GPU driver bound; one
    index order over both (PCI address), as NCCL/RCCL and nvidia-smi/rocm-smi number them."""
    bound = {
        bdf: drv
        for drv in GPU_DRIVERS
        for bdf in sysfs.listdir(sysfs.path(f"sys/bus/pci/drivers/{drv}"))
    }
    gpus = []
    for d in pci:
        cls = None if d.class_code is None else d.class_code >> 8
        by_class = cls is not None and (
            (d.vendor == GPU_VENDOR_NVIDIA and cls in _GPU_CLASSES)
            or (d.vendor == GPU_VENDOR_AMD and cls in _AMD_GPU_CLASSES)
        )
        drv = bound.get(d.bdf)
        by_driver = drv is not None and (
            cls is None or cls >> 8 == 0x03 or (drv == "amdgpu" and cls >> 8 == 0x12)
        )
        if by_class or by_driver:
            gpus.append(d)
    return tuple(Gpu(i, d) for i, d in enumerate(sorted(gpus, key=lambda d: _bdf_key(d.bdf))))


def _read_port(sysfs: _Sysfs, pdir: Path, num: int) -> RdmaPort:
    def after_colon(text: str | None) -> str | None:
        if text is None:
            return None
        return text.split(":", 1)[1].strip() if ":" in text else text

    netdev = None
    ndevs = pdir / "gid_attrs" / "ndevs"
    for idx in sorted(sysfs.listdir(ndevs), key=lambda s: _int(s) or 0):
        name = sysfs.read(ndevs / idx)
        if name:
            netdev = name
            break
    return RdmaPort(
        num=num,
        state=after_colon(sysfs.read(pdir / "state")),
        phys_state=after_colon(sysfs.read(pdir / "phys_state")),
        link_layer=sysfs.read(pdir / "link_layer"),
        rate=sysfs.read(pdir / "rate"),
        netdev=netdev,
    )


def _pci_of(sysfs: _Sysfs, real: Path | None, by_bdf: Mapping[str, PciDevice]) -> PciDevice | None:
    if real is None:
        return None
    rc = _pci_chain(sysfs, real)
    return by_bdf.get(rc[1][-1]) if rc is not None else None


@dataclass(frozen=True)
class _NetdevInfo:
    pci: PciDevice | None
    operstate: str | None
    carrier: bool | None
    speed_mbps: int | None
    mac: str | None
    virtual: bool  # no backing device (lo, veth, bridge, bond, ...)


def _read_nics(
    sysfs: _Sysfs,
    by_bdf: Mapping[str, PciDevice],
    single_node: int | None,
    wanted_virtual: set[str],
) -> tuple[Nic, ...]:
    net = sysfs.path("sys/class/net")
    netdev_info: dict[str, _NetdevInfo] = {}
    for ifname in sysfs.listdir(net):
        real = sysfs.realpath(net / ifname)
        if real is None:
            continue
        speed = _int(sysfs.read(real / "speed"))
        netdev_info[ifname] = _NetdevInfo(
            pci=_pci_of(sysfs, real, by_bdf),
            operstate=sysfs.read(real / "operstate"),
            carrier={"1": True, "0": False}.get(sysfs.read(real / "carrier") or ""),
            speed_mbps=speed if speed is not None and speed > 0 else None,
            mac=sysfs.read(real / "address"),
            virtual=not (real / "device").exists(),
        )

    nics: list[Nic] = []
    claimed: set[str] = set()
    ib = sysfs.path("sys/class/infiniband")
    for dev in sysfs.listdir(ib):
        real = sysfs.realpath(ib / dev)
        if real is None:
            continue
        pci = _pci_of(sysfs, sysfs.realpath(real / "device"), by_bdf) or _pci_of(
            sysfs, real, by_bdf
        )
        ports = []
        for pname in sysfs.listdir(real / "ports"):
            num = _int(pname)
            if num is not None:
                ports.append(_read_port(sysfs, real / "ports" / pname, num))
        ports.sort(key=lambda p: p.num)
        # netdev: the RoCE GID's netdev (a RoCE LAG device names its bond, a virtual netdev),
        # else a netdev of the same PCI function (IPoIB, or RoCE before GIDs are populated)
        same_fn = [n for n, i in sorted(netdev_info.items()) if pci is not None and i.pci == pci]
        netdev = next((p.netdev for p in ports if p.netdev in netdev_info), None)
        if netdev is None and same_fn:
            netdev = same_fn[0]
        # netdevs of the same PCI function belong to this NIC (IPoIB children, LAG members)
        claimed.update(same_fn)
        if netdev:
            claimed.add(netdev)
        nics.append(
            _make_nic(
                dev,
                netdev=netdev,
                rdma=dev,
                ports=tuple(ports),
                pci=pci,
                info=netdev_info.get(netdev) if netdev else None,
                single_node=single_node,
            )
        )

    for ifname, info in sorted(netdev_info.items()):
        if ifname not in claimed and (not info.virtual or ifname in wanted_virtual):
            nics.append(
                _make_nic(
                    ifname,
                    netdev=ifname,
                    rdma=None,
                    ports=(),
                    pci=info.pci,
                    info=info,
                    single_node=single_node,
                )
            )

    def order(n: Nic) -> tuple[tuple[int, ...], str]:
        return (_bdf_key(n.pci.bdf) if n.pci else (1 << 30,), n.name)

    return tuple(sorted(nics, key=order))


def _make_nic(
    name: str,
    *,
    netdev: str | None,
    rdma: str | None,
    ports: tuple[RdmaPort, ...],
    pci: PciDevice | None,
    info: _NetdevInfo | None,
    single_node: int | None,
) -> Nic:
    speed = info.speed_mbps if info is not None else None
    if speed is None:
        speed = next((r for r in (_rate_mbps(p.rate) for p in ports) if r), None)
    return Nic(
        name=name,
        netdev=netdev,
        rdma_device=rdma,
        ports=ports,
        pci=pci,
        numa_node=pci.numa_node if pci is not None else single_node,
        operstate=info.operstate if info is not None else None,
        carrier=info.carrier if info is not None else None,
        speed_mbps=speed,
        mac=info.mac if info is not None else None,
    )


def _rate_mbps(rate: str | None) -> int | None:
    """``"400 Gb/sec (4X NDR)"`` -> 400000."""
    if not rate:
        return None
    m = re.match(r"\s*(\d+(?:\.\d+)?)\s*Gb/sec", rate)
    return int(float(m.group(1)) * 1000) if m else None


def compact_pci_path(pci: PciDevice) -> str:
    """``15:01.0/16:00.0/17:01.0/19:00.0`` (domain shown only when it is not 0000)."""
    return "/".join(b[5:] if b.startswith("0000:") else b for b in pci.chain)


def to_dict(topo: Topology) -> dict[str, object]:
    """A JSON-ready description of ``topo`` (``railhop topology --json``)."""

    def pci(d: PciDevice | None) -> dict[str, object] | None:
        if d is None:
            return None
        return {
            "bdf": d.bdf,
            "root_complex": d.root_complex,
            "chain": list(d.chain),
            "path": d.sysfs_path,
            "numa_node": d.numa_node,
            "vendor": f"0x{d.vendor:04x}" if d.vendor is not None else None,
            "device": f"0x{d.device:04x}" if d.device is not None else None,
            "class": f"0x{d.class_code:06x}" if d.class_code is not None else None,
            "driver": d.driver,
        }

    nics = []
    for n in topo.nics:
        near = topo.nearest_gpu(n)
        up = n.link_up
        nics.append(
            {
                "name": n.name,
                "netdev": n.netdev,
                "rdma_device": n.rdma_device,
                "link_layer": n.link_layer,
                "rail": n.rail,
                "plane": n.plane,
                "numa_node": n.numa_node,
                "speed_mbps": n.speed_mbps,
                "mac": n.mac,
                "link": None if up is None else ("up" if up else "down"),
                "operstate": n.operstate,
                "ports": [
                    {
                        "num": p.num,
                        "state": p.state,
                        "phys_state": p.phys_state,
                        "link_layer": p.link_layer,
                        "rate": p.rate,
                        "netdev": p.netdev,
                    }
                    for p in n.ports
                ],
                "pci": pci(n.pci),
                "nearest_gpu": (
                    {"index": near[0].index, "distance": near[1].name} if near else None
                ),
                "gpu_distance": (
                    [pci_distance(g.pci, n.pci).name for g in topo.gpus] if n.pci else None
                ),
            }
        )
    return {
        "root": topo.root,
        "numa_nodes": [{"id": x.id, "cpulist": x.cpulist} for x in topo.numa_nodes],
        "gpus": [{"index": g.index, "vendor": g.vendor, "pci": pci(g.pci)} for g in topo.gpus],
        "nics": nics,
    }
