"""eBPF sources (bcc): load a ``bpf/<probe>.bpf.c`` with the hook variants that work on this
kernel, and turn its ring-buffer records into events.

Start-up of one source: privilege -> bcc importable -> kernel headers -> tracefs (mounted when
missing) -> BTF -> :func:`railhop.sources.hooks.plan` -> trial child (compile/load/attach each
variant, fentry first; a crash costs only the child) -> load the winners in this process.

Delivery: when the source is bound to an asyncio loop (``bind_loop``; ``start`` binds the running
loop), the ring buffer's map fd is watched with ``loop.add_reader`` and drained with
``ring_buffer_consume()`` on the loop itself, so a record is decoded and emitted in the same
``epoll_wait`` round that sees it, in kernel order relative to the loop's other fds (netlink):
no thread, no GIL hand-over. Without a loop, a thread polls the ring buffer instead.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import json
import os
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from railhop import paths
from railhop.sources import btf as btfmod
from railhop.sources import hooks as H
from railhop.sources import kernel
from railhop.sources.base import Capability, Emit, Reason, SourceError
from railhop.sources.bpfstats import ProgStats, prog_stats
from railhop.sources.compose import ComposeError, compose
from railhop.sources.decode import DecodeError, decode
from railhop.sources.events import CarrierDown, Event

TRIAL_TIMEOUT_S = 120.0
POLL_MS = 50


class EbpfError(SourceError):
    """Loading or running a BPF program failed."""


@dataclass(frozen=True, slots=True)
class Precheck:
    """Result of the checks every eBPF source shares (cached per process)."""

    reason: Reason
    detail: str
    env: H.KernelEnv | None


_PRECHECK: dict[str, Precheck] = {}
_PRECHECK_LOCK = threading.Lock()


def precheck(root: str = "/", refresh: bool = False) -> Precheck:
    """Privilege, bcc, headers, tracefs and BTF, checked once per process and root."""
    with _PRECHECK_LOCK:
        if refresh or root not in _PRECHECK:
            _PRECHECK[root] = _precheck(root)
        return _PRECHECK[root]


def _precheck(root: str) -> Precheck:
    if not kernel.bpf_privileged(kernel.cap_eff(root)):
        return Precheck(Reason.NO_PRIVILEGE, "needs CAP_SYS_ADMIN or CAP_BPF+CAP_PERFMON", None)
    try:
        import bcc  # noqa: F401
    except ImportError as e:
        return Precheck(Reason.NO_BCC, f"import bcc: {e} (Debian: python3-bpfcc)", None)
    if kernel.kernel_headers(root=root) is None:
        rel = os.uname().release
        return Precheck(
            Reason.NO_HEADERS, f"no kernel headers for {rel} (see scripts/setup.sh)", None
        )
    tracefs, note = kernel.ensure_tracefs(root)
    try:
        b: btfmod.Btf | None = btfmod.load(root)
        berr = ""
    except btfmod.BTFError as e:
        b, berr = None, str(e)

    def fields(cat: str, ev: str) -> list[str]:
        return kernel.tracepoint_fields(tracefs, cat, ev)

    return Precheck(Reason.NONE, note, H.KernelEnv(b, berr, tracefs, note, fields))


def run_trials(
    src: str,
    base: list[str],
    p: H.Plan,
    usdt: dict[str, Any] | None = None,
    timeout_s: float = TRIAL_TIMEOUT_S,
    text: str | None = None,
) -> H.TrialOutcome:
    """Try the plan's candidates in child processes; a child that dies on a candidate marks it
    failed and a fresh child goes on with the rest. ``text``: the composed program (else the
    file ``src`` is compiled as it is)."""
    out = H.TrialOutcome()
    deadline = time.monotonic() + timeout_s
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [str(paths.PKG_DIR.parent)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else [])
    )
    while True:
        todo, winners = H.pending(p, out)
        if not todo and not winners:
            return out
        req = {
            "src": src,
            "base": base,
            "chosen": [list(w.cflags) for w in winners],
            "hooks": [[{"i": c.index, "cflags": list(c.cflags)} for c in hc] for hc in todo],
            "usdt": usdt,
            "text": text,
        }
        left = deadline - time.monotonic()
        if left <= 0:
            out.combined_err = "trial deadline passed"
            return out
        try:
            proc = subprocess.run(
                [sys.executable, "-m", "railhop.sources.bpftrial"],
                input=json.dumps(req),
                capture_output=True,
                text=True,
                timeout=left,
                env=env,
                check=False,
            )
            stdout, rc, stderr = proc.stdout, proc.returncode, proc.stderr
        except subprocess.TimeoutExpired as e:
            raw = e.stdout or b""
            stdout = raw.decode() if isinstance(raw, bytes) else raw
            rc, stderr = -9, "trial child timed out"
        diag = split_diagnostics(stderr)
        in_flight: int | None = None
        finished = False
        for line in stdout.splitlines():
            try:
                msg = json.loads(line)
            except ValueError:
                continue
            if "start" in msg:
                in_flight = int(msg["start"])
            elif "done" in msg:
                i = int(msg["done"])
                err = str(msg["err"])
                out.results[i] = (bool(msg["ok"]), _with_diag(err, diag.get(i, "")))
                in_flight = None
            elif "combined" in msg:
                out.combined_ok = bool(msg["combined"])
                out.combined_err = _with_diag(str(msg["err"]), diag.get(-1, ""))
                finished = True
        if finished:
            return out
        why = _with_diag(f"trial child died (rc {rc})", diag.get(in_flight, stderr))
        if in_flight is None or in_flight < 0:
            out.combined_ok = False
            out.combined_err = why
            return out
        out.results[in_flight] = (False, why)


def split_diagnostics(stderr: str) -> dict[int | None, str]:
    """Split the trial child's stderr by its ``@@railhop-trial <i>`` markers (pure)."""
    from railhop.sources.bpftrial import MARK

    out: dict[int | None, str] = {}
    key: int | None = None
    buf: list[str] = []
    for line in stderr.splitlines():
        if line.startswith(MARK):
            out[key] = "\n".join(buf)
            buf = []
            try:
                key = int(line[len(MARK) :])
            except ValueError:
                key = None
            continue
        buf.append(line)
    out[key] = "\n".join(buf)
    return out


def _with_diag(err: str, diag: str, lines: int = 4) -> str:
    if not err:
        return err
    tail = [ln.strip() for ln in diag.splitlines() if ln.strip()][-lines:]
    return err + (" | " + " / ".join(tail) if tail else "")


class EbpfSource:
    """A source backed by one probe file. ``filter_event`` may drop or rewrite decoded events."""

    def __init__(
        self,
        spec: H.ProbeSpec,
        bpf_dir: Path | None = None,
        root: str = "/",
        allow: frozenset[str] | None = None,
    ) -> None:
        self.spec = spec
        self.allow = allow
        self._bpf_dir = bpf_dir or paths.bpf_dir()
        self._root = root
        self._bpf: Any = None
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._emit: Emit | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._reader_fd: int | None = None
        self.delivery = ""  # "loop" (add_reader on the ring buffer) | "thread" (poll thread)
        self.capabilities: list[Capability] = []
        self.decode_errors = 0
        self.poll_errors = 0
        self.chosen: list[H.Variant | None] = []

    @property
    def name(self) -> str:
        return self.spec.source

    def _src(self) -> Path:
        return self._bpf_dir / self.spec.file

    def base_cflags(self) -> list[str]:
        return [f"-I{self._bpf_dir}", *self.spec.cflags]

    def text(self) -> str:
        """The program as bcc compiles it: preludes + probe file (:mod:`sources.compose`)."""
        return compose(self._bpf_dir, self.spec.file, self.spec.preludes)

    def usdt_request(self) -> dict[str, Any] | None:
        return None

    def _construct(self, cflags: list[str]) -> Any:
        from bcc import BPF

        return BPF(text=self.text().encode(), cflags=cflags)

    def probe(self) -> tuple[list[Capability], list[str]]:
        """Decide the variants (runs the trial child); returns records and the final cflags."""
        pre = precheck(self._root)
        if pre.env is None:
            return H.all_skipped(self.spec, pre.reason, pre.detail), []
        if not self._src().is_file():
            return H.all_skipped(self.spec, Reason.NOT_AVAILABLE, f"missing {self._src()}"), []
        try:
            text = self.text()
        except ComposeError as e:
            return H.all_skipped(self.spec, Reason.NOT_AVAILABLE, str(e)), []
        p = H.plan(self.spec, pre.env, self.allow)
        if not any(p.candidates):
            caps, _f, self.chosen = H.resolve(self.spec, p, H.TrialOutcome())
            return caps, []
        outcome = run_trials(
            str(self._src()), self.base_cflags(), p, self.usdt_request(), text=text
        )
        caps, flags, self.chosen = H.resolve(self.spec, p, outcome)
        return caps, flags

    def bind_loop(self, loop: asyncio.AbstractEventLoop) -> None:
        """Deliver events on ``loop`` (call before ``start_sync``, from any thread)."""
        self._loop = loop

    def start_sync(self, emit: Emit) -> list[Capability]:
        caps, flags = self.probe()
        self.capabilities = caps
        if not any(c.attached for c in caps):
            return caps
        try:
            self._bpf = self._construct(self.base_cflags() + flags)
            self.after_load(self._bpf)
            self._bpf[b"rh_events"].open_ring_buffer(self._on_record)
            fd = int(self._bpf[b"rh_events"].map_fd)
        except Exception as e:
            self._bpf = None
            self.capabilities = H.all_skipped(
                self.spec, Reason.LOAD_FAILED, f"{type(e).__name__}: {e}"
            )
            return self.capabilities
        self._emit = emit
        self._stop.clear()
        loop = self._loop
        if loop is not None and _running_loop() is loop:
            self.delivery = "loop"
            self._add_reader(fd)
            return caps
        if loop is not None:
            try:
                loop.call_soon_threadsafe(self._add_reader, fd)
                self.delivery = "loop"
                return caps
            except RuntimeError:  # the loop was closed meanwhile: poll instead
                pass
        self.delivery = "thread"
        self._thread = threading.Thread(target=self._poll, name=f"rh-{self.name}", daemon=True)
        self._thread.start()
        return caps

    async def start(self, emit: Emit) -> list[Capability]:
        if self._loop is None:
            self.bind_loop(asyncio.get_running_loop())
        return await asyncio.to_thread(self.start_sync, emit)

    def after_load(self, bpf: Any) -> None:
        """Subclass hook: fill maps after the program is loaded."""

    def _add_reader(self, fd: int) -> None:
        """On the loop: watch the ring buffer (level-triggered: records already there count)."""
        if self._bpf is None or self._stop.is_set() or self._loop is None:
            return
        self._loop.add_reader(fd, self._readable)
        self._reader_fd = fd

    def _readable(self) -> None:
        b = self._bpf
        if b is None:
            return
        try:
            b.ring_buffer_consume()  # non-blocking; runs _on_record for every pending record
        except Exception:  # one bad record must not stop the loop
            self.poll_errors += 1

    def _remove_reader(self) -> None:
        fd, self._reader_fd = self._reader_fd, None
        loop = self._loop
        if fd is not None and loop is not None and not loop.is_closed():
            loop.remove_reader(fd)

    def _detach(self, timeout_s: float) -> None:
        """Stop watching the ring buffer, on the loop's thread when the loop runs elsewhere."""
        loop = self._loop
        if self._reader_fd is None or loop is None or loop.is_closed():
            self._reader_fd = None
            return
        if _running_loop() is loop or not loop.is_running():
            self._remove_reader()
            return
        done = threading.Event()

        def rm() -> None:
            try:
                self._remove_reader()
            finally:
                done.set()

        try:
            loop.call_soon_threadsafe(rm)
        except RuntimeError:  # closed meanwhile
            return
        done.wait(timeout_s)

    def _poll(self) -> None:
        b = self._bpf
        while not self._stop.is_set() and b is not None:
            try:
                b.ring_buffer_poll(POLL_MS)
            except Exception:  # keep polling: one bad callback must not end the source
                self.poll_errors += 1
                self._stop.wait(POLL_MS / 1000)

    def _on_record(self, _ctx: Any, data: Any, size: int) -> int:
        raw = ctypes.string_at(data, size)
        try:
            ev = decode(raw, self.name)
        except DecodeError:
            self.decode_errors += 1
            return 0
        out = self.filter_event(ev)
        if out is not None and self._emit is not None:
            try:
                self._emit(out)
            except Exception:  # never raise into bcc's C callback
                self.poll_errors += 1
        return 0

    def filter_event(self, ev: Event) -> Event | None:
        return ev

    def prog_stats(self) -> dict[str, ProgStats]:
        """Run count and run time of each loaded program, by function name (counted only while
        BPF statistics are enabled: :class:`railhop.sources.bpfstats.RunStats`)."""
        if self._bpf is None:
            return {}
        out: dict[str, ProgStats] = {}
        for name, fn in list(self._bpf.funcs.items()):
            key = name.decode() if isinstance(name, bytes) else str(name)
            out[key] = prog_stats(int(fn.fd))
        return out

    def drops(self) -> int:
        if self._bpf is None:
            return 0
        return sum(int(v.value) for v in self._bpf[b"rh_drops"].values())

    def stop_sync(self, timeout_s: float = 2.0) -> None:
        self._stop.set()
        self._detach(timeout_s)
        if self._thread is not None:
            self._thread.join(timeout_s)
            self._thread = None
        if self._bpf is not None:
            self._bpf.cleanup()
            self._bpf = None

    async def stop(self) -> None:
        self._stop.set()
        if _running_loop() is self._loop:
            self._remove_reader()
        await asyncio.to_thread(self.stop_sync)


def _running_loop() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None


# ----------------------------------------------------------------------------------------------
# The probes


RINGBUF = ("rh_ringbuf.c",)  # ring buffer, drop counter, RH_RESERVE (bpf/rh_ringbuf.c)

# netns inode of a struct net: net.ns.inum (what stat(/proc/<pid>/ns/net).st_ino shows)
NET_INUM = H.offset_chain("RH_OFF_NET_INUM", ("net", "ns"), ("ns_common", "inum"))

NETDEV_OFFSETS = H.offsets(
    RH_OFF_NETDEV_NAME=("net_device", "name"), RH_OFF_NETDEV_IFINDEX=("net_device", "ifindex")
)
NETDEV_NETNS = H.optional(
    H.compose(
        NET_INUM,
        H.offset_chain("RH_OFF_NETDEV_NET", ("net_device", "nd_net"), ("possible_net_t", "net")),
    ),
    ["-DRH_NO_NETNS"],
)

CARRIER = H.ProbeSpec(
    source="ebpf.carrier",
    file="carrier.bpf.c",
    preludes=RINGBUF,
    hooks=(
        H.Hook(
            "carrier",
            (
                H.Variant(
                    "fentry",
                    "netif_carrier_off+on",
                    "RH_CARRIER_FENTRY",
                    (
                        H.funcs("netif_carrier_off", "netif_carrier_on"),
                        NETDEV_OFFSETS,
                        NETDEV_NETNS,
                    ),
                ),
                H.Variant(
                    "raw_tp",
                    "qdisc_reset",
                    "RH_CARRIER_RAW_TP",
                    (
                        H.raw_tp("qdisc_reset"),
                        NETDEV_OFFSETS,
                        NETDEV_NETNS,
                        H.offsets(
                            RH_OFF_NETDEV_STATE=("net_device", "state"),
                            RH_OFF_QDISC_DEV_QUEUE=("Qdisc", "dev_queue"),
                            RH_OFF_NETDEV_QUEUE_DEV=("netdev_queue", "dev"),
                        ),
                        H.enum_value(
                            "RH_NOCARRIER_BIT", "netdev_state_t", "__LINK_STATE_NOCARRIER"
                        ),
                        H.enum_value("RH_START_BIT", "netdev_state_t", "__LINK_STATE_START"),
                    ),
                ),
                H.Variant(
                    "tp", "qdisc:qdisc_reset", "RH_CARRIER_TP", (H.tp("qdisc", "qdisc_reset"),)
                ),
            ),
        ),
    ),
)

SOCK_OFFSETS = H.offsets(
    RH_OFF_SKC_DADDR=("sock_common", "skc_daddr"),
    RH_OFF_SKC_RCV_SADDR=("sock_common", "skc_rcv_saddr"),
    RH_OFF_SKC_DPORT=("sock_common", "skc_dport"),
    RH_OFF_INET_SPORT=("inet_sock", "inet_sport"),
    RH_OFF_SKC_FAMILY=("sock_common", "skc_family"),
    RH_OFF_SKC_STATE=("sock_common", "skc_state"),
    RH_OFF_SKC_V6_DADDR=("sock_common", "skc_v6_daddr"),
    RH_OFF_SKC_V6_RCV_SADDR=("sock_common", "skc_v6_rcv_saddr"),
)
SOCK_NETNS = H.optional(
    H.compose(
        NET_INUM,
        H.offset_chain("RH_OFF_SKC_NET", ("sock_common", "skc_net"), ("possible_net_t", "net")),
    ),
    ["-DRH_NO_NETNS"],
)

TCP_LANE = H.ProbeSpec(
    source="ebpf.tcp",
    file="tcp_lane.bpf.c",
    preludes=RINGBUF,
    hooks=(
        H.Hook(
            "retransmit",
            (
                H.Variant(
                    "raw_tp",
                    "tcp_retransmit_skb",
                    "RH_RETRANS_RAW_TP",
                    (
                        H.raw_tp("tcp_retransmit_skb"),
                        SOCK_OFFSETS,
                        SOCK_NETNS,
                        H.raw_tp_nargs_flag("tcp_retransmit_skb", 3, "RH_RAW_RETRANS_HAS_ERR"),
                    ),
                ),
                H.Variant(
                    "tp",
                    "tcp:tcp_retransmit_skb",
                    "RH_RETRANS_TP",
                    (
                        H.tp("tcp", "tcp_retransmit_skb"),
                        H.tp_field_flag(
                            "tcp", "tcp_retransmit_skb", "err", "RH_TP_RETRANS_HAS_ERR"
                        ),
                    ),
                ),
            ),
        ),
        H.Hook(
            "sk_error",
            (
                H.Variant(
                    "raw_tp",
                    "inet_sk_error_report",
                    "RH_SKERR_RAW_TP",
                    (
                        H.raw_tp("inet_sk_error_report"),
                        SOCK_OFFSETS,
                        SOCK_NETNS,
                        H.offsets(
                            RH_OFF_SK_ERR=("sock", "sk_err"),
                            RH_OFF_SK_PROTOCOL=("sock", "sk_protocol"),
                        ),
                    ),
                ),
                H.Variant(
                    "tp",
                    "sock:inet_sk_error_report",
                    "RH_SKERR_TP",
                    (H.tp("sock", "inet_sk_error_report"),),
                ),
            ),
        ),
        H.Hook(
            "loss",
            (
                H.Variant(
                    "raw_tp",
                    "tcp_cong_state_set",
                    "RH_LOSS_RAW_TP",
                    (H.raw_tp("tcp_cong_state_set"), SOCK_OFFSETS, SOCK_NETNS),
                ),
                H.Variant(
                    "tp",
                    "tcp:tcp_cong_state_set",
                    "RH_LOSS_TP",
                    (H.tp("tcp", "tcp_cong_state_set"),),
                ),
            ),
        ),
    ),
)

RDMA_DRV = H.ProbeSpec(
    source="ebpf.rdma",
    file="rdma_drv.bpf.c",
    preludes=RINGBUF,
    hooks=(
        H.Hook(
            "ib_event",
            (
                H.Variant(
                    "fentry",
                    "ib_dispatch_event",
                    "RH_IB_EVENT_FENTRY",
                    (
                        H.funcs("ib_dispatch_event"),
                        H.offsets(
                            RH_OFF_IBEV_DEVICE=("ib_event", "device"),
                            # port_num is a member of the union ib_event.element (with the
                            # cq/qp/srq/wq pointers), so the union's offset is the port's: a
                            # GPU host's BTF (6.18) has no ib_event.port_num at top level
                            RH_OFF_IBEV_PORT=("ib_event", "element"),
                            RH_OFF_IBEV_EVENT=("ib_event", "event"),
                            RH_OFF_IBDEV_NAME=("ib_device", "name"),
                        ),
                    ),
                ),
            ),
        ),
        H.Hook(
            "devlink_health",
            (
                H.Variant(
                    "tp",
                    "devlink:devlink_health_report",
                    "RH_DEVLINK_TP",
                    (H.tp("devlink", "devlink_health_report"),),
                ),
            ),
        ),
        H.Hook(
            "cm_event",
            (
                H.Variant(
                    "tp",
                    "rdma_cma:cm_event_handler",
                    "RH_CM_EVENT_TP",
                    (H.tp("rdma_cma", "cm_event_handler"),),
                ),
            ),
        ),
        H.Hook(
            "cm_remove",
            (
                H.Variant(
                    "tp",
                    "rdma_cma:cm_remove_one",
                    "RH_CM_REMOVE_TP",
                    (H.tp("rdma_cma", "cm_remove_one"),),
                ),
            ),
        ),
        H.Hook(
            "mlx5_cmd",
            (H.Variant("tp", "mlx5:mlx5_cmd", "RH_MLX5_CMD_TP", (H.tp("mlx5", "mlx5_cmd"),)),),
        ),
    ),
)


class CarrierDedup:
    """Collapses repeats: the qdisc proxies fire once per queue (several per device) and
    netif_carrier_off() is called again while carrier is already off. Pure; keyed by ifname."""

    def __init__(self, window_ns: int = 10_000_000) -> None:
        self.window_ns = window_ns
        self._last: dict[str, tuple[bool, int]] = {}

    def accept(self, ifname: str, down: bool, ts_ns: int) -> bool:
        if not ifname or ifname == "(null)":
            return False
        prev = self._last.get(ifname)
        self._last[ifname] = (down, ts_ns)
        if prev is None:
            return True
        pdown, pts = prev
        if pdown != down:
            return True
        if ts_ns - pts < self.window_ns:
            self._last[ifname] = prev  # keep the window anchored at the first one
            return False
        return True


class NetnsFilter:
    """Keeps events of one network namespace (by inode). Events whose hook cannot see the netns
    (``netns_ino == 0``: plain tracepoints) pass. ``netns``: None = no filter, ``"self"``, or a
    name under /var/run/netns; resolved at ``start``."""

    def __init__(self, netns: str | None, root: str) -> None:
        self.netns = netns
        self._root = root
        self.ino = 0

    def resolve(self) -> None:
        self.ino = kernel.netns_inode(self.netns, self._root) if self.netns else 0

    def keep(self, ev: Event) -> bool:
        ino = getattr(ev, "netns_ino", 0)
        return not self.ino or not ino or ino == self.ino


class CarrierSource(EbpfSource):
    """Carrier loss (and, with fentry, carrier up) of netdevs, deduplicated.
    ``ifnames``: report only these devices (None = all); ``netns``: see :class:`NetnsFilter`."""

    def __init__(
        self,
        ifnames: set[str] | None = None,
        bpf_dir: Path | None = None,
        root: str = "/",
        allow: frozenset[str] | None = None,
        netns: str | None = None,
    ) -> None:
        super().__init__(CARRIER, bpf_dir, root, allow)
        self.ifnames = ifnames
        self.netns = NetnsFilter(netns, root)
        self._dedup = CarrierDedup()

    @property
    def dedup_window_ns(self) -> int:
        return self._dedup.window_ns

    def start_sync(self, emit: Emit) -> list[Capability]:
        try:
            self.netns.resolve()
        except OSError as e:
            return H.all_skipped(self.spec, Reason.NOT_AVAILABLE, f"netns {self.netns.netns}: {e}")
        return super().start_sync(emit)

    def filter_event(self, ev: Event) -> Event | None:
        name = getattr(ev, "ifname", "")
        if self.ifnames is not None and name not in self.ifnames:
            return None
        if not self.netns.keep(ev):
            return None
        if not self._dedup.accept(name, isinstance(ev, CarrierDown), ev.ts_ns):
            return None
        return ev


class TcpLaneSource(EbpfSource):
    """TCP trouble on lane sockets, matched by port: ``add_port(p)`` (local port of a lane socket)
    or ``add_port(p, remote=True)`` (its peer's port). Works before and after ``start``.
    ``netns``: see :class:`NetnsFilter` (ports are per netns)."""

    LOCAL = 1
    REMOTE = 2

    def __init__(
        self,
        bpf_dir: Path | None = None,
        root: str = "/",
        allow: frozenset[str] | None = None,
        netns: str | None = None,
    ) -> None:
        super().__init__(TCP_LANE, bpf_dir, root, allow)
        self.netns = NetnsFilter(netns, root)
        self._ports: dict[int, int] = {}
        self._lock = threading.Lock()

    def add_port(self, port: int, remote: bool = False) -> None:
        if not 0 < port < 65536:
            raise EbpfError(f"bad port {port}")
        with self._lock:
            self._ports[port] = self._ports.get(port, 0) | (self.REMOTE if remote else self.LOCAL)
            self._sync(port)

    def remove_port(self, port: int) -> None:
        with self._lock:
            self._ports.pop(port, None)
            self._sync(port)

    def ports(self) -> dict[int, int]:
        with self._lock:
            return dict(self._ports)

    def _sync(self, port: int) -> None:
        if self._bpf is None:
            return
        table = self._bpf[b"rh_lane_ports"]
        key = table.Key(port)
        flags = self._ports.get(port)
        if flags is None:
            with contextlib.suppress(KeyError):
                del table[key]
        else:
            table[key] = table.Leaf(flags)

    def start_sync(self, emit: Emit) -> list[Capability]:
        try:
            self.netns.resolve()
        except OSError as e:
            return H.all_skipped(self.spec, Reason.NOT_AVAILABLE, f"netns {self.netns.netns}: {e}")
        return super().start_sync(emit)

    def filter_event(self, ev: Event) -> Event | None:
        return ev if self.netns.keep(ev) else None

    def after_load(self, bpf: Any) -> None:
        with self._lock:
            for port in self._ports:
                self._sync(port)


class RdmaDriverSource(EbpfSource):
    def __init__(
        self, bpf_dir: Path | None = None, root: str = "/", allow: frozenset[str] | None = None
    ) -> None:
        super().__init__(RDMA_DRV, bpf_dir, root, allow)
