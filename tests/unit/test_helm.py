"""The Helm chart ``deploy/helm/railhop``: ``helm lint --strict`` and ``helm template`` (the helm
binary ``make setup`` installs into the venv), every rendered object validated offline against
the Kubernetes JSON schemas (``kubernetes-validate``, strict: unknown fields are errors), and
the rendered DaemonSet compared with the plain manifest ``deploy/kubernetes/railhop-agent.yaml``
(the same capabilities, mounts, probes; the same policy)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from conftest import require
from railhop.policy import load_policy, parse_policy

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "deploy" / "helm" / "railhop"
PLAIN = REPO / "deploy" / "kubernetes" / "railhop-agent.yaml"
K8S_VERSION = "1.33"  # the schemas the rendered objects are checked against

Obj = dict[str, Any]


def _helm() -> str:
    venv_helm = Path(sys.executable).parent / "helm"
    found = str(venv_helm) if venv_helm.exists() else shutil.which("helm")
    require(found is not None, "no helm binary: `make setup` installs one into .venv/bin")
    assert found is not None
    return found


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [_helm(), *args], capture_output=True, text=True, timeout=120, check=False
    )


def render(*sets: str, kube: str | None = None) -> list[Obj]:
    """``helm template`` with ``--set`` each of ``sets``; ``kube``: ``--kube-version`` (what
    ``.Capabilities.KubeVersion`` says; helm's own default otherwise)."""
    args = ["template", "rh", str(CHART), "--namespace", "railhop"]
    if kube is not None:
        args += ["--kube-version", kube]
    for s in sets:
        args += ["--set", s]
    r = _run(*args)
    assert r.returncode == 0, r.stderr
    return [d for d in yaml.safe_load_all(r.stdout) if d]


def _kind(docs: list[Obj], kind: str) -> Obj:
    (d,) = [d for d in docs if d["kind"] == kind]
    return d


def _validate(doc: Obj) -> None:
    import kubernetes_validate as kv

    kv.validate(doc, K8S_VERSION, strict=True)


def lint(*sets: str, kube: str | None = None) -> None:
    """`helm lint --strict` of the chart with these --set values (and --kube-version): clean."""
    args = ["lint", "--strict", str(CHART)] + (["--kube-version", kube] if kube else [])
    for s in sets:
        args += ["--set", s]
    r = _run(*args)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "0 chart(s) failed" in r.stdout


def test_helm_lint_strict() -> None:
    for sets in ([], ["serviceMonitor.enabled=true"], ["serviceAccount.create=false"]):
        lint(*sets)


def test_rendered_objects_pass_the_kubernetes_schemas() -> None:
    docs = render("serviceMonitor.enabled=true")
    kinds = sorted(d["kind"] for d in docs)
    assert kinds == ["ConfigMap", "DaemonSet", "Service", "ServiceAccount", "ServiceMonitor"]
    for d in docs:
        if d["kind"] == "ServiceMonitor":  # a CRD: not in the built-in schemas
            assert d["apiVersion"] == "monitoring.coreos.com/v1"
            ep = d["spec"]["endpoints"][0]
            assert ep["port"] == "metrics" and ep["path"] == "/metrics"
            svc = _kind(docs, "Service")
            assert d["spec"]["selector"]["matchLabels"].items() <= svc["metadata"]["labels"].items()
            continue
        _validate(d)
    # the validator does catch a misspelt field (strict) and a wrong type
    import kubernetes_validate as kv

    ds = _kind(docs, "DaemonSet")
    bad = yaml.safe_load(yaml.safe_dump(ds))
    bad["spec"]["template"]["spec"]["hostNetwrok"] = True
    with pytest.raises(kv.ValidationError):
        _validate(bad)
    bad = yaml.safe_load(yaml.safe_dump(ds))
    bad["spec"]["template"]["spec"]["containers"][0]["ports"][0]["containerPort"] = "x"
    with pytest.raises(kv.ValidationError):
        _validate(bad)


def _pod(docs: list[Obj]) -> Obj:
    spec = _kind(docs, "DaemonSet")["spec"]["template"]["spec"]
    assert isinstance(spec, dict)
    return spec


def _plain_pod() -> Obj:
    docs = [d for d in yaml.safe_load_all(PLAIN.read_text()) if d]
    spec = _kind(docs, "DaemonSet")["spec"]["template"]["spec"]
    assert isinstance(spec, dict)
    return spec


def test_the_chart_runs_the_agent_as_the_plain_manifest_does() -> None:
    """Same capabilities (the node-hardening list), security context, mounts, probes and
    tolerations as deploy/kubernetes/railhop-agent.yaml; plus what the chart adds. The plain
    manifest sets AppArmor by the pod annotation (it must work on 1.25): the chart rendered
    for 1.25 does the same; from 1.30 the chart sets the container's field instead."""
    docs = render(kube="1.25.0")
    pod, plain = _pod(docs), _plain_pod()
    (c,) = pod["containers"]
    (pc,) = plain["containers"]
    assert c["securityContext"] == pc["securityContext"]
    plain_ds = _kind([d for d in yaml.safe_load_all(PLAIN.read_text()) if d], "DaemonSet")
    assert (
        _kind(docs, "DaemonSet")["spec"]["template"]["metadata"]["annotations"]
        == plain_ds["spec"]["template"]["metadata"]["annotations"]
        == {"container.apparmor.security.beta.kubernetes.io/agent": "unconfined"}
    )
    new_c = _pod(render(kube="1.30.0"))["containers"][0]
    assert new_c["securityContext"] == {
        **pc["securityContext"],
        "appArmorProfile": {"type": "Unconfined"},
    }
    assert c["securityContext"]["capabilities"]["add"] == ["BPF", "PERFMON", "NET_ADMIN",
                                                           "SYS_RESOURCE", "CHOWN"]  # fmt: skip
    assert c["volumeMounts"] == pc["volumeMounts"]
    assert pod["volumes"][1:] == plain["volumes"][1:]  # [0]: the policy ConfigMap (named)
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert c[probe] == pc[probe], probe
    assert pod["tolerations"] == plain["tolerations"]
    assert (pod["hostNetwork"], pod["hostPID"]) == (True, True)
    assert c["resources"] == pc["resources"]
    # what the chart adds
    assert pod["priorityClassName"] == "system-node-critical"
    sa = _kind(docs, "ServiceAccount")
    assert pod["serviceAccountName"] == sa["metadata"]["name"]
    assert pod["automountServiceAccountToken"] is False
    assert c["image"] == "localhost/railhop:0.1.0"
    args = c["args"]
    assert args[args.index("--metrics-addr") + 1] == "$(POD_IP)"
    env = {e["name"]: e for e in c["env"]}
    assert env["POD_IP"]["valueFrom"]["fieldRef"]["fieldPath"] == "status.podIP"
    assert env["OTEL_EXPORTER_OTLP_ENDPOINT"]["value"] == "http://$(HOST_IP):4318"
    assert env["OTEL_EXPORTER_OTLP_PROTOCOL"]["value"] == "http/protobuf"
    assert env["OTEL_TRACES_SAMPLER"]["value"] == "parentbased_always_on"
    svc = _kind(docs, "Service")
    assert svc["spec"]["ports"][0]["port"] == c["ports"][0]["containerPort"] == 18464
    assert (
        svc["spec"]["selector"].items()
        <= _kind(docs, "DaemonSet")["spec"]["template"]["metadata"]["labels"].items()
    )


def test_nvidia_and_amd_gpu_nodes_are_selected() -> None:
    terms = _pod(render())["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"
    ]["nodeSelectorTerms"]
    # one term per vendor (terms are ORed): a node with either label qualifies
    assert [t["matchExpressions"] for t in terms] == [
        [{"key": "nvidia.com/gpu.present", "operator": "In", "values": ["true"]}],
        [{"key": "feature.node.kubernetes.io/amd-gpu", "operator": "In", "values": ["true"]}],
    ]
    assert "affinity" not in _pod(render("gpuNodeLabels=null"))
    # the plain manifest selects the same nodes
    assert _plain_pod()["affinity"] == _pod(render())["affinity"]


def test_the_policy_configmap_is_the_shipped_policy_or_the_users() -> None:
    docs = render()
    cm = _kind(docs, "ConfigMap")
    pod = _pod(docs)
    assert pod["volumes"][0] == {"name": "policy", "configMap": {"name": cm["metadata"]["name"]}}
    shipped = REPO / "policies" / "rail-optimized-8nic.yaml"
    assert (CHART / "files" / "policy.yaml").read_text() == shipped.read_text()
    assert parse_policy(cm["data"]["policy.yaml"], str(shipped)) == load_policy(shipped)
    own_file = REPO / "policies" / "permissive.yaml"
    own = own_file.read_text()
    r = _run("template", "rh", str(CHART), "--set-file", f"policy={own_file}")
    assert r.returncode == 0, r.stderr
    cm = _kind([d for d in yaml.safe_load_all(r.stdout) if d], "ConfigMap")
    assert cm["data"]["policy.yaml"].strip() == own.strip()


def test_values_reach_the_agent() -> None:
    docs = render(
        "image.repository=reg.example/rh",
        "image.tag=1.2.3",
        "agent.ownerUid=1000",
        "agent.usdtLib=/opt/railhop/lib/libnccl-net-railhop.so",
        "otlp.endpoint=http://otel:4318",
        "otlp.resourceAttributes=k8s.cluster.name=a3",
        "priorityClassName=",
        "serviceAccount.create=false",
    )
    pod = _pod(docs)
    (c,) = pod["containers"]
    assert c["image"] == "reg.example/rh:1.2.3"
    args = c["args"]
    assert args[args.index("--owner-uid") + 1] == "1000"
    assert args[args.index("--usdt-lib") + 1] == "/opt/railhop/lib/libnccl-net-railhop.so"
    env = {e["name"]: e.get("value") for e in c["env"]}
    assert env["OTEL_EXPORTER_OTLP_ENDPOINT"] == "http://otel:4318"
    assert env["OTEL_RESOURCE_ATTRIBUTES"].endswith(",k8s.cluster.name=a3")
    assert "priorityClassName" not in pod
    assert pod["serviceAccountName"] == "default"
    assert "ServiceAccount" not in [d["kind"] for d in docs]
    for d in docs:
        _validate(d)
    c = _pod(render("otlp.enabled=false"))["containers"][0]
    assert "--no-traces" in c["args"]
    assert not [e for e in c["env"] if e["name"].startswith("OTEL_")]


def test_every_agent_option_the_chart_passes_exists() -> None:
    """The CLI has every option the rendered DaemonSet passes (a renamed option fails here)."""
    from railhop.cli import cli

    agent = cli.commands["agent"]
    known = {o for p in agent.params for o in getattr(p, "opts", [])} | {
        o for p in agent.params for o in getattr(p, "secondary_opts", [])
    }
    docs = render(
        "agent.ownerUid=1", "agent.socketGroup=g", "agent.usdtLib=/x", "otlp.enabled=false"
    )
    args = _pod(docs)["containers"][0]["args"]
    assert args[0] == "agent"
    for a in args[1:]:
        if a.startswith("--"):
            assert a in known, a


@pytest.mark.parametrize("name", ["railhop-agent.yaml", "example-job.yaml"])
def test_plain_manifests_pass_the_kubernetes_schemas(name: str) -> None:
    docs = [d for d in yaml.safe_load_all((PLAIN.parent / name).read_text()) if d]
    assert docs
    for d in docs:
        _validate(d)


# --- issue 30: schema, overridable pod settings, policies per node pool, plugin install ------


def test_values_schema_rejects_bad_values() -> None:
    assert (CHART / "values.schema.json").is_file()
    r = _run("lint", "--strict", str(CHART))
    assert r.returncode == 0, r.stdout + r.stderr
    for bad in (
        "metrics.port=abc",
        "metrics.port=70000",
        "image.pullPolicy=Sometimes",
        "agent.runDir=relative/dir",
        "agent.heartbeatMs=5",
        "serviceMonitor.interval=soon",
        "noSuchValue=1",
        "pluginInstall.hostPath=opt",
    ):
        r = _run("template", "rh", str(CHART), "--set", bad)
        assert r.returncode != 0, bad
        assert "schema" in r.stderr, (bad, r.stderr)
        r = _run("lint", "--strict", str(CHART), "--set", bad)
        assert r.returncode != 0, bad


def test_pod_settings_are_overridable() -> None:
    docs = render(
        "extraEnv[0].name=FOO",
        "extraEnv[0].value=bar",
        "extraVolumes[0].name=extra",
        "extraVolumes[0].emptyDir.medium=Memory",
        "extraVolumeMounts[0].name=extra",
        "extraVolumeMounts[0].mountPath=/extra",
        "podAnnotations.example\\.com/team=ml",
        "tolerations[0].operator=Exists",
        "affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution"
        ".nodeSelectorTerms[0].matchExpressions[0].key=pool",
        "affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution"
        ".nodeSelectorTerms[0].matchExpressions[0].operator=Exists",
    )
    ds = _kind(docs, "DaemonSet")
    pod = ds["spec"]["template"]["spec"]
    (c,) = pod["containers"]
    assert {"name": "FOO", "value": "bar"} in c["env"]
    assert {"name": "extra", "emptyDir": {"medium": "Memory"}} in pod["volumes"]
    assert {"name": "extra", "mountPath": "/extra"} in c["volumeMounts"]
    assert ds["spec"]["template"]["metadata"]["annotations"] == {"example.com/team": "ml"}
    old = _kind(render("podAnnotations.example\\.com/team=ml", kube="1.29.0"), "DaemonSet")
    assert old["spec"]["template"]["metadata"]["annotations"] == {
        "example.com/team": "ml",
        "container.apparmor.security.beta.kubernetes.io/agent": "unconfined",
    }
    assert pod["tolerations"] == [{"operator": "Exists"}]
    terms = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert terms["nodeSelectorTerms"] == [
        {"matchExpressions": [{"key": "pool", "operator": "Exists"}]}
    ]
    for d in docs:
        if d["kind"] != "ServiceMonitor":
            _validate(d)


def _pools(tmp_path: Path) -> list[Obj]:
    values = tmp_path / "pools.yaml"
    values.write_text(
        yaml.safe_dump(
            {
                "policyPools": [
                    {
                        "name": "h100",
                        "nodeLabel": {"key": "example.com/pool", "values": ["h100", "h100b"]},
                        "policy": (REPO / "policies" / "permissive.yaml").read_text(),
                    },
                    {
                        "name": "mi300",
                        "nodeLabel": {"key": "example.com/pool", "values": ["mi300"]},
                        "policy": (REPO / "policies" / "multi-plane.yaml").read_text(),
                    },
                ]
            }
        )
    )
    r = _run("template", "rh", str(CHART), "--namespace", "railhop", "-f", str(values))
    assert r.returncode == 0, r.stderr
    return [d for d in yaml.safe_load_all(r.stdout) if d]


def test_policies_map_to_node_pools_by_label(tmp_path: Path) -> None:
    """One DaemonSet and one policy ConfigMap per pool, on the GPU nodes with the pool's label;
    the default DaemonSet keeps the GPU nodes no pool claims. Every term of a pool's affinity
    carries the pool's label (terms are ORed); every term of the default's excludes each pool."""
    docs = _pools(tmp_path)
    dss = {d["metadata"]["name"]: d for d in docs if d["kind"] == "DaemonSet"}
    cms = {d["metadata"]["name"]: d for d in docs if d["kind"] == "ConfigMap"}
    assert set(dss) == {"rh-railhop", "rh-railhop-h100", "rh-railhop-mi300"}
    assert set(cms) == {"rh-railhop-policy", "rh-railhop-h100-policy", "rh-railhop-mi300-policy"}
    for name, policy_file in (("h100", "permissive.yaml"), ("mi300", "multi-plane.yaml")):
        ds = dss[f"rh-railhop-{name}"]
        pod = ds["spec"]["template"]["spec"]
        (vol,) = [v for v in pod["volumes"] if v["name"] == "policy"]
        cm = cms[vol["configMap"]["name"]]
        shipped = REPO / "policies" / policy_file
        assert parse_policy(cm["data"]["policy.yaml"], str(shipped)) == load_policy(shipped)
        sel = ds["spec"]["selector"]["matchLabels"]
        assert sel["railhop.io/pool"] == name
        assert sel.items() <= ds["spec"]["template"]["metadata"]["labels"].items()
        terms = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
        for t in terms["nodeSelectorTerms"]:
            assert {
                "key": "example.com/pool",
                "operator": "In",
                "values": ["h100", "h100b"] if name == "h100" else ["mi300"],
            } in t["matchExpressions"]
    default = dss["rh-railhop"]["spec"]["template"]["spec"]
    terms = default["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert len(terms["nodeSelectorTerms"]) == 2  # NVIDIA, AMD
    for t in terms["nodeSelectorTerms"]:
        ex = t["matchExpressions"]
        assert {"key": "example.com/pool", "operator": "NotIn", "values": ["h100", "h100b"]} in ex
        assert {"key": "example.com/pool", "operator": "NotIn", "values": ["mi300"]} in ex
    # the default DaemonSet's selector is unchanged (selectors are immutable on upgrade)
    assert "railhop.io/pool" not in dss["rh-railhop"]["spec"]["selector"]["matchLabels"]
    for d in docs:
        if d["kind"] != "ServiceMonitor":
            _validate(d)


def test_overlapping_pools_fail_to_render(tmp_path: Path) -> None:
    values = tmp_path / "v.yaml"
    pool = {"nodeLabel": {"key": "k", "values": ["a"]}, "policy": "x"}
    values.write_text(
        yaml.safe_dump({"policyPools": [{"name": "one", **pool}, {"name": "two", **pool}]})
    )
    r = _run("template", "rh", str(CHART), "-f", str(values))
    assert r.returncode != 0 and "one and two both claim nodes labelled k=a" in r.stderr


def test_the_daemonset_installs_the_plugin_on_the_host() -> None:
    pod = _pod(render())
    (init,) = pod["initContainers"]
    (c,) = pod["containers"]
    assert init["image"] == c["image"]
    assert init["command"] == ["railhop", "plugin-install", "--dest", "/opt/railhop/lib"]
    (m,) = init["volumeMounts"]
    (vol,) = [v for v in pod["volumes"] if v["name"] == m["name"]]
    assert vol["hostPath"] == {"path": "/opt/railhop/lib", "type": "DirectoryOrCreate"}
    assert m["mountPath"] == "/opt/railhop/lib"
    assert init["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert "plugin-install" in {c.name for c in _cli_commands()}
    pod = _pod(render("pluginInstall.hostPath=/var/lib/railhop"))
    (vol,) = [v for v in pod["volumes"] if v["name"] == "plugin-lib"]
    assert vol["hostPath"]["path"] == "/var/lib/railhop"
    assert "initContainers" not in _pod(render("pluginInstall.enabled=false"))


def _cli_commands() -> list[Any]:
    from railhop.cli import cli

    return list(cli.commands.values())


def test_the_chart_points_at_the_image_make_image_builds() -> None:
    """scripts/build-image.sh tags localhost/railhop:<pyproject version>; the chart's default
    image is that reference (appVersion = the package's version)."""
    import tomllib

    version = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert chart["appVersion"] == version
    script = (REPO / "scripts" / "build-image.sh").read_text()
    assert "IMAGE=${RAILHOP_IMAGE:-localhost/railhop:$VERSION}" in script
    pod = _pod(render())
    assert pod["containers"][0]["image"] == f"localhost/railhop:{version}"
    assert pod["initContainers"][0]["image"] == f"localhost/railhop:{version}"
