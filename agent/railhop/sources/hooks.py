"""Hook chains: which implementations of a hook exist, what each needs, and which one to use.

A probe file (``bpf/<probe>.bpf.c``) has one or more hooks; each hook has variants in the order
fentry -> kprobe -> raw tracepoint -> tracepoint, each switched on by a ``-D`` define. A variant's
requirements turn kernel facts (:class:`KernelEnv`) into extra ``-D`` flags (BTF offsets) or
raise :class:`Unavailable` with a reason. Everything here is pure: the trial outcome (what the
child process managed to load) comes in as data and :func:`resolve` turns it into capability
records and the final cflags.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

from railhop.sources.base import Capability, Reason, SourceError, attached, skipped
from railhop.sources.btf import Btf, BTFError
from railhop.sources.kernel import tracepoint_exists


class Unavailable(SourceError):
    """A variant cannot be tried on this kernel (known without compiling)."""

    def __init__(self, reason: Reason, detail: str) -> None:
        super().__init__(f"{reason.value}: {detail}")
        self.reason = reason
        self.detail = detail


@dataclass(frozen=True, slots=True)
class KernelEnv:
    btf: Btf | None
    btf_error: str
    tracefs: str | None
    tracefs_note: str
    tp_fields: Callable[[str, str], list[str]] = field(default=lambda _c, _e: [])
    kprobes: bool = False  # the kernel creates kprobe events
    ksym: Callable[[str], bool] = field(default=lambda _n: False)  # a kernel symbol now

    def need_btf(self) -> Btf:
        if self.btf is None:
            raise Unavailable(Reason.NO_BTF, self.btf_error or "no /sys/kernel/btf/vmlinux")
        return self.btf


Requirement = Callable[[KernelEnv], list[str]]


def funcs(*names: str) -> Requirement:
    """fentry targets must exist as BTF FUNCs."""

    def req(env: KernelEnv) -> list[str]:
        b = env.need_btf()
        for n in names:
            if not b.has_func(n):
                raise Unavailable(Reason.NOT_AVAILABLE, f"no function {n} in BTF")
        return []

    return req


def kprobe(name: str) -> Requirement:
    """A kprobe target: kprobe events and the symbol (a module's function too, with or without
    BTF of its own: what fentry needs and a module built out of tree lacks)."""

    def req(env: KernelEnv) -> list[str]:
        if not env.kprobes:
            raise Unavailable(Reason.NOT_AVAILABLE, "no kprobe events (CONFIG_KPROBE_EVENTS)")
        if not env.ksym(name):
            raise Unavailable(Reason.NOT_AVAILABLE, f"no symbol {name} in /proc/kallsyms")
        return []

    return req


def raw_tp(name: str) -> Requirement:
    def req(env: KernelEnv) -> list[str]:
        if not env.need_btf().has_raw_tracepoint(name):
            raise Unavailable(Reason.NO_TRACEPOINT, f"no raw tracepoint {name}")
        return []

    return req


def tp(category: str, event: str) -> Requirement:
    def req(env: KernelEnv) -> list[str]:
        if env.tracefs is None:
            raise Unavailable(Reason.NO_TRACEPOINT, f"no tracefs ({env.tracefs_note})")
        if not tracepoint_exists(env.tracefs, category, event):
            raise Unavailable(Reason.NO_TRACEPOINT, f"no tracepoint {category}:{event}")
        return []

    return req


def offsets(**defs: tuple[str, str]) -> Requirement:
    """``RH_OFF_X=("struct", "member")`` -> ``-DRH_OFF_X=<byte offset from BTF>``."""

    def req(env: KernelEnv) -> list[str]:
        b = env.need_btf()
        out = []
        for name, (st, member) in defs.items():
            try:
                out.append(f"-D{name}={b.member_offset(st, member)}")
            except BTFError as e:
                raise Unavailable(Reason.NO_BTF, str(e)) from e
        return out

    return req


def offset_chain(define: str, *path: tuple[str, str]) -> Requirement:
    """``-D<define>=<sum of the member offsets>`` (a member of an embedded struct)."""

    def req(env: KernelEnv) -> list[str]:
        b = env.need_btf()
        try:
            return [f"-D{define}={sum(b.member_offset(st, m) for st, m in path)}"]
        except BTFError as e:
            raise Unavailable(Reason.NO_BTF, str(e)) from e

    return req


def compose(*reqs: Requirement) -> Requirement:
    def req(env: KernelEnv) -> list[str]:
        return [f for r in reqs for f in r(env)]

    return req


def optional(req: Requirement, otherwise: Sequence[str]) -> Requirement:
    """Use ``req``'s flags when it can be met, else ``otherwise`` (a feature the hook can lack)."""

    def opt(env: KernelEnv) -> list[str]:
        try:
            return req(env)
        except Unavailable:
            return list(otherwise)

    return opt


def enum_value(define: str, enum: str, value: str) -> Requirement:
    def req(env: KernelEnv) -> list[str]:
        try:
            return [f"-D{define}={env.need_btf().enum_value(enum, value)}"]
        except BTFError as e:
            raise Unavailable(Reason.NO_BTF, str(e)) from e

    return req


def tp_field_flag(category: str, event: str, fld: str, define: str) -> Requirement:
    """Optional: ``-D<define>`` when the tracepoint has field ``fld`` (never raises)."""

    def req(env: KernelEnv) -> list[str]:
        return [f"-D{define}"] if fld in env.tp_fields(category, event) else []

    return req


def raw_tp_nargs_flag(name: str, nargs: int, define: str) -> Requirement:
    """Optional: ``-D<define>`` when the raw tracepoint has at least ``nargs`` arguments."""

    def req(env: KernelEnv) -> list[str]:
        n = env.btf.raw_tracepoint_nargs(name) if env.btf else None
        return [f"-D{define}"] if n is not None and n >= nargs else []

    return req


@dataclass(frozen=True, slots=True)
class Variant:
    mechanism: str  # fentry | kprobe | raw_tp | tp
    target: str  # attach point(s), for reports: "netif_carrier_off+on", "qdisc:qdisc_reset"
    define: str
    requires: tuple[Requirement, ...] = ()

    def prepare(self, env: KernelEnv) -> list[str]:
        flags = [f"-D{self.define}"]
        for r in self.requires:
            flags += r(env)
        return flags

    @property
    def label(self) -> str:
        return f"{self.mechanism}:{self.target}"


@dataclass(frozen=True, slots=True)
class Hook:
    name: str
    variants: tuple[Variant, ...]


@dataclass(frozen=True, slots=True)
class ProbeSpec:
    source: str
    file: str  # file name under bpf/
    hooks: tuple[Hook, ...]
    cflags: tuple[str, ...] = ()
    preludes: tuple[str, ...] = ()  # files under bpf/ put in front of it (sources/compose.py)


@dataclass(frozen=True, slots=True)
class Candidate:
    index: int  # global, unique within one plan
    hook: int
    variant: int
    cflags: tuple[str, ...]


@dataclass(slots=True)
class Plan:
    """Per hook: the candidates worth compiling, and the notes on variants ruled out up front."""

    candidates: list[list[Candidate]]
    notes: list[list[tuple[Variant, Reason, str]]]


def plan(spec: ProbeSpec, env: KernelEnv, allow: frozenset[str] | None = None) -> Plan:
    """Candidates per hook; ``allow`` restricts the mechanisms tried (tests, operator choice)."""
    cands: list[list[Candidate]] = []
    notes: list[list[tuple[Variant, Reason, str]]] = []
    idx = 0
    for hi, hook in enumerate(spec.hooks):
        hc: list[Candidate] = []
        hn: list[tuple[Variant, Reason, str]] = []
        for vi, v in enumerate(hook.variants):
            if allow is not None and v.mechanism not in allow:
                hn.append((v, Reason.NOT_AVAILABLE, "disabled by configuration"))
                continue
            try:
                flags = v.prepare(env)
            except Unavailable as e:
                hn.append((v, e.reason, e.detail))
                continue
            hc.append(Candidate(idx, hi, vi, tuple(flags)))
            idx += 1
        cands.append(hc)
        notes.append(hn)
    return Plan(cands, notes)


@dataclass(slots=True)
class TrialOutcome:
    """What the trial child reported: per candidate index (ok, error text); the combined load."""

    results: dict[int, tuple[bool, str]] = field(default_factory=dict)
    combined_ok: bool = False
    combined_err: str = ""


def classify(mechanism: str, err: str) -> Reason:
    low = err.lower()
    if "kernel headers" in low:
        return Reason.NO_HEADERS
    if mechanism == "fentry" and ("operation not permitted" in low or "eperm" in low):
        return Reason.FENTRY_REFUSED
    if "operation not permitted" in low or "permission denied" in low:
        return Reason.NO_PRIVILEGE
    return Reason.LOAD_FAILED


def _short(err: str, limit: int = 160) -> str:
    err = " ".join(err.split())
    return err if len(err) <= limit else err[: limit - 3] + "..."


def resolve(
    spec: ProbeSpec, p: Plan, outcome: TrialOutcome
) -> tuple[list[Capability], list[str], list[Variant | None]]:
    """Capability records, the cflags of the chosen variants, and the chosen variant per hook."""
    caps: list[Capability] = []
    flags: list[str] = []
    chosen: list[Variant | None] = []
    for hi, hook in enumerate(spec.hooks):
        tried: list[str] = [f"{v.mechanism}: {r.value} ({d})" for v, r, d in p.notes[hi]]
        last: tuple[Reason, str] | None = None
        if p.notes[hi]:
            _v, r0, d0 = p.notes[hi][-1]
            last = (r0, d0)
        win: Candidate | None = None
        for c in p.candidates[hi]:
            ok, err = outcome.results.get(c.index, (False, "not tried"))
            v = hook.variants[c.variant]
            if ok:
                win = c
                break
            reason = classify(v.mechanism, err)
            tried.append(f"{v.mechanism}: {reason.value} ({_short(err, 120)})")
            last = (reason, _short(err))
        ordered = sorted(
            tried, key=lambda s: [v.mechanism for v in hook.variants].index(s.split(":")[0])
        )
        if win is not None and outcome.combined_ok:
            v = hook.variants[win.variant]
            caps.append(attached(spec.source, hook.name, v.label, "; ".join(ordered)))
            flags += list(win.cflags)
            chosen.append(v)
        elif win is not None:
            caps.append(
                skipped(spec.source, hook.name, Reason.LOAD_FAILED, _short(outcome.combined_err))
            )
            chosen.append(None)
        else:
            reason, _detail = last or (Reason.NOT_AVAILABLE, "no variant")
            caps.append(skipped(spec.source, hook.name, reason, "; ".join(ordered)))
            chosen.append(None)
    return caps, flags, chosen


def pending(p: Plan, outcome: TrialOutcome) -> tuple[list[list[Candidate]], list[Candidate]]:
    """Candidates still to try per hook (hooks without a winner yet), and the winners so far."""
    todo: list[list[Candidate]] = []
    winners: list[Candidate] = []
    for hc in p.candidates:
        won = next((c for c in hc if outcome.results.get(c.index, (False, ""))[0]), None)
        if won is not None:
            winners.append(won)
            continue
        rest = [c for c in hc if c.index not in outcome.results]
        if rest:
            todo.append(rest)
    return todo, winners


def all_skipped(spec: ProbeSpec, reason: Reason, detail: str) -> list[Capability]:
    return [skipped(spec.source, h.name, reason, detail) for h in spec.hooks]


def hook_names(spec: ProbeSpec) -> Sequence[str]:
    return [h.name for h in spec.hooks]


def awaiting(caps: Sequence[Capability]) -> frozenset[str]:
    """Hooks skipped because their tracepoint was absent: a module loaded later (``rdma_cm``)
    adds the tracepoint. A hook skipped for any other reason, or whose late load failed, is
    not waited for."""
    return frozenset(c.hook for c in caps if not c.attached and c.reason is Reason.NO_TRACEPOINT)


def late_spec(
    spec: ProbeSpec, caps: Sequence[Capability], env: KernelEnv, allow: frozenset[str] | None
) -> ProbeSpec | None:
    """The hooks of ``spec`` that were skipped for a missing tracepoint (:func:`awaiting`) and
    have a candidate on the kernel now, as a spec of their own; None when none has."""
    wanted = awaiting(caps)
    sub = replace(spec, hooks=tuple(h for h in spec.hooks if h.name in wanted))
    if not sub.hooks:
        return None
    p = plan(sub, env, allow)
    ready = tuple(h for h, hc in zip(sub.hooks, p.candidates, strict=True) if hc)
    return replace(spec, hooks=ready) if ready else None


def merge_caps(caps: Sequence[Capability], late: Sequence[Capability]) -> list[Capability]:
    """``caps`` with each hook's record replaced by its record in ``late``, order kept."""
    by_hook = {c.hook: c for c in late}
    return [by_hook.get(c.hook, c) for c in caps]
