"""The eBPF loader on this kernel: a compile that aborts the process is contained in the trial
child, tracefs gets mounted when missing, and every hook ends up attached or skipped with a
reason from the fixed vocabulary."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import require
from railhop.sources import hooks as H
from railhop.sources.base import Reason
from railhop.sources.ebpf.carrier import CarrierSource
from railhop.sources.ebpf.rdma import RdmaDriverSource
from railhop.sources.ebpf.source import EbpfSource
from railhop.sources.ebpf.tcp import TcpLaneSource

pytestmark = pytest.mark.privileged

# ringbuf_output() on a plain array trips an LLVM-14 assertion in bcc 0.26's rewriter: SIGABRT
# of the whole process (research/ebpf-rdma.md §5.5). The second variant is the fixed form.
CRASHER = """
BPF_RINGBUF_OUTPUT(rh_events, 8);
#ifdef RH_X_ABORT
RAW_TRACEPOINT_PROBE(sched_switch)
{
	char arr[16] = {};
	rh_events.ringbuf_output(arr, 16, 0);
	return 0;
}
#endif
#ifdef RH_X_OK
RAW_TRACEPOINT_PROBE(sched_switch)
{
	char arr[16] = {};
	rh_events.ringbuf_output(&arr, 16, 0);
	return 0;
}
#endif
"""


def test_a_compiler_abort_costs_only_the_trial_child(tmp_path: Path) -> None:
    (tmp_path / "x.bpf.c").write_text(CRASHER)
    spec = H.ProbeSpec(
        "test.abort",
        "x.bpf.c",
        (
            H.Hook(
                "x",
                (
                    H.Variant("raw_tp", "sched_switch", "RH_X_ABORT"),
                    H.Variant("tp", "sched_switch", "RH_X_OK"),
                ),
            ),
        ),
    )
    src = EbpfSource(spec, bpf_dir=tmp_path)
    caps = src.start_sync(lambda _e: None)  # this process survives
    try:
        assert len(caps) == 1 and caps[0].attached, caps
        assert caps[0].mechanism == "tp:sched_switch"
        assert "raw_tp: load failed (trial child died (rc -6)" in caps[0].detail
    finally:
        src.stop_sync()


PROBE_TRACEFS = """
import json, sys
from railhop.sources import kernel
before = kernel.find_tracefs()
path, note = kernel.ensure_tracefs()
print(json.dumps({"before": before, "path": path, "note": note}))
"""


def test_tracefs_is_mounted_when_missing() -> None:
    """In a private mount namespace (the host's mounts are untouched): unmount every tracefs,
    then ensure_tracefs() mounts it again."""
    require(shutil.which("unshare") is not None, "needs util-linux unshare")
    script = (
        "set -e; for m in /sys/kernel/debug/tracing /sys/kernel/tracing; do "
        "while mountpoint -q $m; do umount $m; done; done; "
        f"exec {sys.executable} -c '{PROBE_TRACEFS}'"
    )
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).parents[2] / "agent"))
    out = subprocess.run(
        ["unshare", "--mount", "--propagation", "private", "sh", "-c", script],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        check=True,
    )
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["before"] is None
    assert got["path"] == "/sys/kernel/tracing"
    assert got["note"] == "mounted tracefs at /sys/kernel/tracing"


VOCAB = set(Reason) - {Reason.NONE}


def test_every_hook_is_attached_or_skipped_with_a_reason() -> None:
    for cls in (CarrierSource, TcpLaneSource, RdmaDriverSource):
        src = cls()
        caps = src.start_sync(lambda _e: None)
        try:
            assert [c.hook for c in caps] == [h.name for h in src.spec.hooks]
            for c in caps:
                assert c.attached or c.reason in VOCAB, c
                if c.attached:
                    assert c.mechanism.split(":")[0] in ("fentry", "kprobe", "raw_tp", "tp")
            carrier = [c for c in caps if c.hook == "carrier"]
            if carrier and not carrier[0].mechanism.startswith("fentry"):
                # fentry is tried first and its refusal is recorded (EPERM on these VMs)
                assert "fentry:" in carrier[0].detail
        finally:
            src.stop_sync()


@pytest.mark.parametrize("mech", ["raw_tp", "tp"])
def test_every_carrier_and_tcp_variant_loads_here(mech: str) -> None:
    """Each probe file, composed with the shared ring-buffer prelude, compiles, loads and
    attaches in every variant this kernel offers (fentry is refused here, RDMA has no hooks)."""
    for cls in (CarrierSource, TcpLaneSource):
        src = cls(allow=frozenset({mech}))
        caps = src.start_sync(lambda _e: None)
        try:
            assert caps and all(c.attached for c in caps), [c.line() for c in caps]
            assert {c.mechanism.split(":")[0] for c in caps} == {mech}
            assert src.drops() == 0
            assert src.prog_stats()  # the loaded programs, by function name
        finally:
            src.stop_sync()


def test_rdma_probe_compiles_though_nothing_attaches_here() -> None:
    """No RDMA hook exists on this kernel, but the composed rdma_drv program must still compile:
    its fentry variant gets as far as the load (refused here: no ib_dispatch_event), its kprobe
    variant through the load to the attach, never to a C error (which bcc reports as "Failed to
    compile BPF module")."""
    from bcc import BPF

    from railhop import paths
    from railhop.sources.compose import compose
    from railhop.sources.ebpf.rdma import RDMA_DRV

    d = paths.bpf_dir()
    text = compose(d, RDMA_DRV.file, RDMA_DRV.preludes)
    offs = ["-DRH_OFF_IBEV_DEVICE=0", "-DRH_OFF_IBEV_PORT=8", "-DRH_OFF_IBEV_EVENT=12"]
    flags = [f"-I{d}", "-DRH_IB_EVENT_FENTRY", *offs, "-DRH_OFF_IBDEV_NAME=16"]
    try:
        BPF(text=text.encode(), cflags=flags).cleanup()  # a kernel that has it and allows fentry
    except Exception as e:
        assert "Failed to load BPF program b'kfunc__ib_dispatch_event'" in str(e), e
    # the kprobe fallback gets past the verifier: only the attach can fail (no kprobe events
    # or no ib_core here)
    flags = [f"-I{d}", "-DRH_IB_EVENT_KPROBE", *offs, "-DRH_OFF_IBDEV_NAME=16"]
    try:
        BPF(text=text.encode(), cflags=flags).cleanup()  # kprobes and ib_core loaded
    except Exception as e:
        assert "Failed to attach BPF program b'kprobe__ib_dispatch_event'" in str(e), e
