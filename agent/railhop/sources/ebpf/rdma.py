"""The RDMA driver source: IB async events, devlink health reports, rdma_cma events and mlx5
commands from ``bpf/rdma_drv.bpf.c``."""

from __future__ import annotations

from pathlib import Path

from railhop.sources import hooks as H
from railhop.sources.base import Capability, Emit
from railhop.sources.bpfstats import ProgStats
from railhop.sources.ebpf.late import LateHooks
from railhop.sources.ebpf.source import RINGBUF, EbpfSource

IB_EVENT_OFFSETS = H.offsets(
    RH_OFF_IBEV_DEVICE=("ib_event", "device"),
    # port_num is a member of the union ib_event.element (with the cq/qp/srq/wq pointers), so
    # the union's offset is the port's: a GPU host's BTF (6.18) has no ib_event.port_num at top
    # level
    RH_OFF_IBEV_PORT=("ib_event", "element"),
    RH_OFF_IBEV_EVENT=("ib_event", "event"),
    RH_OFF_IBDEV_NAME=("ib_device", "name"),
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
                    (H.funcs("ib_dispatch_event"), IB_EVENT_OFFSETS),
                ),
                # where fentry cannot attach (no BTF FUNC for the function, fentry refused):
                # the same record through a kprobe, the struct offsets still from BTF
                H.Variant(
                    "kprobe",
                    "ib_dispatch_event",
                    "RH_IB_EVENT_KPROBE",
                    (H.kprobe("ib_dispatch_event"), IB_EVENT_OFFSETS),
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


class RdmaDriverSource(EbpfSource):
    """RDMA driver trouble: IB async events, devlink health reports, rdma_cma events, mlx5
    commands (whichever hooks this kernel has). The ``rdma_cma`` tracepoints appear only once
    the ``rdma_cm`` module is loaded: hooks skipped for a missing tracepoint are loaded when it
    appears (:mod:`railhop.sources.ebpf.late`)."""

    def __init__(
        self,
        bpf_dir: Path | None = None,
        root: str = "/",
        allow: frozenset[str] | None = None,
    ) -> None:
        super().__init__(RDMA_DRV, bpf_dir, root, allow)
        self.late = LateHooks(self, self._late_source)

    def _late_source(self, spec: H.ProbeSpec) -> EbpfSource:
        return EbpfSource(spec, self._bpf_dir, self.root, self.allow)

    def start_sync(self, emit: Emit) -> list[Capability]:
        caps = super().start_sync(emit)
        self.late.start(emit, self._loop)
        return caps

    def drops(self) -> int:
        return super().drops() + self.late.drops()

    def prog_stats(self) -> dict[str, ProgStats]:
        return {**super().prog_stats(), **self.late.prog_stats()}

    def stop_sync(self, timeout_s: float = 2.0) -> None:
        self.late.stop(timeout_s)
        super().stop_sync(timeout_s)
