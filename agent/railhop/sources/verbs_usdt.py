"""The verbs lane's completion probes (``verbs_wc``, ``verbs_wc_err``, ``verbs_async``: see
plugin/src/probes.h), attached by library path with bcc like the lane probes
(:class:`railhop.sources.usdt.UsdtSource`), with their own program (``bpf/verbs_usdt.bpf.c``,
source ``usdt.verbs``).

``verbs_wc`` fires for every completion and is aggregated in the kernel per (pid, NIC index):
read with :meth:`VerbsUsdtSource.completion_stats`. ``verbs_wc_err`` and ``verbs_async`` come
through the ring buffer as :class:`VerbsWcError` / :class:`VerbsAsync`. The NIC index is the
plugin's (its NIC list: RAILHOP_NICS or the sorted auto-detected names); the daemon names the
NIC (:func:`railhop.daemon.translate.health_event_from_verbs`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from railhop.sources import hooks as H
from railhop.sources.decode import IB_EVENTS
from railhop.sources.events import Event, PluginLaneEvent, VerbsAsync, VerbsWcError
from railhop.sources.usdt import USDT_PRELUDES, UsdtProbes

VERBS_PROBES = ("verbs_wc", "verbs_wc_err", "verbs_async")
VERBS_SPEC = H.ProbeSpec(
    source="usdt.verbs", file="verbs_usdt.bpf.c", hooks=(), preludes=USDT_PRELUDES
)

# enum ibv_wc_status (rdma-core infiniband/verbs.h), without the IBV_WC_ prefix
WC_STATUS = {
    0: "SUCCESS",
    1: "LOC_LEN_ERR",
    2: "LOC_QP_OP_ERR",
    3: "LOC_EEC_OP_ERR",
    4: "LOC_PROT_ERR",
    5: "WR_FLUSH_ERR",
    6: "MW_BIND_ERR",
    7: "BAD_RESP_ERR",
    8: "LOC_ACCESS_ERR",
    9: "REM_INV_REQ_ERR",
    10: "REM_ACCESS_ERR",
    11: "REM_OP_ERR",
    12: "RETRY_EXC_ERR",
    13: "RNR_RETRY_EXC_ERR",
    14: "LOC_RDD_VIOL_ERR",
    15: "REM_INV_RD_REQ_ERR",
    16: "REM_ABORT_ERR",
    17: "INV_EECN_ERR",
    18: "INV_EEC_STATE_ERR",
    19: "FATAL_ERR",
    20: "RESP_TIMEOUT_ERR",
    21: "GENERAL_ERR",
    22: "TM_ERR",
    23: "TM_RNDV_INCOMPLETE",
}


def _s32(v: int) -> int:
    v &= 0xFFFFFFFF
    return v - (1 << 32) if v >= 1 << 31 else v


def typed_event(ev: PluginLaneEvent) -> Event | None:
    """A decoded ``verbs_wc_err`` / ``verbs_async`` record as its typed event. Pure."""
    a = [int(x) for x in ev.args] + [0, 0, 0, 0]
    if ev.probe == "verbs_wc_err":
        status = _s32(a[2])
        return VerbsWcError(
            ts_ns=ev.ts_ns,
            source=ev.source,
            hook=ev.hook,
            pid=ev.pid,
            qp_num=a[0] & 0xFFFFFFFF,
            nic=_s32(a[1]),
            status=status,
            status_name=WC_STATUS.get(status, str(status)),
            vendor_err=a[3] & 0xFFFFFFFF,
        )
    if ev.probe == "verbs_async":
        code = _s32(a[1])
        return VerbsAsync(
            ts_ns=ev.ts_ns,
            source=ev.source,
            hook=ev.hook,
            pid=ev.pid,
            nic=_s32(a[0]),
            event=IB_EVENTS.get(code, str(code)),
            code=code,
            qp_num=a[2] & 0xFFFFFFFF,
            port=_s32(a[3]),
        )
    return None


@dataclass(frozen=True, slots=True)
class CompletionStats:
    """verbs_wc totals of one process on one NIC index since the source started."""

    pid: int
    nic: int  # the plugin's NIC index, -1 when the lane did not name it
    wcs: int  # completions
    errs: int  # error completions (flushes included)
    flushes: int  # IBV_WC_WR_FLUSH_ERR among them
    bytes: int  # byte_len of the successful ones
    timed: int  # completions that carried their post time
    post_ns_sum: int

    @property
    def mean_post_ns(self) -> float:
        return self.post_ns_sum / self.timed if self.timed else 0.0


class VerbsUsdtSource(UsdtProbes):
    """The verbs completion probes of the plugin library ``lib`` (every process mapping it)."""

    PROBE_SPEC: ClassVar[H.ProbeSpec] = VERBS_SPEC
    PROBES: ClassVar[tuple[str, ...]] = VERBS_PROBES
    ARG_LIMIT: ClassVar[int] = 5
    MIN_ARGS: ClassVar[dict[str, int]] = {"verbs_wc": 5, "verbs_wc_err": 4, "verbs_async": 4}

    def filter_event(self, ev: Event) -> Event | None:
        return typed_event(ev) if isinstance(ev, PluginLaneEvent) else None

    def completion_stats(self) -> list[CompletionStats]:
        """Per (pid, NIC index) totals of verbs_wc (empty when it is not attached)."""
        if self._bpf is None or "verbs_wc" not in self._usable:
            return []
        out = [
            CompletionStats(
                pid=int(k.pid),
                nic=int(k.nic),
                wcs=int(v.wcs),
                errs=int(v.errs),
                flushes=int(v.flushes),
                bytes=int(v.bytes),
                timed=int(v.timed),
                post_ns_sum=int(v.post_ns_sum),
            )
            for k, v in self._bpf[b"rh_verbs_stats"].items()
        ]
        return sorted(out, key=lambda s: (s.pid, s.nic))
