"""A Soft-RoCE lab: guest nodes under QEMU, one point-to-point link per rail, rxe on every NIC.

Layout (2 nodes x 4 NICs by default)::

    guest n0 (vng/QEMU)                                    guest n1 (vng/QEMU)
    nic0 10.77.0.1 rxe0 ── -netdev socket 127.0.0.1:P0 ── nic0 10.77.0.2 rxe0
    nic1 10.77.1.1 rxe1 ── -netdev socket 127.0.0.1:P1 ── nic1 10.77.1.2 rxe1
    ...

Why guests: the kernel this runs on has no RDMA, and rxe (Soft-RoCE) in Debian's 6.1 kernel has
no network-namespace support, so each node is its own guest running Debian's kernel (found under
``/boot``, never hard-coded) through virtme-ng (``vng``), which shares the host's root file
system read-only with writable overlays. KVM is used when a short probe boot shows it works,
else QEMU's emulation (TCG); one vCPU per guest.

Every rail is one QEMU ``-netdev socket`` link on 127.0.0.1 (node 0 listens, node 1 connects), a
virtio-net NIC with a fixed MAC at each end; no tap, no bridge, no route out of a guest. Inside a
guest the NICs are renamed ``nic<i>`` and addressed as on the netns fabric (:mod:`fabric`): rail
subnet 10.77.<i>.0/24, node n owns .n+1, a routing table per NIC chosen by a source rule,
``arp_ignore``/``arp_announce`` per NIC. A point-to-point link only reaches its own rail, so the
per-NIC table holds the rail's /24 only (another rail is unreachable at once, not after an ARP
timeout).

Commands and results cross through a directory shared with every guest (``vmguest.py`` runs the
command files). Faults: carrier loss at either end of a rail (QMP ``set_link`` on a guest's
virtio NIC, never on the socket backend (see :meth:`VmLab.set_link`): that guest sees NO-CARRIER,
its rxe port goes DOWN; the other end sees silence), a silent
blackhole inside a guest (tc ``clsact`` with a ``matchall`` drop both ways on that NIC, carrier
up), flap (a bounded host thread toggling ``set_link``), heal. Every wait is bounded; the guests
are torn down on ``__exit__``, at interpreter exit and on SIGTERM/SIGHUP (their process groups are
killed if they do not power off in time).
"""

from __future__ import annotations

import atexit
import contextlib
import itertools
import json
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import FrameType, TracebackType
from typing import Any, Literal

from railhop_lab import vmguest
from railhop_lab.fabric import NicPlan, node_sysctls, plan_fabric

End = Literal["local", "remote"]

BOOT_DIR = Path("/boot")
MODULES_DIR = Path("/lib/modules")
MAC_PREFIX = "52:54:00:7a"
BOOT_TIMEOUT_S = 300.0  # emulated boots take ~30 s alone; 2 cores shared with other work
CMD_GRACE_S = 30.0  # on top of a job's own timeout: the runner polls, 9p is slow
STOP_TIMEOUT_S = 30.0
KVM_PROBE_TIMEOUT_S = 60.0
RXE_TIMEOUT_S = 60.0
KEEP_ENV = "RAILHOP_VMLAB_KEEP"  # a directory: close() copies the lab's files there first


class VmLabError(Exception):
    """Base error of the VM lab."""


# ---------------------------------------------------------------------------------------------
# Pure: the guest kernel, the plan, the command lines and scripts.


def _version_key(name: str) -> list[int | str]:
    """Natural order: digit runs compare as numbers (``6.1.0-57`` after ``6.1.0-9``)."""
    return [int(x) if x.isdigit() else x for x in re.split(r"(\d+)", name)]


def find_guest_kernel(boot: Path = BOOT_DIR, modules: Path = MODULES_DIR) -> Path:
    """The newest Debian kernel under ``boot`` that builds rxe and has its modules installed."""
    found: list[str] = []
    why: list[str] = []
    for img in boot.glob("vmlinuz-*"):
        release = img.name.removeprefix("vmlinuz-")
        config = boot / f"config-{release}"
        try:
            rxe = any(
                line.strip() in ("CONFIG_RDMA_RXE=m", "CONFIG_RDMA_RXE=y")
                for line in config.read_text().splitlines()
            )
        except OSError:
            why.append(f"{img.name}: no {config.name}")
            continue
        if not rxe:
            why.append(f"{img.name}: no CONFIG_RDMA_RXE")
        elif not (modules / release).is_dir():
            why.append(f"{img.name}: no {modules / release}")
        else:
            found.append(img.name)
    if not found:
        detail = "; ".join(why) or f"no vmlinuz-* in {boot}"
        raise VmLabError(f"no guest kernel with rxe ({detail}): install linux-image-amd64")
    return boot / max(found, key=_version_key)


@dataclass(frozen=True)
class RailLink:
    rail: int
    port: int  # node 0 listens on 127.0.0.1:port, node 1 connects
    netdev: str  # QEMU netdev id on both nodes (the socket backend)
    nicdev: str  # QEMU device id of the virtio NIC on both nodes (set_link target)


@dataclass(frozen=True)
class VmPlan:
    nodes: int
    nics: int
    links: tuple[RailLink, ...]
    nic_plans: tuple[NicPlan, ...]

    def nic(self, node: int, nic: int) -> NicPlan:
        if not (0 <= node < self.nodes and 0 <= nic < self.nics):
            raise VmLabError(f"no NIC {nic} on node {node} (lab has {self.nodes}x{self.nics})")
        return self.nic_plans[node * self.nics + nic]

    def peer(self, node: int) -> int:
        return 1 - node


def mac_address(node: int, nic: int) -> str:
    return f"{MAC_PREFIX}:{node:02x}:{nic:02x}"


def plan_lab(nodes: int, nics: int, ports: Sequence[int]) -> VmPlan:
    """Names, ports and addresses of a lab; validates the shape (pure)."""
    if nodes != 2:
        raise VmLabError(f"nodes={nodes}: point-to-point rails join exactly 2 nodes")
    if not 1 <= nics <= 8:
        raise VmLabError(f"nics={nics}: want 1..8")
    if len(ports) != nics or any(not 1024 <= p <= 65535 for p in ports):
        raise VmLabError(f"ports={list(ports)}: want {nics} ports in 1024..65535")
    fp = plan_fabric(nodes, nics, "vm")
    links = tuple(
        RailLink(rail=i, port=ports[i], netdev=f"rail{i}", nicdev=f"railnic{i}")
        for i in range(nics)
    )
    return VmPlan(nodes=nodes, nics=nics, links=links, nic_plans=fp.nic_plans)


def qemu_opts(plan: VmPlan, node: int, qmp_path: Path) -> list[str]:
    """The QEMU arguments a node adds to virtme-ng's: its rail NICs and its QMP socket."""
    opts: list[str] = []
    for link in plan.links:
        end = "listen" if node == 0 else "connect"
        opts += ["-netdev", f"socket,id={link.netdev},{end}=127.0.0.1:{link.port}"]
        mac = mac_address(node, link.rail)
        opts += ["-device", f"virtio-net-pci,netdev={link.netdev},id={link.nicdev},mac={mac}"]
    opts += ["-qmp", f"unix:{qmp_path},server=on,wait=off"]
    return opts


def vng_argv(
    vng: str,
    kernel: Path,
    *,
    kvm: bool,
    shared: Path,
    runner_dir: Path,
    extra_qemu: Sequence[str],
    memory: str = "1G",
    name: str = "railhop-vm",
) -> list[str]:
    argv = [vng, "--run", str(kernel), "--cpus", "1", "--memory", memory, "--name", name]
    if not kvm:
        argv.append("--disable-kvm")
    argv += ["--rwdir", str(shared), "--cwd", "/"]
    argv.append(f"--qemu-opts={shlex.join(extra_qemu)}")
    runner = Path(vmguest.__file__).resolve()
    argv += ["--exec", shlex.join(["/usr/bin/python3", str(runner), str(runner_dir)])]
    return argv


def guest_setup_script(plan: VmPlan, node: int) -> str:
    """The shell script that makes a booted guest a lab node (pure; run by ``sh -e``)."""
    lines = ["set -e", "modprobe rdma_rxe", "modprobe ib_uverbs", "modprobe rdma_ucm"]
    lines.append("modprobe cls_matchall; modprobe act_gact")
    lines.append("for s in all default; do sysctl -qw net.ipv6.conf.$s.disable_ipv6=1; done")
    for i in range(plan.nics):
        np_ = plan.nic(node, i)
        mac = mac_address(node, i)
        lines.append(
            f"dev=$(grep -l -i '^{mac}$' /sys/class/net/*/address | head -n 1 | cut -d/ -f5); "
            f'[ -n "$dev" ] || {{ echo "no NIC with MAC {mac}" >&2; exit 1; }}; '
            f'[ "$dev" = {np_.ifname} ] || ip link set "$dev" name {np_.ifname}'
        )
    for path, value in node_sysctls([plan.nic(node, i).ifname for i in range(plan.nics)]):
        lines.append(f"sysctl -qw {path.replace('/', '.')}={value}")
    for i in range(plan.nics):
        np_ = plan.nic(node, i)
        net = ".".join(np_.address.split(".")[:3]) + ".0"
        lines += [
            f"ip addr add {np_.address}/{np_.prefixlen} dev {np_.ifname}",
            f"ip link set {np_.ifname} up",
            f"ip route add {net}/{np_.prefixlen} dev {np_.ifname} src {np_.address}"
            f" table {np_.table}",
            f"ip rule add from {np_.address}/32 table {np_.table} priority {np_.rule_priority}",
            f"rdma link add {rxe_name(i)} type rxe netdev {np_.ifname}",
        ]
    return "\n".join(lines) + "\n"


def rxe_name(nic: int) -> str:
    return f"rxe{nic}"


def blackhole_script(ifname: str) -> str:
    return (
        f"tc qdisc add dev {ifname} clsact && "
        f"tc filter add dev {ifname} ingress matchall action drop && "
        f"tc filter add dev {ifname} egress matchall action drop"
    )


def unblackhole_script(ifname: str) -> str:
    return f"tc qdisc del dev {ifname} clsact 2>/dev/null || true"


RAIL_PROBE_PORT = 9  # nothing listens there in a guest: a refused connect proves a round trip
RAIL_PROBE_TIMEOUT_S = 4.0  # an ARP that gets no answer fails a connect in about 3 s


def rail_probe_program(pairs: Sequence[tuple[int, str, str]], timeout: float) -> str:
    """A python3 program (standard library only) that tests each rail end to end: per
    ``(nic, source, destination)`` one TCP connect from the source address to the destination's
    closed port :data:`RAIL_PROBE_PORT`, all at once. A refusal (or an accept) means frames passed
    both ways (ARP, SYN, RST); it prints ``<nic> ok`` or ``<nic> <errno name>`` (``EHOSTUNREACH``:
    ARP got no answer; ``timeout``: no answer to the SYN) per rail. Pure."""
    return (
        "import errno, socket, threading\n"
        f"pairs = {list(pairs)!r}\n"
        "out = {}\n"
        "def probe(nic, src, dst):\n"
        "    s = socket.socket()\n"
        f"    s.settimeout({timeout!r})\n"
        "    try:\n"
        "        s.bind((src, 0))\n"
        f"        s.connect((dst, {RAIL_PROBE_PORT}))\n"
        "        out[nic] = 'ok'\n"
        "    except ConnectionRefusedError:\n"
        "        out[nic] = 'ok'\n"
        "    except socket.timeout:\n"
        "        out[nic] = 'timeout'\n"
        "    except OSError as e:\n"
        "        out[nic] = errno.errorcode.get(e.errno, str(e.errno))\n"
        "    finally:\n"
        "        s.close()\n"
        "ts = [threading.Thread(target=probe, args=p) for p in pairs]\n"
        "[t.start() for t in ts]\n"
        "[t.join() for t in ts]\n"
        "for nic, _, _ in pairs:\n"
        "    print(nic, out.get(nic, 'no-result'))\n"
    )


def rail_diagnostics_script(ifname: str, rxe: str) -> str:
    """What a guest can tell about one rail's NIC ``ifname`` and its rxe device ``rxe`` (shell;
    every command may fail): link counters, neighbours, qdiscs, the TX queues' in-flight bytes and
    timeouts, the rxe port, the kernel's last lines."""
    return (
        "; ".join(
            [
                f"ip -s -d link show {ifname}",
                f"ip neigh show dev {ifname}",
                f"tc -s qdisc show dev {ifname}",
                f"for f in /sys/class/net/{ifname}/queues/tx-*/tx_timeout "
                f"/sys/class/net/{ifname}/queues/tx-*/byte_queue_limits/inflight; "
                'do echo "$f $(cat $f)"; done',
                f"echo rxe port $(cat /sys/class/infiniband/{rxe}/ports/1/state)",
                "dmesg | tail -n 25",
            ]
        )
        + "; true"
    )


def port_states_script(nics: int) -> str:
    """Prints ``<nic> <state> <carrier>`` per NIC (rxe port state as sysfs words)."""
    return "; ".join(
        f"echo {i} $(cut -d' ' -f2 /sys/class/infiniband/{rxe_name(i)}/ports/1/state) "
        f"$(cat /sys/class/net/nic{i}/carrier 2>/dev/null || echo 0)"
        for i in range(nics)
    )


# ---------------------------------------------------------------------------------------------
# Host side: QMP, the shared directory, the guests.


class Qmp:
    """A minimal QMP client (one command at a time, bounded)."""

    def __init__(self, path: Path, timeout: float = 10.0) -> None:
        self.path = path
        self.timeout = timeout
        self.sock: socket.socket | None = None
        self.buf = b""
        self.lock = threading.Lock()

    def _line(self, deadline: float) -> dict[str, Any]:
        assert self.sock is not None
        while b"\n" not in self.buf:
            left = deadline - time.monotonic()
            if left <= 0:
                raise VmLabError(f"QMP {self.path}: no reply within {self.timeout} s")
            self.sock.settimeout(left)
            chunk = self.sock.recv(65536)
            if not chunk:
                raise VmLabError(f"QMP {self.path}: closed by QEMU")
            self.buf += chunk
        line, _, self.buf = self.buf.partition(b"\n")
        obj: dict[str, Any] = json.loads(line)
        return obj

    def connect(self) -> None:
        deadline = time.monotonic() + self.timeout
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(self.timeout)
        s.connect(str(self.path))
        self.sock = s
        self._line(deadline)  # greeting
        self.execute("qmp_capabilities")

    def execute(self, cmd: str, **args: Any) -> Any:
        with self.lock:
            if self.sock is None:
                raise VmLabError(f"QMP {self.path}: not connected")
            deadline = time.monotonic() + self.timeout
            msg: dict[str, Any] = {"execute": cmd}
            if args:
                msg["arguments"] = args
            self.sock.sendall(json.dumps(msg).encode() + b"\n")
            while True:
                reply = self._line(deadline)
                if "event" in reply:
                    continue
                if "error" in reply:
                    raise VmLabError(f"QMP {cmd} {args}: {reply['error']}")
                return reply.get("return")

    def close(self) -> None:
        if self.sock is not None:
            with contextlib.suppress(OSError):
                self.sock.close()
            self.sock = None


@dataclass(frozen=True)
class CmdResult:
    rc: int | None
    stdout: str
    stderr: str
    timed_out: bool
    error: str | None
    elapsed_s: float

    @property
    def ok(self) -> bool:
        return self.rc == 0 and not self.timed_out and self.error is None


class GuestJob:
    """A command running in a guest; ``wait()`` returns its :class:`CmdResult`."""

    def __init__(self, guest: Guest, job_id: str, timeout: float, what: str) -> None:
        self.guest = guest
        self.job_id = job_id
        self.timeout = timeout
        self.what = what
        self.started = time.monotonic()

    def done(self) -> bool:
        return (self.guest.runner_dir / "res" / f"{self.job_id}.json").exists()

    def wait(self, timeout: float | None = None) -> CmdResult:
        limit = timeout if timeout is not None else self.timeout + CMD_GRACE_S
        path = self.guest.runner_dir / "res" / f"{self.job_id}.json"
        deadline = self.started + limit
        while not path.exists():
            if not self.guest.alive():
                raise VmLabError(f"node {self.guest.node}: guest gone while {self.what}")
            if time.monotonic() > deadline:
                self.kill()
                raise VmLabError(f"node {self.guest.node}: {self.what}: no result in {limit} s")
            time.sleep(0.05)
        r = json.loads(path.read_text())
        return CmdResult(
            rc=r.get("rc"),
            stdout=r.get("stdout", ""),
            stderr=r.get("stderr", ""),
            timed_out=bool(r.get("timed_out")),
            error=r.get("error"),
            elapsed_s=float(r.get("elapsed_s", 0.0)),
        )

    def kill(self) -> None:
        with contextlib.suppress(VmLabError, OSError):
            self.guest.submit({"kill": self.job_id})


class Guest:
    """One node: its vng process, runner directory and QMP socket."""

    _ids = itertools.count()

    def __init__(self, node: int, workdir: Path, shared: Path) -> None:
        self.node = node
        self.workdir = workdir
        self.runner_dir = shared / f"node{node}"
        self.qmp_path = workdir / f"qmp{node}.sock"
        self.log_path = workdir / f"node{node}.console"
        self.proc: subprocess.Popen[bytes] | None = None
        self.qmp = Qmp(self.qmp_path)

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def console_tail(self, limit: int = 4000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-limit:]
        except OSError:
            return ""

    def submit(self, job: Mapping[str, Any]) -> str:
        job_id = f"{os.getpid()}-{next(self._ids):06d}"
        vmguest.write_atomic(self.runner_dir / "cmd" / f"{job_id}.json", dict(job))
        return job_id

    def start(
        self,
        argv: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        timeout: float = 120.0,
        stdout: Path | None = None,
        stderr: Path | None = None,
        cwd: str | None = None,
    ) -> GuestJob:
        job = {
            "argv": list(argv),
            "env": dict(env or {}),
            "timeout": timeout,
            "stdout": str(stdout) if stdout else None,
            "stderr": str(stderr) if stderr else None,
            "cwd": cwd,
        }
        return GuestJob(self, self.submit(job), timeout, shlex.join(argv)[:200])

    def run(
        self, argv: Sequence[str], *, env: Mapping[str, str] | None = None, timeout: float = 120.0
    ) -> CmdResult:
        return self.start(argv, env=env, timeout=timeout).wait()

    def sh(self, script: str, *, timeout: float = 120.0, check: bool = True) -> CmdResult:
        r = self.run(["/bin/sh", "-ec", script], timeout=timeout)
        if check and not r.ok:
            raise VmLabError(
                f"node {self.node}: {script[:300]!r} failed: rc={r.rc} timed_out={r.timed_out} "
                f"error={r.error} stderr={r.stderr[-2000:]!r} stdout={r.stdout[-1000:]!r}"
            )
        return r


def _free_ports(n: int) -> list[int]:
    socks = []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def _listening(ports: Sequence[int]) -> bool:
    """Whether every port has a TCP listener on 127.0.0.1 (read from /proc, never connected to:
    QEMU's socket netdev accepts one peer only)."""
    want = {f"0100007F:{p:04X}" for p in ports}
    try:
        rows = Path("/proc/net/tcp").read_text().splitlines()[1:]
    except OSError:
        return False
    seen = {r.split()[1] for r in rows if len(r.split()) > 3 and r.split()[3] == "0A"}
    return want <= seen


_kvm_cache: dict[str, bool] = {}


def find_vng() -> str:
    here = Path(sys.executable).parent / "vng"
    if here.is_file():
        return str(here)
    found = shutil.which("vng")
    if found is None:
        raise VmLabError("vng (virtme-ng) not found: run `make setup` (it installs ./lab[vm])")
    return found


def probe_kvm(kernel: Path, vng: str) -> bool:
    """Whether a guest boots under KVM here (one short boot; the answer is cached)."""
    key = str(kernel)
    if key in _kvm_cache:
        return _kvm_cache[key]
    ok = False
    if os.access("/dev/kvm", os.R_OK | os.W_OK):
        argv = [vng, "--run", str(kernel), "--cpus", "1", "--memory", "512M", "--exec", "true"]
        with contextlib.suppress(OSError):
            ok = run_group(argv, KVM_PROBE_TIMEOUT_S, env=_vng_env()) == 0
    _kvm_cache[key] = ok
    return ok


def run_group(
    argv: Sequence[str], timeout: float, env: Mapping[str, str] | None = None
) -> int | None:
    """Run ``argv`` in a session of its own, output discarded; its exit status, or None when it
    ran past ``timeout``: then the whole process group is killed (vng's QEMU guest with it, which
    ``subprocess.run(timeout=...)`` would leave running: it kills the leader only)."""
    proc = subprocess.Popen(
        list(argv),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
        env=dict(env) if env is not None else None,
    )
    try:
        return proc.wait(timeout)
    except subprocess.TimeoutExpired:
        return None
    finally:
        # also on a normal exit: whatever the leader left in its group
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def _vng_env() -> dict[str, str]:
    env = dict(os.environ)
    # vng runs its helpers (virtme-run) from PATH: put the venv's bin first
    env["PATH"] = f"{Path(sys.executable).parent}:{env.get('PATH', '/usr/bin:/bin')}"
    return env


_live: set[VmLab] = set()


def _cleanup_all() -> None:
    for lab in list(_live):
        lab.close()


atexit.register(_cleanup_all)


class VmLab:
    """Two guest nodes joined by one point-to-point link per rail; a context manager."""

    def __init__(
        self,
        nics: int = 4,
        *,
        nodes: int = 2,
        kernel: Path | None = None,
        memory: str = "1G",
        kvm: bool | None = None,
        boot_timeout: float = BOOT_TIMEOUT_S,
    ) -> None:
        self.kernel = kernel if kernel is not None else find_guest_kernel()
        self.vng = find_vng()
        self.plan = plan_lab(nodes, nics, _free_ports(nics))
        self.memory = memory
        self.kvm_requested = kvm
        self.kvm = False
        self.boot_timeout = boot_timeout
        self._tmp = tempfile.TemporaryDirectory(prefix="railhop-vm-")
        self.workdir = Path(self._tmp.name)
        # the directory every guest mounts read-write (runner dirs, harness files)
        self.shared = self.workdir / "shared"
        self.guests = [Guest(n, self.workdir, self.shared) for n in range(nodes)]
        self._flappers: dict[tuple[int, int], tuple[threading.Thread, threading.Event]] = {}
        self._faulted: set[int] = set()  # rails with a fault injected since their last heal
        self._closed = False
        self._old_handlers: dict[int, Any] = {}

    @property
    def nics(self) -> int:
        return self.plan.nics

    def address(self, node: int, nic: int) -> str:
        return self.plan.nic(node, nic).address

    def ifname(self, nic: int) -> str:
        return self.plan.nic(0, nic).ifname

    # -- lifecycle ----------------------------------------------------------------------------
    def __enter__(self) -> VmLab:
        try:
            self.up()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        self.close()
        old = self._old_handlers.get(signum)
        if callable(old):
            old(signum, frame)
        raise SystemExit(128 + signum)

    def up(self) -> None:
        _live.add(self)
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGTERM, signal.SIGHUP):
                self._old_handlers[sig] = signal.signal(sig, self._on_signal)
        if self.kvm_requested is None:
            self.kvm = probe_kvm(self.kernel, self.vng)
        else:
            self.kvm = self.kvm_requested
        for g in self.guests:
            (g.runner_dir / "cmd").mkdir(parents=True)
            (g.runner_dir / "res").mkdir(parents=True)
        deadline = time.monotonic() + self.boot_timeout
        for g in self.guests:
            self._boot(g)
            if g.node == 0:  # node 1 connects to node 0's listening rail sockets
                self._wait(
                    lambda: _listening([lk.port for lk in self.plan.links]),
                    deadline,
                    "node 0's rail sockets to listen",
                )
        for g in self.guests:
            ready = g.runner_dir / "ready"
            self._wait(ready.exists, deadline, f"node {g.node}'s runner")
            g.qmp.connect()
        jobs = [
            g.start(["/bin/sh", "-ec", guest_setup_script(self.plan, g.node)], timeout=120)
            for g in self.guests
        ]
        for g, job in zip(self.guests, jobs, strict=True):
            r = job.wait()
            if not r.ok:
                raise VmLabError(f"node {g.node}: setup failed rc={r.rc}: {r.stderr[-2000:]}")
        for n in range(self.plan.nodes):
            self.wait_ports(n, {i: "ACTIVE" for i in range(self.nics)}, RXE_TIMEOUT_S)
        self.check_rails()

    def _boot(self, g: Guest) -> None:
        argv = vng_argv(
            self.vng,
            self.kernel,
            kvm=self.kvm,
            shared=self.shared,
            runner_dir=g.runner_dir,
            extra_qemu=qemu_opts(self.plan, g.node, g.qmp_path),
            memory=self.memory,
            name=f"railhop-n{g.node}",
        )
        with g.log_path.open("wb") as log:
            g.proc = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                env=_vng_env(),
                cwd=self.workdir,
            )

    def _wait(self, cond: Callable[[], bool], deadline: float, what: str) -> None:
        while not cond():
            for g in self.guests:
                if g.proc is not None and g.proc.poll() is not None:
                    raise VmLabError(
                        f"node {g.node} exited (rc={g.proc.returncode}) waiting for {what}: "
                        f"{g.console_tail()}"
                    )
            if time.monotonic() > deadline:
                raise VmLabError(f"waiting for {what}: not within {self.boot_timeout} s")
            time.sleep(0.1)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for key in list(self._flappers):
            self._stop_flap(*key)
        for g in self.guests:
            with contextlib.suppress(OSError):
                if g.runner_dir.is_dir():
                    vmguest.write_atomic(g.runner_dir / "stop", {})
            g.qmp.close()
        deadline = time.monotonic() + STOP_TIMEOUT_S
        for g in self.guests:
            if g.proc is None:
                continue
            if (g.runner_dir / "ready").exists():  # a runner to stop; else nothing will
                with contextlib.suppress(subprocess.TimeoutExpired):
                    g.proc.wait(max(0.1, deadline - time.monotonic()))
            if g.proc.poll() is None:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(g.proc.pid, signal.SIGKILL)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    g.proc.wait(10.0)
            # whatever vng left in the group (QEMU itself when vng exec'd through a shell)
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(g.proc.pid, signal.SIGKILL)
        for sig, old in self._old_handlers.items():
            with contextlib.suppress(ValueError, TypeError):
                signal.signal(sig, old)
        _live.discard(self)
        keep = os.environ.get(KEEP_ENV)
        if keep:  # the consoles, runner results and harness logs, for a post-mortem
            with contextlib.suppress(OSError):
                dest = Path(keep) / self.workdir.name
                shutil.copytree(self.workdir, dest, ignore=shutil.ignore_patterns("*.sock"))
                print(f"vmlab: kept {dest}", file=sys.stderr)
        self._tmp.cleanup()

    # -- state --------------------------------------------------------------------------------
    def port_states(self, node: int) -> dict[int, tuple[str, bool]]:
        """Per NIC of ``node``: (rxe port state word, carrier)."""
        out = self.guests[node].sh(port_states_script(self.nics), timeout=30).stdout
        states: dict[int, tuple[str, bool]] = {}
        for line in out.splitlines():
            parts = line.split()
            if len(parts) == 3:
                states[int(parts[0])] = (parts[1], parts[2] == "1")
        return states

    def wait_ports(self, node: int, want: Mapping[int, str], timeout: float) -> None:
        """Wait until each listed NIC's rxe port on ``node`` is in the wanted state (bounded)."""
        deadline = time.monotonic() + timeout
        while True:
            states = self.port_states(node)
            if all(states.get(i, ("?", False))[0] == s for i, s in want.items()):
                return
            if time.monotonic() > deadline:
                raise VmLabError(f"node {node}: rxe ports {states}, want {dict(want)}")
            time.sleep(0.2)

    def rail_verdicts(self, timeout: float = RAIL_PROBE_TIMEOUT_S) -> dict[int, str]:
        """Per rail: ``ok`` when a TCP connect from node 0's end to node 1's end got an answer
        (frames pass both ways), else why not (see :func:`rail_probe_program`); bounded."""
        pairs = [(i, self.address(0, i), self.address(1, i)) for i in range(self.nics)]
        prog = rail_probe_program(pairs, timeout)
        r = self.guests[0].run(["/usr/bin/python3", "-c", prog], timeout=timeout + 30)
        verdicts = {i: "no-result" for i in range(self.nics)}
        for line in r.stdout.splitlines():
            nic, _, verdict = line.partition(" ")
            if nic.isdigit() and int(nic) in verdicts:
                verdicts[int(nic)] = verdict
        return verdicts

    def rail_diagnostics(self, nic: int) -> str:
        """Both guests' view of rail ``nic`` and QEMU's (``info network``), for an error."""
        parts = []
        for g in self.guests:
            qemu_said = [
                line
                for line in g.console_tail(1 << 20).splitlines()
                if line.startswith("qemu-system") or "serious error" in line
            ]
            parts.append(f"--- node {g.node}, QEMU's own messages: {qemu_said[-10:]}")
            if g.proc is None or g.proc.poll() is not None:
                rc = None if g.proc is None else g.proc.returncode
                parts.append(f"--- node {g.node}: QEMU exited (rc={rc})")
                continue
            try:
                script = rail_diagnostics_script(self.plan.nic(g.node, nic).ifname, rxe_name(nic))
                r = g.sh(script, timeout=30, check=False)
                parts.append(f"--- node {g.node}, nic{nic}:\n{r.stdout}{r.stderr}")
            except VmLabError as e:
                parts.append(f"--- node {g.node}, nic{nic}: {e}")
            try:
                info = g.qmp.execute("human-monitor-command", **{"command-line": "info network"})
            except (VmLabError, OSError) as e:
                info = f"(QMP: {e})"
            parts.append(f"--- node {g.node}, QEMU info network:\n{info}")
        return "\n".join(parts)

    def check_rails(self) -> None:
        """Every rail passes frames end to end (rxe ports ACTIVE and carrier up do not prove it);
        a rail that does not is named with both guests' and QEMU's view of it (VmLabError)."""
        dead = {i: v for i, v in self.rail_verdicts().items() if v != "ok"}
        if dead:
            diags = "\n".join(self.rail_diagnostics(i) for i in sorted(dead))
            raise VmLabError(f"rails that pass no frames (node 0 -> node 1): {dead}\n{diags}")

    # -- faults -------------------------------------------------------------------------------
    def set_link(self, node: int, nic: int, up: bool) -> None:
        """QMP ``set_link`` on ``node``'s virtio NIC of rail ``nic`` (that guest's carrier).

        The NIC, never the socket backend: ``set_link`` on a ``-netdev socket`` backend marks the
        backend down too, and QEMU (7.2 and later) then drops a frame it had half written to the
        rail's stream without forgetting how much of it was written. The next frame goes out at
        that offset: the other QEMU reads a bogus length and closes the stream for good ("serious
        error: oversized packet received"), or this QEMU aborts in ``iov_copy``. The rail is then
        dead with carrier up at both ends. On the NIC alone, the guest sees the same carrier loss,
        frames both ways are dropped at the NIC, and the backend's stream stays whole
        (``test_rdma_lab.py::test_carrier_loss_mid_frame_leaves_the_rail_whole``)."""
        self.plan.nic(node, nic)
        if not up:
            self._faulted.add(nic)
        self.guests[node].qmp.execute("set_link", name=self.plan.links[nic].nicdev, up=up)

    def carrier_down(self, node: int, nic: int, end: End = "local") -> None:
        """Carrier loss on ``node``'s NIC (``local``) or at the other end of its rail (``remote``:
        the peer's NIC loses carrier, ``node`` sees silence)."""
        if end not in ("local", "remote"):
            raise VmLabError(f"end={end!r}: want 'local' or 'remote'")
        self.set_link(node if end == "local" else self.plan.peer(node), nic, False)

    def blackhole(self, node: int, nic: int) -> None:
        """Drop everything on ``node``'s NIC both ways, carrier up on both ends."""
        self._faulted.add(nic)
        self.guests[node].sh(blackhole_script(self.plan.nic(node, nic).ifname), timeout=60)

    def flap(self, node: int, nic: int, hz: float, duration: float) -> None:
        """Toggle ``node``'s carrier on that rail at ``hz`` for ``duration`` s (bounded thread)."""
        if not (0 < hz <= 50 and 0 < duration <= 600):
            raise VmLabError(f"flap hz={hz} duration={duration}: want 0<hz<=50, 0<duration<=600")
        self._stop_flap(node, nic)
        self._faulted.add(nic)
        stop = threading.Event()

        def body() -> None:
            up = False
            end = time.monotonic() + duration
            while not stop.is_set() and time.monotonic() < end:
                with contextlib.suppress(VmLabError, OSError):
                    self.set_link(node, nic, up)
                up = not up
                stop.wait(0.5 / hz)
            with contextlib.suppress(VmLabError, OSError):
                self.set_link(node, nic, True)

        t = threading.Thread(target=body, name=f"vm-flap-{node}-{nic}", daemon=True)
        self._flappers[(node, nic)] = (t, stop)
        t.start()

    def _stop_flap(self, node: int, nic: int) -> None:
        entry = self._flappers.pop((node, nic), None)
        if entry is not None:
            entry[1].set()
            entry[0].join(10.0)

    def heal(self, nic: int, timeout: float = RXE_TIMEOUT_S) -> None:
        """Undo every fault on rail ``nic`` (both ends) and wait for both rxe ports ACTIVE."""
        for n in range(self.plan.nodes):
            self._stop_flap(n, nic)
            self.set_link(n, nic, True)
            self.guests[n].sh(unblackhole_script(self.plan.nic(n, nic).ifname), timeout=60)
        for n in range(self.plan.nodes):
            self.wait_ports(n, {nic: "ACTIVE"}, timeout)
        self._faulted.discard(nic)

    def heal_all(self) -> None:
        """Heal every rail a fault was injected on since its last heal."""
        for i in sorted(self._faulted):
            self.heal(i)
