"""Deployment files: the Kubernetes manifests and the systemd unit in ``deploy/``.

No cluster and no network: the manifests are checked against the parts of the Kubernetes object
structure that matter here (required fields, references between fields, the privileges and
mounts the agent needs) and against the project itself (the ConfigMap's policy passes the
project's validator, the CLI has the options the manifests use, the NCCL names match the plugin).
The systemd unit goes through ``systemd-analyze verify``.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import stat
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import click
import pytest
import yaml

from conftest import require
from railhop import paths
from railhop.cli import cli
from railhop.control import NicHealth, NicState, TableWriter
from railhop.policy import check_text, load_policy, parse_policy

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"
AGENT_YAML = DEPLOY / "kubernetes" / "railhop-agent.yaml"
JOB_YAML = DEPLOY / "kubernetes" / "example-job.yaml"
UNIT = DEPLOY / "systemd" / "railhop-agent.service"
RUN_DIR = "/run/railhop"
AGENT_BIN = "/opt/railhop/.venv/bin/railhop"

Obj = dict[str, Any]

# --------------------------------------------------------------------------------------------
# helpers

_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$")
_ENV_NAME = re.compile(r"^[-._a-zA-Z][-._a-zA-Z0-9]*$")
_HOSTPATH_TYPES = {
    "",
    "DirectoryOrCreate",
    "Directory",
    "FileOrCreate",
    "File",
    "Socket",
    "CharDevice",
    "BlockDevice",
}
_VOLUME_SOURCES = {"hostPath", "emptyDir", "configMap", "secret", "projected", "downwardAPI"}
# field names of the Kubernetes core/v1 objects used here (a misspelt key is silently ignored
# by kubectl's client side and rejected or dropped by the API server: catch it here)
_POD_FIELDS = {
    "volumes", "initContainers", "containers", "ephemeralContainers", "restartPolicy",
    "terminationGracePeriodSeconds", "activeDeadlineSeconds", "dnsPolicy", "nodeSelector",
    "serviceAccountName", "automountServiceAccountToken", "nodeName", "hostNetwork", "hostPID",
    "hostIPC", "shareProcessNamespace", "securityContext", "imagePullSecrets", "hostname",
    "subdomain", "affinity", "schedulerName", "tolerations", "hostAliases", "priorityClassName",
    "priority", "dnsConfig", "readinessGates", "runtimeClassName", "enableServiceLinks",
    "preemptionPolicy", "overhead", "topologySpreadConstraints", "setHostnameAsFQDN", "os",
    "hostUsers", "schedulingGates", "resourceClaims",
}  # fmt: skip
_CONTAINER_FIELDS = {
    "name", "image", "imagePullPolicy", "command", "args", "workingDir", "ports", "env",
    "envFrom", "resources", "volumeMounts", "volumeDevices", "livenessProbe", "readinessProbe",
    "startupProbe", "lifecycle", "terminationMessagePath", "terminationMessagePolicy",
    "securityContext", "stdin", "stdinOnce", "tty", "restartPolicy", "resizePolicy",
}  # fmt: skip
_MOUNT_FIELDS = {"name", "mountPath", "readOnly", "subPath", "subPathExpr", "mountPropagation"}
_PROBE_FIELDS = {
    "exec", "httpGet", "tcpSocket", "grpc", "initialDelaySeconds", "timeoutSeconds",
    "periodSeconds", "successThreshold", "failureThreshold", "terminationGracePeriodSeconds",
}  # fmt: skip
_TOLERATION_FIELDS = {"key", "operator", "value", "effect", "tolerationSeconds"}
_API = {
    "Namespace": "v1",
    "ConfigMap": "v1",
    "DaemonSet": "apps/v1",
    "Job": "batch/v1",
}


def _docs(path: Path) -> list[Obj]:
    with path.open(encoding="utf-8") as f:
        docs = [d for d in yaml.safe_load_all(f) if d is not None]
    assert docs, f"{path}: no YAML documents"
    for d in docs:
        assert isinstance(d, dict), f"{path}: a document is not a mapping"
    return docs


def _one(docs: list[Obj], kind: str) -> Obj:
    found = [d for d in docs if d.get("kind") == kind]
    assert len(found) == 1, f"expected one {kind}, found {len(found)}"
    return found[0]


def _pod_spec(obj: Obj) -> Obj:
    spec = obj["spec"]["template"]["spec"]
    assert isinstance(spec, dict)
    return spec


def _containers(pod: Obj) -> Iterator[Obj]:
    yield from pod.get("initContainers", [])
    yield from pod["containers"]


def _env(container: Obj) -> dict[str, str]:
    return {e["name"]: e.get("value", "") for e in container.get("env", [])}


def _mount(container: Obj, path: str) -> Obj:
    for m in container.get("volumeMounts", []):
        if m["mountPath"] == path:
            assert isinstance(m, dict)
            return m
    raise AssertionError(f"container {container['name']}: nothing mounted at {path}")


def _volume(pod: Obj, name: str) -> Obj:
    for v in pod["volumes"]:
        if v["name"] == name:
            assert isinstance(v, dict)
            return v
    raise AssertionError(f"no volume {name!r}")


def _agent() -> tuple[Obj, Obj, Obj]:
    """(DaemonSet, its pod spec, the agent container)."""
    ds = _one(_docs(AGENT_YAML), "DaemonSet")
    pod = _pod_spec(ds)
    (agent,) = [c for c in pod["containers"] if c["name"] == "agent"]
    return ds, pod, agent


def _long_options(argv: list[str]) -> list[str]:
    return [a.split("=", 1)[0] for a in argv if a.startswith("--")]


def _option_value(argv: list[str], name: str) -> str:
    for i, a in enumerate(argv):
        if a == name:
            return argv[i + 1]
        if a.startswith(name + "="):
            return a.split("=", 1)[1]
    raise AssertionError(f"{name} not in {argv}")


def _cli_options(command: click.Command) -> set[str]:
    return {o for p in command.params for o in (*p.opts, *p.secondary_opts) if o.startswith("--")}


def _plugin_param_names() -> set[str]:
    """The RAILHOP_* names the plugin knows: its X-macro table plus the non-plugin names."""
    header = (REPO / "plugin" / "src" / "param.h").read_text(encoding="utf-8")
    names = set(re.findall(r"^\s*X\((\w+),", header, re.M))
    assert "RUN_DIR" in names, "param.h: X-macro table not found"
    source = (REPO / "plugin" / "src" / "param.c").read_text(encoding="utf-8")
    other = re.search(r"other_names\[\]\s*=\s*\{(.*?)\}", source, re.S)
    assert other is not None
    names |= set(re.findall(r'"(\w+)"', other.group(1)))
    return {f"RAILHOP_{n}" for n in names}


# --------------------------------------------------------------------------------------------
# structure shared by every manifest


@pytest.mark.parametrize("path", [AGENT_YAML, JOB_YAML], ids=lambda p: p.name)
def test_manifest_structure(path: Path) -> None:
    for doc in _docs(path):
        kind = doc.get("kind")
        assert kind in _API, f"{path.name}: unexpected kind {kind!r}"
        assert doc.get("apiVersion") == _API[kind], f"{kind}: apiVersion {doc.get('apiVersion')}"
        name = doc["metadata"]["name"]
        assert _DNS_SUBDOMAIN.match(name), f"{kind} name {name!r}"
        if kind in ("Namespace", "ConfigMap"):
            continue
        spec = doc["spec"]
        template = spec["template"]
        labels = template["metadata"]["labels"]
        if kind == "DaemonSet":
            selector = spec["selector"]["matchLabels"]
            assert selector.items() <= labels.items(), "selector must match the pod labels"
        pod = template["spec"]
        assert set(pod) <= _POD_FIELDS, f"unknown pod spec field(s) {set(pod) - _POD_FIELDS}"
        assert pod.get("dnsPolicy", "ClusterFirst") in {
            "ClusterFirst",
            "ClusterFirstWithHostNet",
            "Default",
            "None",
        }
        want_restart = {"Always"} if kind == "DaemonSet" else {"Never", "OnFailure"}
        assert pod.get("restartPolicy", "Always") in want_restart
        for t in pod.get("tolerations", []):
            assert set(t) <= _TOLERATION_FIELDS, t
            assert t.get("operator", "Equal") in {"Exists", "Equal"}
            assert t.get("effect", "") in {"", "NoSchedule", "PreferNoSchedule", "NoExecute"}
            assert t.get("operator") != "Exists" or not t.get("value"), t
        volumes = pod.get("volumes", [])
        vnames = [v["name"] for v in volumes]
        assert len(vnames) == len(set(vnames)), f"duplicate volume names {vnames}"
        for v in volumes:
            assert _DNS_LABEL.match(v["name"]), v["name"]
            sources = set(v) - {"name"}
            assert len(sources) == 1 and sources <= _VOLUME_SOURCES, f"volume {v}"
            if "hostPath" in v:
                assert v["hostPath"]["path"].startswith("/")
                assert v["hostPath"].get("type", "") in _HOSTPATH_TYPES
        cnames = [c["name"] for c in _containers(pod)]
        assert len(cnames) == len(set(cnames)), f"duplicate container names {cnames}"
        for c in _containers(pod):
            assert _DNS_LABEL.match(c["name"]) and c["image"], c["name"]
            unknown = set(c) - _CONTAINER_FIELDS
            assert not unknown, f"{c['name']}: unknown container field(s) {unknown}"
            assert c.get("imagePullPolicy", "IfNotPresent") in {"Always", "Never", "IfNotPresent"}
            for probe in ("livenessProbe", "readinessProbe", "startupProbe"):
                if probe in c:
                    assert set(c[probe]) <= _PROBE_FIELDS, f"{c['name']}.{probe}"
                    handlers = set(c[probe]) & {"exec", "httpGet", "tcpSocket", "grpc"}
                    assert len(handlers) == 1, f"{c['name']}.{probe}: one handler"
            mounts = c.get("volumeMounts", [])
            for m in mounts:
                assert set(m) <= _MOUNT_FIELDS, f"{c['name']}: volumeMount {m}"
                assert m.get("mountPropagation", "None") in {
                    "None",
                    "HostToContainer",
                    "Bidirectional",
                }
                assert m["name"] in vnames, (
                    f"{c['name']}: volumeMount of unknown volume {m['name']}"
                )
                assert m["mountPath"].startswith("/")
            paths_ = [m["mountPath"] for m in mounts]
            assert len(paths_) == len(set(paths_)), f"{c['name']}: a path is mounted twice"
            seen: set[str] = set()
            for e in c.get("env", []):
                assert _ENV_NAME.match(e["name"]) and e["name"] not in seen, e["name"]
                assert ("value" in e) != ("valueFrom" in e), f"env {e['name']}: value xor valueFrom"
                # $(VAR) is only expanded for variables defined earlier in the list
                for ref in re.findall(r"\$\((\w+)\)", str(e.get("value", ""))):
                    assert ref in seen, f"env {e['name']} uses $({ref}) before it is defined"
                seen.add(e["name"])
            for p in c.get("ports", []):
                assert 0 < p["containerPort"] < 65536 and len(p.get("name", "")) <= 15
            # every RAILHOP_* variable set in a manifest is one the plugin knows
            railhop_vars = {n for n in _env(c) if n.startswith("RAILHOP_")}
            assert railhop_vars <= _plugin_param_names(), railhop_vars - _plugin_param_names()


# --------------------------------------------------------------------------------------------
# the agent DaemonSet


def test_daemonset_privileges_and_mounts() -> None:
    ds, pod, agent = _agent()
    assert ds["metadata"]["namespace"] == "railhop"
    assert pod["hostNetwork"] is True and pod["hostPID"] is True
    assert pod["dnsPolicy"] == "ClusterFirstWithHostNet"
    # issue 19, 8: an explicit capability list, not privileged: true
    sc = agent["securityContext"]
    assert sc["privileged"] is False and sc["allowPrivilegeEscalation"] is False
    assert sc["capabilities"]["drop"] == ["ALL"]
    assert set(sc["capabilities"]["add"]) == {
        "BPF",
        "PERFMON",
        "NET_ADMIN",
        "SYS_RESOURCE",
        "CHOWN",
    }
    assert {t["key"] for t in pod["tolerations"]} >= {"nvidia.com/gpu"}

    def host(mount_path: str, read_only: bool) -> str:
        m = _mount(agent, mount_path)
        assert bool(m.get("readOnly")) is read_only, f"{mount_path}: readOnly should be {read_only}"
        v = _volume(pod, m["name"])
        assert "hostPath" in v, f"{mount_path} should come from the host"
        return str(v["hostPath"]["path"])

    assert host("/sys", read_only=True) == "/sys"
    for p in ("/sys/kernel/debug", "/sys/kernel/tracing", "/sys/fs/bpf", "/dev/infiniband"):
        assert host(p, read_only=False) == p
    for p in ("/lib/modules", "/usr/src"):
        assert host(p, read_only=True) == p
    assert host(RUN_DIR, read_only=False) == RUN_DIR
    run = _volume(pod, _mount(agent, RUN_DIR)["name"])
    assert run["hostPath"]["type"] == "DirectoryOrCreate"


def test_daemonset_env_resources_and_probes() -> None:
    _, _, agent = _agent()
    env = _env(agent)
    assert env["RAILHOP_RUN_DIR"] == RUN_DIR
    assert {"OTEL_SERVICE_NAME", "OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_RESOURCE_ATTRIBUTES"} <= set(
        env
    )
    for key in ("requests", "limits"):
        assert {"cpu", "memory"} <= set(agent["resources"][key])
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        cmd = agent[probe]["exec"]["command"]
        assert cmd == ["railhop", "status", "--check", "--run-dir", RUN_DIR]
    argv = [agent["command"][0], *agent["args"]]
    assert argv[:2] == ["railhop", "agent"]
    assert _option_value(argv, "--run-dir") == RUN_DIR
    metrics = int(_option_value(argv, "--metrics-port"))
    assert metrics in {p["containerPort"] for p in agent["ports"]}


def test_daemonset_policy_comes_from_the_configmap() -> None:
    docs = _docs(AGENT_YAML)
    _, pod, agent = _agent()
    policy_path = Path(_option_value(agent["args"], "--policy"))
    m = _mount(agent, str(policy_path.parent))
    assert m.get("readOnly") is True and "subPath" not in m, "subPath mounts miss updates"
    cm_name = _volume(pod, m["name"])["configMap"]["name"]
    cm = next(d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"] == cm_name)
    assert cm["metadata"]["namespace"] == _one(docs, "DaemonSet")["metadata"]["namespace"]
    text = cm["data"][policy_path.name]
    assert check_text(text, f"{AGENT_YAML.name}:{cm_name}") == []
    # the example is the shipped rail-optimized policy, kept in sync
    shipped = paths.policies_dir() / "rail-optimized-8nic.yaml"
    assert parse_policy(text, str(shipped)) == load_policy(shipped), f"out of sync with {shipped}"


def test_configmap_policy_rejected_when_broken() -> None:
    """The check above is not vacuous: the same text with one bad field fails validation."""
    cm = _one(_docs(AGENT_YAML), "ConfigMap")
    text = cm["data"]["policy.yaml"].replace("distance_limit: NODE", "distance_limit: FAR")
    issues = check_text(text)
    assert issues and any("distance_limit" in str(i) for i in issues)


def test_probe_command_follows_agent_liveness(tmp_path: Path) -> None:
    """Run the DaemonSet's probe (through a `railhop` shim on PATH) against real tables."""
    _, _, agent = _agent()
    probe = [
        str(tmp_path) if a == RUN_DIR else a for a in agent["livenessProbe"]["exec"]["command"]
    ]
    bindir = tmp_path / "bin"
    bindir.mkdir()
    shim = bindir / "railhop"
    shim.write_text(f'#!/bin/sh\nexec {shlex.quote(sys.executable)} -m railhop "$@"\n')
    shim.chmod(shim.stat().st_mode | stat.S_IXUSR)
    env = {
        **os.environ,
        "PATH": f"{bindir}:{os.environ.get('PATH', '/usr/bin:/bin')}",
        "PYTHONPATH": str(REPO / "agent"),
    }

    def probe_ok() -> bool:
        r = subprocess.run(probe, env=env, capture_output=True, timeout=60, check=False)
        return r.returncode == 0

    assert not probe_ok(), "no table yet: not alive"
    table = tmp_path / "health.tbl"
    stale = TableWriter(table, heartbeat_ms=100, clock=lambda: 1)
    stale.publish([NicHealth("nic0", NicState.UP, rail=0)], {})
    stale.close()
    assert not probe_ok(), "a table whose heartbeat stopped (crashed agent): not alive"
    w = TableWriter(table, heartbeat_ms=60_000)
    w.publish([NicHealth("nic0", NicState.UP, rail=0)], {})
    assert probe_ok(), "fresh heartbeat: alive"
    w.mark_gone()
    assert not probe_ok(), "agent shut down: not alive"
    w.close()


def test_cli_has_the_options_the_deployment_uses() -> None:
    status = cli.commands["status"]
    assert "--run-dir" in _cli_options(status)
    assert "--rccl" in _cli_options(cli.commands["plugin-path"])
    agent_cmd = cli.commands.get("agent")
    assert agent_cmd is not None, "`railhop agent` is not registered in railhop.cli"
    _, _, agent = _agent()
    used = set(_long_options(agent["args"])) | set(_long_options(_exec_start()))
    missing = used - _cli_options(agent_cmd)
    assert not missing, f"`railhop agent` has no option(s) {sorted(missing)}"


# --------------------------------------------------------------------------------------------
# the example job


def test_example_job_gets_plugin_and_run_dir() -> None:
    """Issue 30, 2: the job loads the plugin the DaemonSet installed on the node by the name
    form (NCCL >= 2.20), runs as a non-root uid in the agent's socket group, and mounts the
    library and run directories read-only; nothing copied, no absolute plugin path."""
    job = _one(_docs(JOB_YAML), "Job")
    pod = _pod_spec(job)
    assert "initContainers" not in pod
    (train,) = pod["containers"]
    env = _env(train)
    assert env["NCCL_NET_PLUGIN"] == "railhop"
    assert f"libnccl-net-{env['NCCL_NET_PLUGIN']}.so" == paths.NCCL_PLUGIN_NAME
    assert f"librccl-net-{env['NCCL_NET_PLUGIN']}.so" == paths.RCCL_PLUGIN_NAME
    # the library directory is what the agent's DaemonSet installs into, on the loader's path
    agent_pod = _pod_spec(_one(_docs(DEPLOY / "kubernetes" / "railhop-agent.yaml"), "DaemonSet"))
    (init,) = agent_pod["initContainers"]
    dest = init["command"][init["command"].index("--dest") + 1]
    assert init["command"][:2] == ["railhop", "plugin-install"]
    assert _volume(agent_pod, _mount(init, dest)["name"])["hostPath"]["path"] == dest
    lib = _volume(pod, _mount(train, dest)["name"])
    assert lib["hostPath"] == {"path": dest, "type": "Directory"}
    assert _mount(train, dest).get("readOnly") is True
    assert f"LD_LIBRARY_PATH={dest}" in " ".join(train["args"])
    # NCCL_NET names the plugin's net: the name the C tables export
    api = (REPO / "plugin" / "src" / "api_nccl.c").read_text(encoding="utf-8")
    assert set(re.findall(r'\.name\s*=\s*"([^"]+)"', api)) == {env["NCCL_NET"]}
    run = _volume(pod, _mount(train, RUN_DIR)["name"])
    assert run["hostPath"]["path"] == RUN_DIR
    # issue 19, 1: the job cannot truncate or replace the agent's files
    assert _mount(train, RUN_DIR).get("readOnly") is True
    assert run["hostPath"]["type"] == "Directory"
    # a non-root uid that reaches the socket through the supplementary group
    sc = pod["securityContext"]
    assert sc["runAsUser"] != 0 and sc["supplementalGroups"]


# --------------------------------------------------------------------------------------------
# the systemd unit


def _unit() -> dict[str, dict[str, list[str]]]:
    sections: dict[str, dict[str, list[str]]] = {}
    current: dict[str, list[str]] | None = None
    for raw in UNIT.read_text(encoding="utf-8").splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("["):
            current = sections.setdefault(line.strip("[]"), {})
            continue
        assert current is not None, f"{UNIT.name}: key outside a section: {line}"
        key, _, value = line.partition("=")
        current.setdefault(key.strip(), []).append(value.strip())
    return sections


def _exec_start() -> list[str]:
    (cmd,) = _unit()["Service"]["ExecStart"]
    return shlex.split(cmd)


def test_unit_contents() -> None:
    svc = _unit()["Service"]
    assert svc["Type"] == ["exec"]
    assert _exec_start() == [AGENT_BIN, "agent", "--policy", "/etc/railhop/policy.yaml"]
    assert svc["RuntimeDirectory"] == ["railhop"]
    assert svc["Restart"] == ["always"]
    assert any("RAILHOP_RUN_DIR=/run/railhop" in e for e in svc["Environment"])
    # hardening that would break eBPF, uprobes or verbs must stay off
    for key in ("ProtectKernelTunables", "PrivateDevices", "MemoryDenyWriteExecute", "ProtectProc"):
        assert key not in svc, f"{key} breaks the agent (see the comment in the unit)"
    caps = set(svc["CapabilityBoundingSet"][0].split())
    # issue 19, 8: the minimal set (main kept 14, CAP_SYS_ADMIN and CAP_DAC_OVERRIDE among them)
    assert caps == {"CAP_BPF", "CAP_PERFMON", "CAP_NET_ADMIN", "CAP_SYS_RESOURCE", "CAP_CHOWN"}
    assert svc["NoNewPrivileges"] == ["yes"]


def _verify(unit_text: str, tmp_path: Path) -> tuple[int, str]:
    """systemd-analyze verify on a copy of the unit whose ExecStart binary exists here."""
    exe = tmp_path / "bin" / "railhop"
    exe.parent.mkdir(exist_ok=True)
    exe.write_text("#!/bin/sh\nexit 0\n")
    exe.chmod(0o755)
    assert f"ExecStart={AGENT_BIN} " in unit_text
    copy = tmp_path / UNIT.name
    copy.write_text(unit_text.replace(f"ExecStart={AGENT_BIN} ", f"ExecStart={exe} "))
    r = subprocess.run(
        ["systemd-analyze", "verify", "--man=no", str(copy)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    # only complaints about our unit (the host's own units may have warnings of their own)
    ours = [
        ln
        for ln in (r.stdout + r.stderr).splitlines()
        if str(copy) in ln or ln.startswith(f"{UNIT.name}:")
    ]
    return r.returncode, "\n".join(ours)


def _require_systemd_analyze() -> None:
    require(shutil.which("systemd-analyze") is not None, "systemd-analyze not installed")


def test_unit_security_exposure_is_ok_or_better() -> None:
    """``systemd-analyze security`` rates the unit "OK" or better (exposure < 5.0)."""
    _require_systemd_analyze()
    r = subprocess.run(
        ["systemd-analyze", "security", "--offline=yes", str(UNIT)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    m = re.search(r"Overall exposure level for \S+: ([0-9.]+) (\w+)", r.stdout + r.stderr)
    assert m is not None, r.stdout + r.stderr
    assert float(m.group(1)) < 5.0 and m.group(2) in ("OK", "SAFE"), m.group(0)


def test_unit_passes_systemd_analyze_verify(tmp_path: Path) -> None:
    _require_systemd_analyze()
    rc, complaints = _verify(UNIT.read_text(encoding="utf-8"), tmp_path)
    assert rc == 0 and complaints == "", complaints


def test_systemd_analyze_verify_catches_mistakes(tmp_path: Path) -> None:
    """The verify above is meaningful: a misspelt key and a missing binary are reported."""
    _require_systemd_analyze()
    text = UNIT.read_text(encoding="utf-8")
    _, complaints = _verify(text.replace("RuntimeDirectory=", "RuntimeDirectroy="), tmp_path)
    assert "RuntimeDirectroy" in complaints
    missing = tmp_path / "missing"
    missing.mkdir()
    broken = missing / UNIT.name
    # the unit's binary moved where no machine has it (this one may have the real one)
    gone = f"/nonexistent-{uuid.uuid4().hex}/railhop"
    assert AGENT_BIN in text
    broken.write_text(text.replace(AGENT_BIN, gone))
    r = subprocess.run(
        ["systemd-analyze", "verify", "--man=no", str(broken)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert r.returncode != 0 and gone in r.stderr, r.stderr
