"""Hook-chain planning, trial outcome resolution, capability records, kernel fact helpers."""

from __future__ import annotations

from pathlib import Path

import pytest

from railhop.sources import btf as btfmod
from railhop.sources import hooks as H
from railhop.sources import kernel
from railhop.sources.base import Reason, Status
from railhop.sources.btf import Btf, BtfType, Member
from railhop.sources.ebpf import loader
from railhop.sources.ebpf.carrier import CARRIER
from railhop.sources.ebpf.rdma import RDMA_DRV
from railhop.sources.ebpf.tcp import TCP_LANE, TcpLaneSource

EMPTY_BTF = Btf([], {})


def env(tmp_path: Path, *, btf: Btf | None = EMPTY_BTF, tps: tuple[str, ...] = ()) -> H.KernelEnv:
    tracefs = tmp_path / "tracing"
    for t in tps:
        (tracefs / "events" / t).mkdir(parents=True)
    return H.KernelEnv(btf, "" if btf else "no /sys/kernel/btf/vmlinux", str(tracefs), "")


def spec() -> H.ProbeSpec:
    return H.ProbeSpec(
        source="s",
        file="x.bpf.c",
        hooks=(
            H.Hook(
                "h",
                (
                    H.Variant("fentry", "f", "F", (H.funcs("some_func"),)),
                    H.Variant("raw_tp", "r", "R", ()),
                    H.Variant("tp", "cat:ev", "T", (H.tp("cat", "ev"),)),
                ),
            ),
            H.Hook("only_tp", (H.Variant("tp", "cat:other", "O", (H.tp("cat", "other"),)),)),
        ),
    )


def test_plan_rules_out_variants_before_compiling(tmp_path: Path) -> None:
    p = H.plan(spec(), env(tmp_path, tps=("cat/ev",)))
    assert [[c.cflags for c in hc] for hc in p.candidates] == [[("-DR",), ("-DT",)], []]
    assert [(v.mechanism, r) for v, r, _d in p.notes[0]] == [("fentry", Reason.NOT_AVAILABLE)]
    assert [(v.mechanism, r) for v, r, _d in p.notes[1]] == [("tp", Reason.NO_TRACEPOINT)]


def test_plan_without_btf_or_tracefs(tmp_path: Path) -> None:
    e = H.KernelEnv(None, "no BTF here", None, "mount failed: EPERM")
    p = H.plan(spec(), e)
    assert p.notes[0][0][1] == Reason.NO_BTF
    assert p.notes[0][1][0].mechanism == "tp"
    assert "mount failed" in p.notes[0][1][2]
    assert [c.cflags for c in p.candidates[0]] == [("-DR",)]


def test_allow_restricts_mechanisms(tmp_path: Path) -> None:
    p = H.plan(spec(), env(tmp_path, tps=("cat/ev",)), frozenset({"tp"}))
    assert [c.cflags for c in p.candidates[0]] == [("-DT",)]


def test_resolve_first_loading_variant_wins(tmp_path: Path) -> None:
    s = spec()
    p = H.plan(s, env(tmp_path, tps=("cat/ev", "cat/other")))
    raw, tp, other = p.candidates[0][0], p.candidates[0][1], p.candidates[1][0]
    out = H.TrialOutcome(
        {
            raw.index: (False, "Exception: Failed to compile BPF module"),
            tp.index: (True, ""),
            other.index: (True, ""),
        },
        combined_ok=True,
    )
    caps, flags, chosen = H.resolve(s, p, out)
    assert [(c.hook, c.status, c.mechanism) for c in caps] == [
        ("h", Status.ATTACHED, "tp:cat:ev"),
        ("only_tp", Status.ATTACHED, "tp:cat:other"),
    ]
    assert flags == ["-DT", "-DO"]
    assert [v.define if v else None for v in chosen] == ["T", "O"]
    # the record says why the earlier variants were passed over, in chain order
    assert caps[0].detail.startswith("fentry: not available")
    assert "raw_tp: load failed" in caps[0].detail


def test_resolve_fentry_refused_and_combined_failure(tmp_path: Path) -> None:
    s = H.ProbeSpec("s", "x", (H.Hook("h", (H.Variant("fentry", "f", "F"),)),))
    p = H.plan(s, env(tmp_path))
    err = (
        "Exception: Need super-user privileges to run | "
        "bpf: Failed to load program: Operation not permitted"
    )
    caps, flags, _ = H.resolve(s, p, H.TrialOutcome({0: (False, err)}))
    assert (caps[0].status, caps[0].reason, flags) == (Status.SKIPPED, Reason.FENTRY_REFUSED, [])
    caps, _, _ = H.resolve(s, p, H.TrialOutcome({0: (True, "")}, False, "child died"))
    assert (caps[0].reason, caps[0].detail) == (Reason.LOAD_FAILED, "child died")


def test_pending_after_a_crash(tmp_path: Path) -> None:
    s = spec()
    p = H.plan(s, env(tmp_path, tps=("cat/ev", "cat/other")))
    raw, tp, other = p.candidates[0][0], p.candidates[0][1], p.candidates[1][0]
    # the child died on `raw`: it is marked failed, the rest is still to do
    out = H.TrialOutcome({raw.index: (False, "trial child died (rc -6)")})
    todo, winners = H.pending(p, out)
    assert todo == [[tp], [other]] and winners == []
    out.results[tp.index] = (True, "")
    todo, winners = H.pending(p, out)
    assert todo == [[other]] and winners == [tp]


@pytest.mark.parametrize(
    ("mech", "err", "reason"),
    [
        ("fentry", "bpf: Failed to load program: Operation not permitted", Reason.FENTRY_REFUSED),
        ("tp", "Unable to find kernel headers", Reason.NO_HEADERS),
        ("tp", "Failed to attach: Operation not permitted", Reason.NO_PRIVILEGE),
        ("tp", "Failed to compile BPF module", Reason.LOAD_FAILED),
    ],
)
def test_classify(mech: str, err: str, reason: Reason) -> None:
    assert H.classify(mech, err) is reason


def test_specs_are_well_formed() -> None:
    for s in (CARRIER, TCP_LANE, RDMA_DRV):
        order = {"fentry": 0, "kprobe": 1, "raw_tp": 2, "tp": 3}
        for h in s.hooks:
            ranks = [order[v.mechanism] for v in h.variants]
            assert ranks == sorted(ranks), (s.source, h.name)
            assert len({v.define for v in h.variants}) == len(h.variants)
        text = (Path(__file__).parents[2] / "bpf" / s.file).read_text()
        for h in s.hooks:
            for v in h.variants:
                assert v.define in text, (s.file, v.define)


def test_bpf_privileged() -> None:
    assert kernel.bpf_privileged(1 << kernel.CAP_SYS_ADMIN)
    assert kernel.bpf_privileged((1 << kernel.CAP_BPF) | (1 << kernel.CAP_PERFMON))
    assert not kernel.bpf_privileged(1 << kernel.CAP_BPF)
    assert not kernel.bpf_privileged(0)


def test_cap_eff_and_precheck_without_privilege(tmp_path: Path) -> None:
    (tmp_path / "proc/self").mkdir(parents=True)
    (tmp_path / "proc/self/status").write_text("Name:\tx\nCapEff:\t0000000000000000\n")
    assert kernel.cap_eff(str(tmp_path)) == 0
    pre = loader.precheck(str(tmp_path), refresh=True)
    assert (pre.reason, pre.env) == (Reason.NO_PRIVILEGE, None)
    src = TcpLaneSource(root=str(tmp_path))
    caps = src.start_sync(lambda _e: None)
    assert [(c.hook, c.reason) for c in caps] == [
        ("retransmit", Reason.NO_PRIVILEGE),
        ("sk_error", Reason.NO_PRIVILEGE),
        ("loss", Reason.NO_PRIVILEGE),
    ]
    src.stop_sync()


def test_kernel_headers_lookup(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("BCC_KERNEL_SOURCE", raising=False)
    assert kernel.kernel_headers("6.18.0", root=str(tmp_path)) is None
    build = tmp_path / "lib/modules/6.18.0/build"
    (build / "include/linux").mkdir(parents=True)
    (build / "include/linux/kconfig.h").write_text("")
    assert kernel.kernel_headers("6.18.0", root=str(tmp_path)) == str(build)


def test_find_tracefs(tmp_path: Path) -> None:
    assert kernel.find_tracefs(str(tmp_path)) is None
    (tmp_path / "sys/kernel/debug/tracing/events").mkdir(parents=True)
    assert kernel.find_tracefs(str(tmp_path)) == str(tmp_path / "sys/kernel/debug/tracing")


FORMAT = """name: tcp_retransmit_skb
ID: 2281
format:
\tfield:unsigned short common_type;\toffset:0;\tsize:2;\tsigned:0;
\tfield:int common_pid;\toffset:4;\tsize:4;\tsigned:1;

\tfield:const void * skbaddr;\toffset:8;\tsize:8;\tsigned:0;
\tfield:__u16 sport;\toffset:28;\tsize:2;\tsigned:0;
\tfield:__u8 saddr_v6[16];\toffset:42;\tsize:16;\tsigned:0;
\tfield:__data_loc char[] dev;\toffset:8;\tsize:4;\tsigned:0;
\tfield:int err;\toffset:76;\tsize:4;\tsigned:1;

print fmt: "skbaddr=%p", REC->skbaddr
"""


def test_parse_format_fields() -> None:
    assert kernel.parse_format_fields(FORMAT) == ["skbaddr", "sport", "saddr_v6", "dev", "err"]


def rdma_btf(with_func: bool) -> Btf:
    """BTF with struct ib_event / ib_device, and ib_dispatch_event's FUNC only ``with_func``
    (a module without BTF of its own: the function is not there for fentry)."""
    types = [
        BtfType(0, "", 0, False),
        BtfType(
            btfmod.KIND_STRUCT,
            "ib_event",
            24,
            False,
            3,
            [Member("device", 0, 0), Member("element", 0, 64), Member("event", 0, 128)],
        ),
        BtfType(btfmod.KIND_STRUCT, "ib_device", 64, False, 1, [Member("name", 0, 16 * 8)]),
    ]
    by_name = {(btfmod.KIND_STRUCT, "ib_event"): [1], (btfmod.KIND_STRUCT, "ib_device"): [2]}
    if with_func:
        types.append(BtfType(btfmod.KIND_FUNC, "ib_dispatch_event", 0, False))
        by_name[(btfmod.KIND_FUNC, "ib_dispatch_event")] = [3]
    return Btf(types, by_name)


def ib_event_only() -> H.ProbeSpec:
    return H.ProbeSpec(RDMA_DRV.source, RDMA_DRV.file, RDMA_DRV.hooks[:1])


def rdma_env(tmp_path: Path, with_func: bool, kprobes: bool, syms: set[str]) -> H.KernelEnv:
    return H.KernelEnv(
        rdma_btf(with_func), "", str(tmp_path), "", kprobes=kprobes, ksym=syms.__contains__
    )


OFFS = (
    "-DRH_OFF_IBEV_DEVICE=0",
    "-DRH_OFF_IBEV_PORT=8",
    "-DRH_OFF_IBEV_EVENT=16",
    "-DRH_OFF_IBDEV_NAME=16",
)


@pytest.mark.parametrize(
    ("with_func", "kprobes", "syms", "want"),
    [
        # the function in BTF: fentry first, the kprobe behind it for a refused fentry
        (True, True, {"ib_dispatch_event"}, ["RH_IB_EVENT_FENTRY", "RH_IB_EVENT_KPROBE"]),
        # a module without BTF for its functions: only the kprobe can reach it
        (False, True, {"ib_dispatch_event"}, ["RH_IB_EVENT_KPROBE"]),
        (False, False, {"ib_dispatch_event"}, []),  # no kprobe events in this kernel
        (False, True, set(), []),  # ib_core not loaded: no such symbol
        (True, False, set(), ["RH_IB_EVENT_FENTRY"]),
    ],
)
def test_ib_event_falls_back_to_a_kprobe(
    tmp_path: Path, with_func: bool, kprobes: bool, syms: set[str], want: list[str]
) -> None:
    p = H.plan(ib_event_only(), rdma_env(tmp_path, with_func, kprobes, syms))
    assert [c.cflags[0].removeprefix("-D") for c in p.candidates[0]] == want
    for c in p.candidates[0]:
        assert c.cflags[1:] == OFFS  # the same struct offsets from BTF either way


def test_ib_event_kprobe_reasons_and_resolution(tmp_path: Path) -> None:
    spec = ib_event_only()
    p = H.plan(spec, rdma_env(tmp_path, False, False, set()))
    caps, _flags, _chosen = H.resolve(spec, p, H.TrialOutcome())
    assert caps[0].reason is Reason.NOT_AVAILABLE
    assert "fentry: not available (no function ib_dispatch_event in BTF)" in caps[0].detail
    assert "kprobe: not available (no kprobe events (CONFIG_KPROBE_EVENTS))" in caps[0].detail
    # fentry refused at load (EPERM), the kprobe attaches: its flags are the ones compiled
    p = H.plan(spec, rdma_env(tmp_path, True, True, {"ib_dispatch_event"}))
    fentry, kp = p.candidates[0]
    outcome = H.TrialOutcome(
        {fentry.index: (False, "Operation not permitted"), kp.index: (True, "")}, True, ""
    )
    caps, flags, chosen = H.resolve(spec, p, outcome)
    assert caps[0].attached and caps[0].mechanism == "kprobe:ib_dispatch_event"
    assert "fentry: fentry refused" in caps[0].detail
    assert flags == list(kp.cflags) and chosen == [spec.hooks[0].variants[1]]


def test_kprobe_facts(tmp_path: Path) -> None:
    text = (
        "ffffffffc0a01000 t ib_dispatch_event\t[ib_core]\n"
        "ffffffff81000000 T _stext\n"
        "0000000000000000 t ib_dispatch_event_clients\t[ib_core]\n"
    )
    assert kernel.kallsyms_lookup(text, "ib_dispatch_event")
    assert not kernel.kallsyms_lookup(text, "ib_dispatch")
    assert not kernel.kallsyms_has("ib_dispatch_event", str(tmp_path))  # no /proc/kallsyms
    (tmp_path / "proc").mkdir()
    (tmp_path / "proc/kallsyms").write_text(text)
    assert kernel.kallsyms_has("ib_dispatch_event", str(tmp_path))
    assert not kernel.kprobes_available(None)
    assert not kernel.kprobes_available(str(tmp_path))
    (tmp_path / "kprobe_events").write_text("")
    assert kernel.kprobes_available(str(tmp_path))
