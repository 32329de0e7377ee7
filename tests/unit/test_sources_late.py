"""Hooks loaded after start: which hooks wait for their tracepoint, when one can be tried, and
the watcher that loads them as a source of their own (fake sources: no kernel needed)."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from railhop.sources import hooks as H
from railhop.sources.base import Capability, Emit, Reason, attached, skipped
from railhop.sources.btf import Btf
from railhop.sources.ebpf.late import LateHooks
from railhop.sources.ebpf.rdma import RDMA_DRV, RdmaDriverSource
from railhop.sources.ebpf.source import EbpfSource
from railhop.sources.events import Event

DEVLINK = "devlink/devlink_health_report"
MLX5 = "mlx5/mlx5_cmd"
CM_EVENT = "rdma_cma/cm_event_handler"
CM_REMOVE = "rdma_cma/cm_remove_one"


def kernel(tmp_path: Path, *tps: str) -> H.KernelEnv:
    """A kernel without BTF whose tracefs has ``tps`` (more can be added later)."""
    tracefs = tmp_path / "tracing"
    (tracefs / "events").mkdir(parents=True, exist_ok=True)
    for t in tps:
        add_tp(tmp_path, t)
    return H.KernelEnv(Btf([], {}), "", str(tracefs), "")


def add_tp(tmp_path: Path, tp: str) -> None:
    (tmp_path / "tracing" / "events" / tp).mkdir(parents=True, exist_ok=True)


def started(env: H.KernelEnv) -> list[Capability]:
    """The records of RDMA_DRV started on ``env``, every candidate loading."""
    p = H.plan(RDMA_DRV, env)
    ok = H.TrialOutcome({c.index: (True, "") for hc in p.candidates for c in hc}, True, "")
    return H.resolve(RDMA_DRV, p, ok)[0]


def by_hook(caps: list[Capability]) -> dict[str, tuple[bool, Reason]]:
    return {c.hook: (c.attached, c.reason) for c in caps}


def test_only_hooks_without_their_tracepoint_wait(tmp_path: Path) -> None:
    caps = started(kernel(tmp_path, DEVLINK, MLX5))
    assert by_hook(caps) == {
        "ib_event": (False, Reason.NOT_AVAILABLE),  # no BTF function: not a module's tracepoint
        "devlink_health": (True, Reason.NONE),
        "cm_event": (False, Reason.NO_TRACEPOINT),
        "cm_remove": (False, Reason.NO_TRACEPOINT),
        "mlx5_cmd": (True, Reason.NONE),
    }
    assert H.awaiting(caps) == {"cm_event", "cm_remove"}
    failed = [skipped("ebpf.rdma", "cm_event", Reason.LOAD_FAILED, "verifier")]
    assert H.awaiting(failed) == frozenset()


def test_late_spec_holds_the_hooks_whose_tracepoint_appeared(tmp_path: Path) -> None:
    env = kernel(tmp_path, DEVLINK, MLX5)
    caps = started(env)
    assert H.late_spec(RDMA_DRV, caps, env, None) is None
    add_tp(tmp_path, CM_EVENT)  # rdma_cm loaded: its tracepoints appear
    late = H.late_spec(RDMA_DRV, caps, env, None)
    assert late is not None
    assert [h.name for h in late.hooks] == ["cm_event"]
    assert (late.source, late.file, late.preludes) == (
        RDMA_DRV.source,
        RDMA_DRV.file,
        RDMA_DRV.preludes,
    )
    add_tp(tmp_path, CM_REMOVE)
    late = H.late_spec(RDMA_DRV, caps, env, None)
    assert late is not None and [h.name for h in late.hooks] == ["cm_event", "cm_remove"]
    assert H.late_spec(RDMA_DRV, caps, env, frozenset({"fentry"})) is None  # tp not allowed


def test_merge_caps_replaces_by_hook_in_order() -> None:
    caps = [
        attached("s", "a", "tp:x"),
        skipped("s", "b", Reason.NO_TRACEPOINT),
        skipped("s", "c", Reason.NO_TRACEPOINT),
    ]
    late = [attached("s", "c", "tp:z")]
    assert H.merge_caps(caps, late) == [caps[0], caps[1], late[0]]


class FakeLate(EbpfSource):
    """A late source that 'loads' whatever its spec holds, or fails each hook."""

    def __init__(self, spec: H.ProbeSpec, fail: bool = False) -> None:
        super().__init__(spec)
        self.fail = fail
        self.emit: Emit | None = None
        self.stopped = False
        self.on_start: list[Callable[[], None]] = []

    def start_sync(self, emit: Emit) -> list[Capability]:
        self.emit = emit
        for f in self.on_start:
            f()
        if self.fail:
            return H.all_skipped(self.spec, Reason.LOAD_FAILED, "verifier said no")
        return [attached(self.spec.source, h.name, h.variants[-1].label) for h in self.spec.hooks]

    def stop_sync(self, timeout_s: float = 2.0) -> None:
        self.stopped = True


def owner(tmp_path: Path, env: H.KernelEnv) -> RdmaDriverSource:
    src = RdmaDriverSource(root=str(tmp_path))
    src.capabilities = started(env)
    return src


def test_check_once_loads_a_late_hook_once(tmp_path: Path) -> None:
    env = kernel(tmp_path, DEVLINK)
    src = owner(tmp_path, env)
    made: list[FakeLate] = []

    def make(spec: H.ProbeSpec) -> EbpfSource:
        made.append(FakeLate(spec))
        return made[-1]

    got: list[Event] = []
    late = LateHooks(src, make, env=lambda: env)
    late._emit = got.append  # what start() stores
    assert late.check_once() == [] and made == []
    add_tp(tmp_path, CM_EVENT)
    caps = late.check_once()
    assert [(c.hook, c.attached) for c in caps] == [("cm_event", True)]
    assert by_hook(src.capabilities)["cm_event"] == (True, Reason.NONE)
    assert by_hook(src.capabilities)["cm_remove"] == (False, Reason.NO_TRACEPOINT)
    assert [s.spec.hooks[0].name for s in made] == ["cm_event"]
    assert made[0].emit == got.append  # the owner's emit
    assert late.check_once() == [] and len(made) == 1  # loaded once, never again
    late.stop()
    assert made[0].stopped and late.sources == []


def test_a_failed_late_load_is_reported_and_not_retried(tmp_path: Path) -> None:
    env = kernel(tmp_path, DEVLINK)
    src = owner(tmp_path, env)
    add_tp(tmp_path, CM_EVENT)
    made: list[FakeLate] = []

    def make(spec: H.ProbeSpec) -> EbpfSource:
        made.append(FakeLate(spec, fail=True))
        return made[-1]

    late = LateHooks(src, make, env=lambda: env)
    late._emit = lambda _e: None
    assert [(c.hook, c.reason) for c in late.check_once()] == [("cm_event", Reason.LOAD_FAILED)]
    assert by_hook(src.capabilities)["cm_event"] == (False, Reason.LOAD_FAILED)
    assert late.check_once() == [] and len(made) == 1


def test_a_stop_during_a_late_start_undoes_it(tmp_path: Path) -> None:
    env = kernel(tmp_path, DEVLINK)
    src = owner(tmp_path, env)
    add_tp(tmp_path, CM_EVENT)
    made: list[FakeLate] = []

    def make(spec: H.ProbeSpec) -> EbpfSource:
        f = FakeLate(spec)
        f.on_start.append(late.stop)  # the agent stops while the trial child runs
        made.append(f)
        return f

    late = LateHooks(src, make, env=lambda: env)
    late._emit = lambda _e: None
    assert late.check_once() == []
    assert made[0].stopped and late.sources == []
    assert by_hook(src.capabilities)["cm_event"] == (False, Reason.NO_TRACEPOINT)


def test_the_watcher_thread_loads_a_hook_that_appears(tmp_path: Path) -> None:
    env = kernel(tmp_path, DEVLINK, MLX5)
    src = owner(tmp_path, env)
    made: list[FakeLate] = []

    def make(spec: H.ProbeSpec) -> EbpfSource:
        made.append(FakeLate(spec))
        return made[-1]

    late = LateHooks(src, make, env=lambda: env, interval_s=0.01)
    late.start(lambda _e: None, None)
    assert late._thread is not None
    add_tp(tmp_path, CM_EVENT)
    add_tp(tmp_path, CM_REMOVE)
    deadline = time.monotonic() + 10
    while H.awaiting(src.capabilities) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert H.awaiting(src.capabilities) == frozenset()
    thread = late._thread
    thread.join(5)  # nothing waits any more: the watcher ends by itself
    assert not thread.is_alive()
    assert sorted(h.name for s in made for h in s.spec.hooks) == ["cm_event", "cm_remove"]
    late.stop()
    assert all(s.stopped for s in made)


def test_no_watcher_when_no_hook_waits(tmp_path: Path) -> None:
    (tmp_path / "proc/self").mkdir(parents=True)
    (tmp_path / "proc/self/status").write_text("Name:\tx\nCapEff:\t0000000000000000\n")
    src = RdmaDriverSource(root=str(tmp_path))
    caps = src.start_sync(lambda _e: None)
    assert {c.reason for c in caps} == {Reason.NO_PRIVILEGE}
    assert src.late._thread is None
    src.stop_sync()


def test_a_late_attach_tells_the_owners_watchers(tmp_path: Path) -> None:
    """Issue 26: the agent's railhop_sources gauge was set once at start, so a hook that
    attached later never flipped it; the owner now tells its watchers."""
    env = kernel(tmp_path)  # nothing attaches at start: every hook skipped or waiting
    src = owner(tmp_path, env)
    seen: list[list[Capability]] = []
    now = src.watch_capabilities(seen.append)
    assert not any(c.attached for c in now)
    late = LateHooks(src, FakeLate, env=lambda: env)
    late._emit = lambda _e: None
    assert late.check_once() == [] and seen == []  # no change, no call
    add_tp(tmp_path, CM_REMOVE)
    late.check_once()
    assert len(seen) == 1
    assert by_hook(seen[0])["cm_remove"] == (True, Reason.NONE)
    assert seen[0] == src.capabilities  # every record, not only the late ones


def test_a_failing_watcher_does_not_stop_the_late_load(tmp_path: Path) -> None:
    env = kernel(tmp_path)
    src = owner(tmp_path, env)
    seen: list[list[Capability]] = []

    def broken(_caps: list[Capability]) -> None:
        raise RuntimeError("loop closed")

    src.watch_capabilities(broken)
    src.watch_capabilities(seen.append)
    late = LateHooks(src, FakeLate, env=lambda: env)
    late._emit = lambda _e: None
    add_tp(tmp_path, CM_EVENT)
    assert [c.hook for c in late.check_once()] == ["cm_event"]
    assert len(seen) == 1 and by_hook(src.capabilities)["cm_event"] == (True, Reason.NONE)
