"""railhop.jobs: pid -> cgroup -> pod UID / QoS class / container id / Slurm job id, the systemd and
cgroupfs cgroup drivers, cgroup v1 and v2; the span attributes and the bounded job metric."""

from __future__ import annotations

from pathlib import Path

import pytest

from railhop.jobs import JobCache, JobRef, enrich_spans, job_of, parse_cgroup_file
from railhop.metrics import AgentMetrics
from railhop.tracing import MIGRATION, SpanDesc

UID = "6f1f6c1e-7c1b-4d0e-9a57-3c1d2a0b9e11"
CID = "3b2f" + "a" * 60

# /proc/PID/cgroup of a training container, as each kubelet cgroup driver / cgroup version
# writes it (cgroup v1 has a line per hierarchy, all naming the same cgroup)
V2_SYSTEMD_BURSTABLE = (
    "0::/kubepods.slice/kubepods-burstable.slice/"
    f"kubepods-burstable-pod{UID.replace('-', '_')}.slice/cri-containerd-{CID}.scope\n"
)
V2_SYSTEMD_GUARANTEED = (
    f"0::/kubepods.slice/kubepods-pod{UID.replace('-', '_')}.slice/crio-{CID}.scope\n"
)
V2_CGROUPFS_BESTEFFORT = f"0::/kubepods/besteffort/pod{UID}/{CID}\n"
# seen from an agent in its own cgroup namespace: relative to the agent's cgroup
V2_FROM_ANOTHER_NS = (
    "0::/../../kubepods-besteffort.slice/"
    f"kubepods-besteffort-pod{UID.replace('-', '_')}.slice/cri-containerd-{CID}.scope\n"
)
V1_CGROUPFS_GUARANTEED = "".join(
    f"{i}:{c}:/kubepods/pod{UID}/{CID}\n"
    for i, c in ((12, "pids"), (11, "memory"), (3, "cpu,cpuacct"), (1, "name=systemd"))
)
V1_SYSTEMD_BURSTABLE = "".join(
    f"{i}:{c}:/kubepods.slice/kubepods-burstable.slice/"
    f"kubepods-burstable-pod{UID.replace('-', '_')}.slice/docker-{CID}.scope\n"
    for i, c in ((11, "memory"), (4, "devices"), (1, "name=systemd"))
)
V2_SLURM = "0::/system.slice/slurmstepd.scope/job_4242/step_0/user/task_0\n"
V1_SLURM = "".join(
    f"{i}:{c}:/slurm/uid_1000/job_77/step_batch/task_0\n"
    for i, c in ((7, "freezer"), (4, "cpuset"), (2, "memory"))
)
HYBRID_SLURM = "1:name=systemd:/user.slice\n0::/slurm/uid_1000/job_9/step_0/user/task_0\n"
PLAIN = "0::/user.slice/user-1000.slice/session-3.scope\n"


@pytest.mark.parametrize(
    ("text", "want"),
    [
        (V2_SYSTEMD_BURSTABLE, JobRef(UID, "burstable", CID)),
        (V2_SYSTEMD_GUARANTEED, JobRef(UID, "guaranteed", CID)),
        (V2_CGROUPFS_BESTEFFORT, JobRef(UID, "besteffort", CID)),
        (V2_FROM_ANOTHER_NS, JobRef(UID, "besteffort", CID)),
        (V1_CGROUPFS_GUARANTEED, JobRef(UID, "guaranteed", CID)),
        (V1_SYSTEMD_BURSTABLE, JobRef(UID, "burstable", CID)),
        (V2_SLURM, JobRef(slurm_job_id="4242")),
        (V1_SLURM, JobRef(slurm_job_id="77")),
        (HYBRID_SLURM, JobRef(slurm_job_id="9")),
        (PLAIN, JobRef()),
        ("", JobRef()),
        ("garbage\n0::\n", JobRef()),
        # a pod's own cgroup (no container level): the pod, no container id
        (f"0::/kubepods/burstable/pod{UID}\n", JobRef(UID, "burstable", None)),
        # not under kubepods: a path that merely contains "pod" names no pod
        (f"0::/system.slice/pod{UID}\n", JobRef()),
    ],
    ids=lambda v: v[:40] if isinstance(v, str) else None,
)
def test_parse_cgroup_file(text: str, want: JobRef) -> None:
    assert parse_cgroup_file(text) == want


def test_job_of_reads_under_root(tmp_path: Path) -> None:
    d = tmp_path / "proc" / "123"
    d.mkdir(parents=True)
    (d / "cgroup").write_text(V2_SYSTEMD_BURSTABLE)
    assert job_of(123, tmp_path) == JobRef(UID, "burstable", CID)
    assert job_of(124, tmp_path) == JobRef()  # gone: nothing, no error
    cache = JobCache(tmp_path, size=2)
    assert cache.remember(123).pod_uid == UID
    (d / "cgroup").unlink()  # the process exited: its job is still known
    assert cache.get(123) == JobRef(UID, "burstable", CID)
    cache.remember(124)
    cache.remember(125)  # size 2: 123, the least recently seen, is dropped
    assert cache.get(123) is None


def span(pid: int | None, nic: str = "nic1", outcome: str = "resumed") -> SpanDesc:
    attrs: dict[str, object] = {
        "network.interface.name": nic,
        "railhop.migration.outcome": outcome,
    }
    if pid is not None:
        attrs["process.pid"] = pid
    return SpanDesc(MIGRATION, 1, 2, None, 0, 1_000_000, attrs)  # type: ignore[arg-type]


def test_enrich_spans_adds_the_job() -> None:
    jobs = {7: JobRef(UID, "burstable", CID), 8: JobRef(slurm_job_id="42"), 9: JobRef()}
    out = enrich_spans([span(7), span(8), span(9), span(None)], jobs.get)
    assert out[0].attributes["k8s.pod.uid"] == UID
    assert out[0].attributes["container.id"] == CID
    assert out[0].attributes["railhop.k8s.qos_class"] == "burstable"
    assert out[1].attributes["railhop.slurm.job_id"] == "42"
    assert "k8s.pod.uid" not in out[1].attributes
    assert out[2] == span(9) and out[3] == span(None)  # unknown job / no pid: unchanged


def _job_series(m: AgentMetrics) -> dict[tuple[str, ...], float]:
    out: dict[tuple[str, ...], float] = {}
    for fam in m.registry.collect():
        if fam.name == "railhop_job_failovers":
            for smp in fam.samples:
                if smp.name.endswith("_total"):
                    lab = smp.labels
                    key = (
                        lab["device"],
                        lab["k8s_pod_uid"],
                        lab["k8s_qos_class"],
                        lab["slurm_job_id"],
                    )
                    out[key] = smp.value
    return out


def test_job_failovers_metric_is_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(AgentMetrics, "MAX_JOBS", 3)
    m = AgentMetrics()
    jobs = {p: JobRef(f"uid-{p}", "guaranteed", CID) for p in range(10)}
    jobs[99] = JobRef(slurm_job_id="5")
    m.observe_spans(enrich_spans([span(1), span(1, "nic2"), span(99), span(50)], jobs.get))
    assert _job_series(m) == {
        ("nic1", "uid-1", "guaranteed", ""): 1.0,
        ("nic2", "uid-1", "guaranteed", ""): 1.0,
        ("nic1", "", "", "5"): 1.0,
    }  # pid 50 has no job: only the node-level metrics count it
    m.observe_spans(enrich_spans([span(2), span(1)], jobs.get))  # 3 jobs: 99 now oldest
    m.observe_spans(enrich_spans([span(3)], jobs.get))  # a 4th job: 99's series go
    series = _job_series(m)
    assert {k[1] or k[3] for k in series} == {"uid-1", "uid-2", "uid-3"}
    assert series[("nic1", "uid-1", "guaranteed", "")] == 2.0


def test_the_tracer_enriches_before_observers_and_sinks() -> None:
    from railhop.tracing import FailoverTracer

    seen: list[SpanDesc] = []

    class Sink:
        def emit(self, spans: list[SpanDesc]) -> None:
            seen.extend(spans)

    jobs = {7: JobRef(UID, "burstable", CID)}
    observed: list[SpanDesc] = []
    tracer = FailoverTracer(
        [Sink()], offset_ns=0, host="h", enrich=lambda s: enrich_spans(s, jobs.get)
    )
    tracer.observers.append(observed.extend)
    tracer._do(lambda: [span(7)])
    assert observed[0].attributes["k8s.pod.uid"] == UID and seen == observed
