"""The railhop image (`make image`, scripts/build-image.sh) runs as the chart runs it: root with
the chart's capability list (read from the rendered DaemonSet, not copied) and the chart's
hostPath mounts that exist here. Inside it, `railhop sources --json` attaches what the same
command attaches on this host, and `railhop status --json` reads a live agent started in the
image. Marker `image`: `make image` first, then `pytest -m image tests/image` (.ci/run does
both after `make test`); `make test` leaves these out."""

from __future__ import annotations

import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from conftest import require

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "deploy" / "helm" / "railhop"
DGX = REPO / "tests" / "fixtures" / "sys" / "dgx-h100"
VERSION = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
IMAGE = os.environ.get("RAILHOP_IMAGE", f"localhost/railhop:{VERSION}")
# runc: crun refuses hosts whose cgroup v2 hierarchy holds controllers beside v1 ("hybrid")
RUNTIME = os.environ.get("RAILHOP_OCI_RUNTIME", "runc")

pytestmark = pytest.mark.image


def _limits() -> list[str]:
    """rlimits for `podman run`: podman's defaults (nofile 1M) need CAP_SYS_RESOURCE outside
    the container, which sandboxed build machines withhold; take this process's own."""
    nofile = resource.getrlimit(resource.RLIMIT_NOFILE)
    nproc = resource.getrlimit(resource.RLIMIT_NPROC)

    def cap(v: int) -> int:
        return 4096 if v == resource.RLIM_INFINITY else min(v, 4096)

    return [
        *("--ulimit", f"nofile={nofile[0]}:{nofile[1]}"),
        *("--ulimit", f"nproc={cap(nproc[0])}:{cap(nproc[1])}"),
    ]


def _podman(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    if args[0] == "run":
        args = ("run", *_limits(), *args[1:])
    return subprocess.run(
        ["podman", "--runtime", RUNTIME, *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


@pytest.fixture(scope="module")
def image() -> str:
    require(os.geteuid() == 0, "the image test runs podman as root")
    require(shutil.which("podman") is not None, "no podman: `make setup` installs it")
    require(
        _podman("image", "exists", IMAGE).returncode == 0, f"no image {IMAGE}: run `make image`"
    )
    return IMAGE


def _daemonset() -> dict[str, Any]:
    helm = Path(sys.executable).parent / "helm"
    require(helm.exists(), "no helm: `make setup` installs it into .venv/bin")
    r = subprocess.run(
        [str(helm), "template", "rh", str(CHART)],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    (ds,) = [d for d in yaml.safe_load_all(r.stdout) if d and d["kind"] == "DaemonSet"]
    assert isinstance(ds, dict)
    return ds


def _bounding_caps() -> set[str]:
    """Capabilities this process may hand on (a container cannot get one beyond them)."""
    names = {0: "CHOWN", 12: "NET_ADMIN", 24: "SYS_RESOURCE", 38: "PERFMON", 39: "BPF"}
    names |= {21: "SYS_ADMIN", 19: "SYS_PTRACE", 13: "NET_RAW"}
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("CapBnd:"):
            mask = int(line.split()[1], 16)
            return {n for bit, n in names.items() if mask >> bit & 1}
    return set()


def chart_run_args(run_dir: Path) -> list[str]:
    """`podman run` arguments that give the container what the chart's agent container gets:
    its capabilities (those this host lets us hand on), the host network and PID namespace,
    the hostPath mounts that exist here (the run directory: ``run_dir``)."""
    ds = _daemonset()
    pod = ds["spec"]["template"]["spec"]
    (agent,) = [c for c in pod["containers"] if c["name"] == "agent"]
    sc = agent["securityContext"]
    assert sc["capabilities"]["drop"] == ["ALL"] and sc["privileged"] is False
    caps = list(sc["capabilities"]["add"])
    usable = _bounding_caps()
    missing = [c for c in caps if c not in usable]
    if missing:  # e.g. SYS_RESOURCE withheld from a sandboxed build machine: say so
        print(f"capabilities not in this host's bounding set, left out: {missing}")
    args = ["--cap-drop", "ALL"]
    for c in caps:
        if c in usable:
            args += ["--cap-add", c]
    args += ["--security-opt", "no-new-privileges", "--user", str(sc["runAsUser"])]
    # The chart asks for seccompProfile RuntimeDefault: the cluster runtime's own profile.
    # podman 4.3's default profile refuses bpf() without CAP_SYS_ADMIN (the eBPF sources then
    # report "no privilege"), so it does not stand for a cluster's; run without a profile
    # here. docs/limits.md: whether RuntimeDefault lets CAP_BPF through is for a real cluster.
    assert sc["seccompProfile"] == {"type": "RuntimeDefault"}
    args += ["--security-opt", "seccomp=unconfined"]
    if pod.get("hostNetwork"):
        args += ["--network", "host"]
    if pod.get("hostPID"):
        args += ["--pid", "host"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    run_path = agent["env"][0]["value"]
    for m in agent["volumeMounts"]:
        v = volumes[m["name"]]
        if "hostPath" not in v:
            continue
        src = v["hostPath"]["path"]
        if src == run_path:
            src = str(run_dir)
        elif not os.path.exists(src):
            continue
        ro = ",ro" if m.get("readOnly") else ""
        args += ["-v", f"{src}:{m['mountPath']}:rbind{ro}"]
    return args


def sources_report(out: str) -> dict[tuple[str, str], str]:
    """(source, hook) -> status, from `railhop sources --json`: one document (a list, or an
    object holding the list) or JSON lines, whichever the CLI prints."""
    try:
        docs: Any = json.loads(out)
    except ValueError:
        docs = [json.loads(line) for line in out.splitlines() if line.strip()]
    if isinstance(docs, dict):
        docs = next(v for v in docs.values() if isinstance(v, list))
    return {(d["source"], d["hook"]): d["status"] for d in docs}


@pytest.fixture
def run_dir() -> Iterator[Path]:
    d = Path(tempfile.mkdtemp(prefix="rh_image."))
    (d / "run").mkdir(mode=0o755)
    try:
        yield d / "run"
    finally:
        shutil.rmtree(d, ignore_errors=True)


def test_the_image_holds_the_agent_and_both_plugin_names(image: str, run_dir: Path) -> None:
    r = _podman("run", "--rm", *chart_run_args(run_dir), image, "--version")
    assert r.returncode == 0, r.stderr
    assert VERSION in r.stdout
    for flag in ([], ["--rccl"]):
        r = _podman("run", "--rm", "--entrypoint", "railhop", image, "plugin-path", *flag)
        assert r.returncode == 0, r.stderr
        assert r.stdout.strip().endswith(
            ("libnccl-net-railhop.so", "librccl-net-railhop.so")[bool(flag)]
        )
    r = _podman("run", "--rm", "--entrypoint", "python3", image, "-c", "import bcc, pyverbs")
    assert r.returncode == 0, r.stderr


def test_plugin_install_from_the_image(image: str, run_dir: Path) -> None:
    """What the DaemonSet's initContainer runs: both names land in the host directory."""
    dest = run_dir.parent / "lib"
    dest.mkdir()
    r = _podman(
        "run", "--rm", "--cap-drop", "ALL", "-v", f"{dest}:/opt/railhop/lib",
        image, "plugin-install", "--dest", "/opt/railhop/lib",
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert sorted(p.name for p in dest.iterdir()) == [
        "libnccl-net-railhop.so",
        "librccl-net-railhop.so",
    ]
    assert (dest / "libnccl-net-railhop.so").read_bytes()[:4] == b"\x7fELF"


def test_sources_attach_in_the_image_as_on_the_host(image: str, run_dir: Path) -> None:
    host = subprocess.run(
        [sys.executable, "-m", "railhop", "sources", "--json"],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    r = _podman("run", "--rm", *chart_run_args(run_dir), image, "sources", "--json")
    assert r.stdout.strip(), r.stderr
    inside = sources_report(r.stdout)
    outside = sources_report(host.stdout)
    assert inside.get(("netlink", "rtnl_link")) == "attached", inside
    # every kernel hook (eBPF, netlink) that attaches on this host attaches in the container
    kernel = {k for k, v in outside.items() if v == "attached" and k[0].split(".")[0] in
              ("ebpf", "netlink")}  # fmt: skip
    assert kernel, outside
    not_inside = sorted(k for k in kernel if inside.get(k) != "attached")
    assert not not_inside, f"attach on the host but not in the image: {not_inside}\n{r.stderr}"


def test_status_reads_a_live_agent_in_the_image(image: str, run_dir: Path) -> None:
    name = f"railhop-image-test-{os.getpid()}"
    r = _podman(
        "run", "-d", "--name", name, *chart_run_args(run_dir),
        "-v", f"{DGX}:/fixture:ro", image,
        "agent", "--root", "/fixture", "--run-dir", "/run/railhop", "--sources", "",
        "--no-traces", "--policy", "/etc/railhop/policies/rail-optimized-8nic.yaml",
        "--duration", "120",
    )  # fmt: skip
    assert r.returncode == 0, r.stderr
    try:
        deadline = time.monotonic() + 60
        while True:
            st = _podman("exec", name, "railhop", "status", "--json", timeout=60)
            if st.returncode == 0:
                break
            logs = _podman("logs", name).stderr
            assert time.monotonic() < deadline, f"no live agent: {st.stderr}\n{logs}"
            time.sleep(0.2)
        doc = json.loads(st.stdout)
        assert doc["agent"]["alive"] is True
        names = {n["ifname"] for n in doc["nics"]}
        assert {"ibp25s0", "ibp59s0"} <= names, names
        # the same table read from the host side of the run directory
        host = subprocess.run(
            [sys.executable, "-m", "railhop", "status", "--json", "--run-dir", str(run_dir)],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert host.returncode == 0, host.stderr
        assert {n["ifname"] for n in json.loads(host.stdout)["nics"]} == names
    finally:
        _podman("rm", "-f", "-t", "5", name)
    # no agent: status --json exits 1 (with or without an error document on stdout)
    r = _podman("run", "--rm", image, "status", "--json", "--run-dir", "/tmp/none")
    assert r.returncode == 1, r
    if r.stdout.strip():
        assert "error" in json.loads(r.stdout)
