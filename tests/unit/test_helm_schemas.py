"""The chart on real clusters (issue 39, item 4): every rendered object, with every optional
feature on and with the defaults, validated offline against the Kubernetes schemas of the
oldest version ``Chart.yaml`` claims (1.25) and of the newest that ``kubernetes-validate``
ships (strict: an unknown field is an error), and ``helm lint --strict`` for both; AppArmor by
the pod annotation below 1.30 and by the container's field from 1.30 (the field does not exist
below); the kernel headers' hostPath optional; the tolerations that keep the agent on a
degraded node; the PodMonitor; the plain manifests against the same schemas."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from test_helm import CHART, PLAIN, _run, lint, render

from conftest import require

Obj = dict[str, Any]

OLDEST = "1.25.0"  # Chart.yaml's kubeVersion floor
APPARMOR_ANNOTATION = "container.apparmor.security.beta.kubernetes.io/agent"
# the Prometheus Operator's kinds: CRDs, not in the core schemas; validated by shape below
CRD_KINDS = {"ServiceMonitor", "PodMonitor", "PrometheusRule"}
# every optional object on (each a values switch that is off by default)
ALL_ON = (
    "serviceMonitor.enabled=true",
    "podMonitor.enabled=true",
    "prometheusRule.enabled=true",
    "grafanaDashboard.enabled=true",
    "nodeProblemDetector.enabled=true",
    "agent.ownerUid=1000",
    "agent.socketGroup=railhop",
    "agent.usdtLib=/opt/railhop/lib/libnccl-net-railhop.so",
    "extraEnv[0].name=FOO",
    "extraEnv[0].value=bar",
    "extraVolumes[0].name=extra",
    "extraVolumes[0].emptyDir.medium=Memory",
    "extraVolumeMounts[0].name=extra",
    "extraVolumeMounts[0].mountPath=/extra",
    "podAnnotations.example\\.com/team=ml",
    "policyPools[0].name=h100",
    "policyPools[0].nodeLabel.key=example.com/pool",
    "policyPools[0].nodeLabel.values[0]=h100",
    "policyPools[0].policy=version: 1",
)


def _kv() -> Any:
    try:
        import kubernetes_validate as kv
    except ImportError:
        kv = None
    require(kv is not None, "no kubernetes_validate: `make setup` installs the dev extras")
    return kv


def newest() -> str:
    """The newest Kubernetes version whose schemas kubernetes-validate ships (offline)."""
    v = str(_kv().latest_version())
    assert tuple(int(x) for x in v.split(".")[:2]) >= (1, 33), v
    return v


def _versions() -> list[str]:
    return [OLDEST, "newest"]


def _resolve(version: str) -> str:
    return newest() if version == "newest" else version


def _validate_all(docs: list[Obj], version: str) -> set[str]:
    """Validate every object of a core kind; return the kinds skipped (CRDs only)."""
    kv = _kv()
    skipped = set()
    for d in docs:
        if d["kind"] in CRD_KINDS:
            assert d["apiVersion"] == "monitoring.coreos.com/v1", d["kind"]
            skipped.add(d["kind"])
            continue
        try:
            kv.validate(d, version, strict=True)
        except kv.ValidationError as e:
            raise AssertionError(
                f"{d['kind']} {d['metadata']['name']} fails the {version} schema: {e}"
            ) from e
    return skipped


def _daemonsets(docs: list[Obj]) -> list[Obj]:
    return [d for d in docs if d["kind"] == "DaemonSet"]


def _agent(ds: Obj) -> Obj:
    (c,) = [c for c in ds["spec"]["template"]["spec"]["containers"] if c["name"] == "agent"]
    assert isinstance(c, dict)
    return c


# --- 7: schemas and lint, oldest and newest ---------------------------------------------------


@pytest.mark.parametrize("version", _versions())
@pytest.mark.parametrize("features", ["defaults", "all on"])
def test_every_rendered_object_passes_the_schemas(version: str, features: str) -> None:
    v = _resolve(version)
    docs = render(*(ALL_ON if features == "all on" else ()), kube=v)
    kinds = sorted(d["kind"] for d in docs)
    if features == "all on":
        assert kinds == sorted(
            ["ConfigMap"] * 4  # policy, the pool's policy, dashboard, NPD
            + ["DaemonSet"] * 2
            + ["PodMonitor", "PrometheusRule", "Service", "ServiceAccount", "ServiceMonitor"]
        ), kinds
    skipped = _validate_all(docs, v)
    # the CRD kinds are the only ones not validated, and only when switched on
    assert skipped == (CRD_KINDS if features == "all on" else set())


@pytest.mark.parametrize("version", _versions())
def test_the_schemas_catch_a_field_the_version_lacks(version: str) -> None:
    """The validator is version-aware: the appArmorProfile field (1.30) fails the 1.25 schema,
    so a chart that rendered it for 1.25 would fail above."""
    kv = _kv()
    v = _resolve(version)
    (ds,) = _daemonsets(render(kube="1.31.0"))
    if version == "newest":
        kv.validate(ds, v, strict=True)
    else:
        with pytest.raises(kv.ValidationError, match="appArmorProfile"):
            kv.validate(ds, v, strict=True)


@pytest.mark.parametrize("version", _versions())
def test_helm_lint_strict_for_both_versions(version: str) -> None:
    v = _resolve(version)
    for sets in ((), ALL_ON):
        lint(*sets, kube=v)


def test_chart_kube_version_is_the_floor_the_schemas_check() -> None:
    """Chart.yaml's kubeVersion is what the oldest schema test covers: below it helm refuses."""
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert chart["kubeVersion"] == f">={OLDEST}-0"
    r = _run("template", "rh", str(CHART), "--kube-version", "1.24.17")
    assert r.returncode != 0 and "kubeVersion" in r.stderr, r.stderr


@pytest.mark.parametrize("version", _versions())
@pytest.mark.parametrize("name", sorted(p.name for p in PLAIN.parent.glob("*.yaml")))
def test_plain_manifests_pass_the_schemas(version: str, name: str) -> None:
    docs = [d for d in yaml.safe_load_all((PLAIN.parent / name).read_text()) if d]
    assert docs
    assert _validate_all(docs, _resolve(version)) == set()


# --- 1: AppArmor ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kube", "by_field"),
    [
        ("1.25.0", False),
        ("1.29.15", False),
        ("v1.29.4-gke.1043002", False),
        ("1.30.0", True),  # the boundary: the field from 1.30.0 on
        ("v1.30.2-eks-1552ad0", True),  # a vendor suffix is a pre-release in semver
        ("1.31.0", True),
    ],
)
def test_apparmor_by_annotation_below_1_30_and_by_field_from_1_30(
    kube: str, by_field: bool
) -> None:
    docs = render("policyPools[0].name=p", "policyPools[0].nodeLabel.key=k",
                  "policyPools[0].nodeLabel.values[0]=v", "policyPools[0].policy=version: 1",
                  kube=kube)  # fmt: skip
    dss = _daemonsets(docs)
    assert len(dss) == 2  # the default DaemonSet and the pool's: the same template
    for ds in dss:
        sc = _agent(ds)["securityContext"]
        annotations = ds["spec"]["template"]["metadata"].get("annotations", {})
        if by_field:
            assert sc["appArmorProfile"] == {"type": "Unconfined"}
            assert not any("apparmor" in k for k in annotations)
        else:
            assert "appArmorProfile" not in sc
            assert annotations == {APPARMOR_ANNOTATION: "unconfined"}
        # the plugin-install initContainer keeps the runtime's default profile
        (init,) = ds["spec"]["template"]["spec"]["initContainers"]
        assert "appArmorProfile" not in init["securityContext"]


@pytest.mark.parametrize(
    ("sets", "annotation", "field"),
    [
        (["appArmorProfile.type=RuntimeDefault"], "runtime/default", {"type": "RuntimeDefault"}),
        (
            ["appArmorProfile.type=Localhost", "appArmorProfile.localhostProfile=railhop-agent"],
            "localhost/railhop-agent",
            {"type": "Localhost", "localhostProfile": "railhop-agent"},
        ),
        (["appArmorProfile=null"], None, None),
    ],
)
def test_apparmor_profile_value(sets: list[str], annotation: str | None, field: Obj | None) -> None:
    (old,) = _daemonsets(render(*sets, kube="1.29.0"))
    (new,) = _daemonsets(render(*sets, kube="1.30.0"))
    assert (
        old["spec"]["template"]["metadata"].get("annotations", {}).get(APPARMOR_ANNOTATION)
        == annotation
    )
    assert _agent(new)["securityContext"].get("appArmorProfile") == field
    assert "annotations" not in new["spec"]["template"]["metadata"]


def test_apparmor_localhost_needs_a_profile_name() -> None:
    r = _run("template", "rh", str(CHART), "--set", "appArmorProfile.type=Localhost")
    assert r.returncode != 0 and "localhostProfile" in r.stderr, r.stderr
    r = _run("template", "rh", str(CHART), "--set", "appArmorProfile.type=Sometimes")
    assert r.returncode != 0 and "schema" in r.stderr, r.stderr


# --- 2: hostPaths that may be absent ----------------------------------------------------------


# every hostPath of the agent pod and its type: the ones a node may lack have "" (no check) or
# are created by the chart's own choice (DirectoryOrCreate); Directory only where every Linux
# node with the kernel features the agent needs has the directory
HOST_PATH_TYPES = {
    "/run/railhop": "DirectoryOrCreate",
    "/sys": "Directory",
    "/sys/kernel/debug": "Directory",
    "/sys/kernel/tracing": "Directory",
    "/sys/fs/bpf": "DirectoryOrCreate",
    "/lib/modules": "Directory",
    "/usr/src": "",
    "/dev/infiniband": "",
    "/opt/railhop/lib": "DirectoryOrCreate",
}


def _host_paths(ds: Obj) -> dict[str, str]:
    vols = ds["spec"]["template"]["spec"]["volumes"]
    return {v["hostPath"]["path"]: v["hostPath"]["type"] for v in vols if "hostPath" in v}


def test_host_path_types() -> None:
    (ds,) = _daemonsets(render())
    assert _host_paths(ds) == HOST_PATH_TYPES
    plain = [d for d in yaml.safe_load_all(PLAIN.read_text()) if d]
    (pds,) = _daemonsets(plain)
    assert _host_paths(pds) == HOST_PATH_TYPES


def test_kernel_headers_mount_can_be_left_out() -> None:
    (ds,) = _daemonsets(render("kernelHeaders.mount=false"))
    assert "/usr/src" not in _host_paths(ds)
    mounts = [m["mountPath"] for m in _agent(ds)["volumeMounts"]]
    assert "/usr/src" not in mounts and "/lib/modules" in mounts
    names = {v["name"] for v in ds["spec"]["template"]["spec"]["volumes"]}
    assert {m["name"] for m in _agent(ds)["volumeMounts"]} <= names
    (ds,) = _daemonsets(render())
    (m,) = [m for m in _agent(ds)["volumeMounts"] if m["mountPath"] == "/usr/src"]
    assert m["readOnly"] is True


# --- 3: tolerations ---------------------------------------------------------------------------


def test_the_agent_tolerates_the_degraded_taint_and_node_problems() -> None:
    (ds,) = _daemonsets(render())
    tol = ds["spec"]["template"]["spec"]["tolerations"]
    # railhop's own taint, every effect (NoSchedule keeps it schedulable, NoExecute from
    # eviction): the agent is what reports the node's recovery
    assert {"key": "railhop.io/nic-degraded", "operator": "Exists"} in tol
    for key in ("node.kubernetes.io/unschedulable", "node.kubernetes.io/network-unavailable"):
        assert {"key": key, "operator": "Exists", "effect": "NoSchedule"} in tol
    # not-ready / unreachable (NoExecute, no tolerationSeconds) are the DaemonSet controller's
    # own additions to every DaemonSet pod: the chart leaves them to it
    assert not [t for t in tol if t.get("effect") == "NoExecute"]
    plain = [d for d in yaml.safe_load_all(PLAIN.read_text()) if d]
    (pds,) = _daemonsets(plain)
    assert pds["spec"]["template"]["spec"]["tolerations"] == tol
    # overridable: the list is the value
    (ds,) = _daemonsets(render("tolerations[0].key=only", "tolerations[0].operator=Exists"))
    assert ds["spec"]["template"]["spec"]["tolerations"] == [{"key": "only", "operator": "Exists"}]
    (ds,) = _daemonsets(render("tolerations=null"))
    assert "tolerations" not in ds["spec"]["template"]["spec"]


# --- 6: PodMonitor ------------------------------------------------------------------------


def _one(docs: list[Obj], kind: str) -> Obj:
    (d,) = [d for d in docs if d["kind"] == kind]
    return d


def test_pod_monitor_scrapes_the_agents_with_the_node_label() -> None:
    assert "PodMonitor" not in {d["kind"] for d in render()}  # off by default
    docs = render("podMonitor.enabled=true", "serviceMonitor.enabled=true",
                  "podMonitor.labels.release=kps", "podMonitor.interval=15s")  # fmt: skip
    pm, sm = _one(docs, "PodMonitor"), _one(docs, "ServiceMonitor")
    assert pm["apiVersion"] == "monitoring.coreos.com/v1"
    assert pm["metadata"]["labels"]["release"] == "kps"
    (ep,) = pm["spec"]["podMetricsEndpoints"]
    (sep,) = sm["spec"]["endpoints"]
    relabel = [{"sourceLabels": ["__meta_kubernetes_pod_node_name"], "targetLabel": "node"}]
    assert ep["relabelings"] == sep["relabelings"] == relabel
    assert (ep["port"], ep["path"], ep["interval"]) == ("metrics", "/metrics", "15s")
    ds = _one(docs, "DaemonSet")
    assert pm["spec"]["selector"]["matchLabels"].items() <= (
        ds["spec"]["template"]["metadata"]["labels"].items()
    )
    assert pm["spec"]["namespaceSelector"] == {"matchNames": ["railhop"]}
    ports = {p["name"] for p in _agent(ds)["ports"]}
    assert ep["port"] in ports
    r = _run("template", "rh", str(CHART), "--set", "podMonitor.interval=soon")
    assert r.returncode != 0 and "schema" in r.stderr


def test_the_monitors_select_every_pool_daemonset(tmp_path: Path) -> None:
    docs = render("podMonitor.enabled=true", "serviceMonitor.enabled=true", *ALL_ON[-4:])
    pm = _one(docs, "PodMonitor")
    for ds in _daemonsets(docs):
        labels = ds["spec"]["template"]["metadata"]["labels"]
        assert pm["spec"]["selector"]["matchLabels"].items() <= labels.items()
