"""Node health to scheduling, the cluster side (deploy/npd/): the node-problem-detector example
mounts what the chart's NPD rule reads (the ConfigMap with the check, the host's run directory)
and names the chart's ConfigMap; the taint controller turns RailhopNICDegraded into a
``NoSchedule`` taint and back, never NoExecute and with no right to evict. Both manifests pass
the Kubernetes 1.33 schemas; the controller's script runs under busybox ``sh`` against a stub
``kubectl`` that serves nodes and records every taint call."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from conftest import require

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "deploy/helm/railhop"
NPD_RULE = CHART / "files/npd-railhop.json"
NPD_DS = REPO / "deploy/npd/node-problem-detector.yaml"
TAINT = REPO / "deploy/npd/railhop-taint-controller.yaml"

Obj = dict[str, Any]


def docs(path: Path) -> list[Obj]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def kind(ds: list[Obj], k: str) -> Obj:
    (d,) = [d for d in ds if d["kind"] == k]
    return d


@pytest.mark.parametrize("path", [NPD_DS, TAINT], ids=lambda p: p.name)
def test_manifests_pass_the_kubernetes_schemas(path: Path) -> None:
    import kubernetes_validate as kv

    for d in docs(path):
        kv.validate(d, "1.33", strict=True)


def _rendered_npd_configmap() -> Obj:
    helm = Path(sys.executable).parent / "helm"
    found = str(helm) if helm.exists() else shutil.which("helm")
    require(found is not None, "no helm binary: `make setup` installs one into .venv/bin")
    assert found is not None
    r = subprocess.run(
        [found, "template", "railhop", str(CHART), "--set", "nodeProblemDetector.enabled=true"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert r.returncode == 0, r.stderr
    (cm,) = [
        d
        for d in yaml.safe_load_all(r.stdout)
        if d and d["kind"] == "ConfigMap" and d["metadata"]["name"].endswith("-npd")
    ]
    return cm


def test_npd_example_mounts_what_the_rule_reads() -> None:
    rule = json.loads(NPD_RULE.read_text())
    (r,) = rule["rules"]
    script, status = r["args"]
    pod = kind(docs(NPD_DS), "DaemonSet")["spec"]["template"]["spec"]
    (c,) = pod["containers"]
    mounts = {m["name"]: m for m in c["volumeMounts"]}
    vols = {v["name"]: v for v in pod["volumes"]}
    cm = _rendered_npd_configmap()  # release "railhop": railhop-npd
    # the ConfigMap (the chart's, by name) where the rule looks for the script
    (cm_mount,) = [m for n, m in mounts.items() if "configMap" in vols[n]]
    assert vols[cm_mount["name"]]["configMap"]["name"] == cm["metadata"]["name"] == "railhop-npd"
    assert Path(script).parent == Path(cm_mount["mountPath"])
    assert Path(script).name in cm["data"]
    # the monitor config NPD loads is the ConfigMap's JSON key
    monitors = [a.split("=", 1)[1] for a in c["args"] if a.startswith("--config.custom-plugin")]
    assert monitors == [f"{cm_mount['mountPath']}/railhop-nic-monitor.json"]
    assert "railhop-nic-monitor.json" in cm["data"]
    # the host's run directory, read-only, where the rule reads node-status
    (run,) = [m for n, m in mounts.items() if "hostPath" in vols[n]]
    assert run["readOnly"] is True and vols[run["name"]]["hostPath"]["path"] == "/run/railhop"
    assert Path(status).parent == Path(run["mountPath"]) and Path(status).name == "node-status"
    env = {e["name"]: e for e in c["env"]}
    assert env["NODE_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"


def test_taint_controller_is_noschedule_for_the_npd_condition_and_cannot_evict() -> None:
    ds = docs(TAINT)
    condition = json.loads(NPD_RULE.read_text())["conditions"][0]["type"]
    assert condition == "RailhopNICDegraded"
    (c,) = kind(ds, "Deployment")["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e.get("value") for e in c["env"]}
    assert env["CONDITION"] == condition and env["TAINT_KEY"] == "railhop.io/nic-degraded"
    script = kind(ds, "ConfigMap")["data"]["taint-by-condition.sh"]
    assert "effect=NoSchedule" in script
    code = [x.split("#")[0] for x in script.splitlines()]  # comments may say why not
    assert not [x for x in code if "NoExecute" in x]
    assert not [x for x in code if "drain" in x or "evict" in x or "cordon" in x]
    (rule,) = kind(ds, "ClusterRole")["rules"]
    assert rule["resources"] == ["nodes"] and set(rule["verbs"]) == {"get", "list", "patch"}


STUB = """#!/bin/sh
# a kubectl that serves $NODES for `get nodes` and logs every call
printf '%s\\n' "$*" >>"$CALLS"
case $1 in
    get) cat "$NODES" ;;
    taint) exit 0 ;;
    *) exit 9 ;;
esac
"""


def test_taint_controller_script_reconciles_once_with_busybox(tmp_path: Path) -> None:
    busybox = shutil.which("busybox")
    require(busybox is not None, "no busybox (Debian: busybox-static)")
    assert busybox is not None
    script = tmp_path / "taint.sh"
    script.write_text(kind(docs(TAINT), "ConfigMap")["data"]["taint-by-condition.sh"])
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "kubectl").write_text(STUB)
    os.chmod(bin_dir / "kubectl", 0o755)
    nodes, calls = tmp_path / "nodes", tmp_path / "calls"
    # what the jsonpath prints: name|condition status|our taint's effect
    nodes.write_text(
        "\n".join(
            [
                "gpu-a|True|",  # degraded, not tainted yet -> taint
                "gpu-b|False|NoSchedule",  # healed -> untaint
                "gpu-c|Unknown|NoSchedule",  # no verdict -> leave
                "gpu-d|True|NoSchedule",  # already tainted -> leave
                "gpu-e||",  # no railhop condition -> leave
                "gpu-f|False|",  # healthy, untainted -> leave
            ]
        )
        + "\n"
    )
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "NODES": str(nodes), "CALLS": str(calls)}
    r = subprocess.run(
        [busybox, "sh", str(script), "--once"],
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert r.returncode == 0, r.stderr
    get, *taints = calls.read_text().splitlines()
    assert get.startswith("get nodes -o jsonpath=")
    assert '@.type=="RailhopNICDegraded"' in get and '@.key=="railhop.io/nic-degraded"' in get
    assert taints == [
        "taint nodes gpu-a railhop.io/nic-degraded=true:NoSchedule --overwrite",
        "taint nodes gpu-b railhop.io/nic-degraded:NoSchedule-",
    ]
    assert "gpu-a: RailhopNICDegraded=True" in r.stdout


def _helm(*args: str) -> subprocess.CompletedProcess[str]:
    helm = Path(sys.executable).parent / "helm"
    found = str(helm) if helm.exists() else shutil.which("helm")
    require(found is not None, "no helm binary: `make setup` installs one into .venv/bin")
    assert found is not None
    return subprocess.run([found, *args], capture_output=True, text=True, timeout=120, check=False)


def _agent_pod(*sets: str) -> Obj:
    args = ["template", "rh", str(CHART), "--namespace", "railhop"]
    for s in sets:
        args += ["--set", s]
    r = _helm(*args)
    assert r.returncode == 0, r.stderr
    (ds,) = [d for d in yaml.safe_load_all(r.stdout) if d and d["kind"] == "DaemonSet"]
    import kubernetes_validate as kv

    kv.validate(ds, "1.33", strict=True)
    pod: Obj = ds["spec"]["template"]["spec"]
    return pod


def test_chart_nfd_values_pass_the_option_and_mount_the_features_dir() -> None:
    from railhop.cli import cli

    off = _agent_pod()
    (c,) = off["containers"]
    assert "--nfd-features-dir" not in c["args"]
    assert "nfd-features" not in [v["name"] for v in off["volumes"]]
    for d, sets in (
        ("/etc/kubernetes/node-feature-discovery/features.d", ()),
        ("/var/lib/nfd/features.d", ("nodeFeatureDiscovery.featuresDir=/var/lib/nfd/features.d",)),
    ):
        pod = _agent_pod("nodeFeatureDiscovery.enabled=true", *sets)
        (c,) = pod["containers"]
        args = c["args"]
        assert args[args.index("--nfd-features-dir") + 1] == d
        assert "--nfd-features-dir" in {o for p in cli.commands["agent"].params for o in p.opts}
        (m,) = [m for m in c["volumeMounts"] if m["name"] == "nfd-features"]
        assert m["mountPath"] == d and not m.get("readOnly")
        (v,) = [v for v in pod["volumes"] if v["name"] == "nfd-features"]
        assert v["hostPath"] == {"path": d, "type": "DirectoryOrCreate"}
        # the rest of the pod is what it is without NFD
        assert [x for x in c["volumeMounts"] if x is not m] == off["containers"][0]["volumeMounts"]
    for bad in ("nodeFeatureDiscovery.featuresDir=features.d", "nodeFeatureDiscovery.enabled=1"):
        r = _helm("template", "rh", str(CHART), "--set", bad)
        assert r.returncode != 0 and "schema" in r.stderr, (bad, r.stderr)
    r = _helm("lint", "--strict", str(CHART), "--set", "nodeFeatureDiscovery.enabled=true")
    assert r.returncode == 0, r.stdout + r.stderr
