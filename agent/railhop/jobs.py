"""Which job a plugin process belongs to, from its cgroup path: pid -> ``/proc/PID/cgroup`` ->
Kubernetes pod UID, QoS class and container id, or a Slurm job id.

Only what the cgroup path shows: the kubelet names a pod's cgroup after its UID and QoS class,
the container runtime names the container's after its id (both the systemd and the cgroupfs
cgroup drivers, cgroup v1 and v2), and slurmstepd puts a job's tasks under ``job_NNN``. Pod
names and namespaces are not in the path (the kubelet's API would be needed): the pod UID joins
``kube_pod_info{uid=...}`` of kube-state-metrics for them.

:func:`parse_cgroup_file` and :func:`parse_cgroup_path` are pure; :func:`job_of` reads
``ROOT/proc/PID/cgroup`` (a missing or unreadable file gives an empty :class:`JobRef`, never an
error). :class:`JobCache` remembers the job of the processes that sent lane events, so a span
that ends after its process exited is still attributed.
"""

from __future__ import annotations

import re
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from railhop.tracing import SpanDesc

QOS_CLASSES = ("guaranteed", "burstable", "besteffort")

# a pod's cgroup: cgroupfs "pod<uid>", systemd "kubepods[-qos]-pod<uid_with_underscores>.slice"
_POD = re.compile(
    r"(?:^|/)(?:kubepods(?:-(?P<sqos>burstable|besteffort))?-pod(?P<suid>[0-9a-f_]{36})\.slice"
    r"|pod(?P<cuid>[0-9a-f-]{36}))(?:/|$)"
)
_CGROUPFS_QOS = re.compile(r"(?:^|/)kubepods/(?P<qos>burstable|besteffort)/pod")
# a container's: systemd "<runtime>-<64 hex>.scope", cgroupfs "<64 hex>" under the pod
_CONTAINER = re.compile(
    r"(?:^|/)(?:(?:cri-containerd|crio|docker|containerd)-)?(?P<id>[0-9a-f]{64})(?:\.scope)?(?:/|$)"
)
_SLURM_JOB = re.compile(r"(?:^|/)job_(?P<job>\d+)(?:/|$)")


@dataclass(frozen=True)
class JobRef:
    """What a process's cgroup path says about its job (None: not shown)."""

    pod_uid: str | None = None
    qos_class: str | None = None  # guaranteed | burstable | besteffort (pods only)
    container_id: str | None = None
    slurm_job_id: str | None = None

    @property
    def known(self) -> bool:
        return self.pod_uid is not None or self.slurm_job_id is not None

    def span_attributes(self) -> dict[str, str]:
        """OpenTelemetry attributes: ``k8s.pod.uid``, ``container.id`` (semantic
        conventions), ``railhop.k8s.qos_class``, ``railhop.slurm.job_id``."""
        out: dict[str, str] = {}
        if self.pod_uid is not None:
            out["k8s.pod.uid"] = self.pod_uid
        if self.qos_class is not None:
            out["railhop.k8s.qos_class"] = self.qos_class
        if self.container_id is not None:
            out["container.id"] = self.container_id
        if self.slurm_job_id is not None:
            out["railhop.slurm.job_id"] = self.slurm_job_id
        return out


def parse_cgroup_path(path: str) -> JobRef:
    """Pure: the job a cgroup path names (``/kubepods.slice/kubepods-burstable.slice/
    kubepods-burstable-pod<uid>.slice/cri-containerd-<id>.scope``, ``/kubepods/besteffort/
    pod<uid>/<id>``, ``/system.slice/slurmstepd.scope/job_42/step_0/...``, ...)."""
    pod = _POD.search(path)
    pod_uid = qos = container = None
    if pod is not None and "kubepods" in path:
        if pod.group("suid"):
            pod_uid = pod.group("suid").replace("_", "-")
            qos = pod.group("sqos") or "guaranteed"
        else:
            pod_uid = pod.group("cuid")
            m = _CGROUPFS_QOS.search(path)
            qos = m.group("qos") if m else "guaranteed"
        c = _CONTAINER.search(path, pod.end() - 1)
        container = c.group("id") if c else None
    job = _SLURM_JOB.search(path)
    return JobRef(
        pod_uid=pod_uid,
        qos_class=qos,
        container_id=container,
        slurm_job_id=job.group("job") if job else None,
    )


def parse_cgroup_file(text: str) -> JobRef:
    """Pure: the job of a ``/proc/PID/cgroup`` file. cgroup v2 has one line ``0::PATH``; v1 one
    line per hierarchy (``N:controllers:PATH``), which all name the same job, so the first
    line whose path names one wins (v2's line first when both are mounted)."""
    paths: list[str] = []
    for line in text.splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        if parts[0] == "0" and parts[1] == "":
            paths.insert(0, parts[2])
        else:
            paths.append(parts[2])
    for p in paths:
        ref = parse_cgroup_path(p)
        if ref.known:
            return ref
    return JobRef()


def job_of(pid: int, root: Path = Path("/")) -> JobRef:
    """The job of process ``pid`` from ``ROOT/proc/PID/cgroup``; empty when unreadable."""
    try:
        text = (root / "proc" / str(pid) / "cgroup").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return JobRef()
    return parse_cgroup_file(text)


class JobCache:
    """The jobs of recently seen pids (at most ``size``, least recently seen dropped)."""

    def __init__(self, root: Path = Path("/"), size: int = 4096) -> None:
        self.root = root
        self.size = size
        self._jobs: OrderedDict[int, JobRef] = OrderedDict()

    def remember(self, pid: int) -> JobRef:
        """Look ``pid`` up (once: a process does not change pods) and keep it."""
        ref = self._jobs.get(pid)
        if ref is None:
            ref = job_of(pid, self.root)
            self._jobs[pid] = ref
            while len(self._jobs) > self.size:
                self._jobs.popitem(last=False)
        else:
            self._jobs.move_to_end(pid)
        return ref

    def get(self, pid: int) -> JobRef | None:
        return self._jobs.get(pid)

    def forget(self, pid: int) -> None:
        self._jobs.pop(pid, None)

    def enrich(self, spans: Sequence[SpanDesc]) -> list[SpanDesc]:
        """The spans, those of a remembered process (``process.pid``) with its job's
        attributes added."""
        return enrich_spans(spans, self.get)


def enrich_spans(
    spans: Sequence[SpanDesc], lookup: Callable[[int], JobRef | None]
) -> list[SpanDesc]:
    """Pure: add ``lookup(pid).span_attributes()`` to every span with a ``process.pid``."""
    out: list[SpanDesc] = []
    for s in spans:
        pid = s.attributes.get("process.pid")
        ref = lookup(pid) if isinstance(pid, int) else None
        if ref is None or not ref.known:
            out.append(s)
            continue
        out.append(replace(s, attributes={**s.attributes, **ref.span_attributes()}))
    return out
