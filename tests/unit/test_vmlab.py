"""The VM lab's pure parts (railhop_lab.vmlab) and its guest runner (railhop_lab.vmguest)."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from conftest import SESSION_MARK_ENV, processes_marked, until
from railhop_lab import vmguest
from railhop_lab.vmlab import (
    VmLabError,
    blackhole_script,
    find_guest_kernel,
    guest_setup_script,
    mac_address,
    plan_lab,
    qemu_opts,
    rail_probe_program,
    run_group,
    vng_argv,
)


def _kernel(boot: Path, mods: Path, release: str, rxe: str | None = "m") -> None:
    (boot / f"vmlinuz-{release}").write_bytes(b"")
    cfg = "CONFIG_FOO=y\n" + (f"CONFIG_RDMA_RXE={rxe}\n" if rxe else "")
    (boot / f"config-{release}").write_text(cfg)
    (mods / release).mkdir()


def test_find_guest_kernel_takes_the_newest_with_rxe(tmp_path: Path) -> None:
    boot, mods = tmp_path / "boot", tmp_path / "mods"
    boot.mkdir()
    mods.mkdir()
    _kernel(boot, mods, "6.1.0-9-amd64")
    _kernel(boot, mods, "6.1.0-57-amd64")  # newer than -9 by version, older by string order
    _kernel(boot, mods, "6.12.0-1-amd64", rxe=None)  # newest, but no rxe
    assert find_guest_kernel(boot, mods) == boot / "vmlinuz-6.1.0-57-amd64"


def test_find_guest_kernel_explains_why_none(tmp_path: Path) -> None:
    boot, mods = tmp_path / "boot", tmp_path / "mods"
    boot.mkdir()
    mods.mkdir()
    _kernel(boot, mods, "6.12.0-1-amd64", rxe=None)
    (boot / "vmlinuz-6.2.0-1-amd64").write_bytes(b"")  # no config
    with pytest.raises(VmLabError, match=r"no CONFIG_RDMA_RXE.*no config-6\.2|no config-6\.2"):
        find_guest_kernel(boot, mods)
    with pytest.raises(VmLabError, match="no vmlinuz"):
        find_guest_kernel(tmp_path / "empty", mods)


def test_plan_shape_and_addresses() -> None:
    plan = plan_lab(2, 4, [20000, 20001, 20002, 20003])
    assert [lk.port for lk in plan.links] == [20000, 20001, 20002, 20003]
    assert plan.nic(1, 3).address == "10.77.3.2" and plan.nic(0, 0).ifname == "nic0"
    assert plan.peer(0) == 1 and plan.peer(1) == 0
    with pytest.raises(VmLabError, match="exactly 2"):
        plan_lab(3, 4, [1, 2, 3, 4])
    with pytest.raises(VmLabError, match="ports"):
        plan_lab(2, 2, [20000])
    with pytest.raises(VmLabError, match="no NIC 4"):
        plan.nic(0, 4)


def test_qemu_opts_listen_on_node0_connect_on_node1(tmp_path: Path) -> None:
    plan = plan_lab(2, 2, [20000, 20001])
    a = qemu_opts(plan, 0, tmp_path / "q0")
    b = qemu_opts(plan, 1, tmp_path / "q1")
    assert "socket,id=rail1,listen=127.0.0.1:20001" in a
    assert "socket,id=rail1,connect=127.0.0.1:20001" in b
    assert f"virtio-net-pci,netdev=rail0,id=railnic0,mac={mac_address(1, 0)}" in b
    assert a[-2:] == ["-qmp", f"unix:{tmp_path / 'q0'},server=on,wait=off"]
    # nothing that reaches the host's network
    assert not any("tap" in o or "bridge" in o or o.startswith("user") for o in a + b)


def test_vng_argv_disables_kvm_and_runs_the_runner(tmp_path: Path) -> None:
    argv = vng_argv(
        "vng",
        Path("/boot/vmlinuz-x"),
        kvm=False,
        shared=tmp_path,
        runner_dir=tmp_path / "node0",
        extra_qemu=["-qmp", "unix:/x y,server=on"],
    )
    assert "--disable-kvm" in argv and argv[argv.index("--cpus") + 1] == "1"
    assert "--qemu-opts=-qmp 'unix:/x y,server=on'" in argv
    assert argv[-1].endswith(f"vmguest.py {tmp_path / 'node0'}")
    assert "--disable-kvm" not in vng_argv(
        "vng", Path("/k"), kvm=True, shared=tmp_path, runner_dir=tmp_path, extra_qemu=[]
    )


def test_guest_setup_script_per_nic() -> None:
    plan = plan_lab(2, 2, [20000, 20001])
    s = guest_setup_script(plan, 1)
    assert "modprobe rdma_rxe" in s
    assert f"'^{mac_address(1, 1)}$'" in s and "name nic1" in s
    assert "ip addr add 10.77.1.2/24 dev nic1" in s
    assert "ip route add 10.77.1.0/24 dev nic1 src 10.77.1.2 table 101" in s
    assert "ip rule add from 10.77.1.2/32 table 101 priority 1001" in s
    assert "rdma link add rxe1 type rxe netdev nic1" in s
    assert "sysctl -qw net.ipv4.conf.nic0.arp_ignore=1" in s
    assert "default via" not in s and "route add default" not in s
    assert "egress matchall action drop" in blackhole_script("nic1")


def _wait_file(path: Path, timeout: float = 10.0) -> dict[str, object]:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert time.monotonic() < deadline, f"no {path}"
        time.sleep(0.02)
    out: dict[str, object] = json.loads(path.read_text())
    return out


def test_runner_runs_jobs_kills_and_stops(tmp_path: Path) -> None:
    runner = vmguest.Runner(tmp_path)
    t = threading.Thread(target=runner.serve, daemon=True)
    t.start()
    try:
        _wait_file(tmp_path / "ready")
        job = {"argv": ["/bin/sh", "-c", "echo $X; echo e >&2; exit 3"], "env": {"X": "hi"}}
        vmguest.write_atomic(tmp_path / "cmd" / "a.json", job)
        r = _wait_file(tmp_path / "res" / "a.json")
        assert (r["rc"], r["stdout"], r["stderr"], r["timed_out"]) == (3, "hi\n", "e\n", False)
        vmguest.write_atomic(tmp_path / "cmd" / "b.json", {"argv": ["sleep", "30"], "timeout": 0.3})
        r = _wait_file(tmp_path / "res" / "b.json")
        assert r["timed_out"] is True and r["rc"] == -9
        out = tmp_path / "c.out"
        vmguest.write_atomic(
            tmp_path / "cmd" / "c.json",
            {"argv": ["sh", "-c", "echo x; sleep 30"], "stdout": str(out)},
        )
        deadline = time.monotonic() + 10
        while not (out.exists() and out.read_text() == "x\n"):
            assert time.monotonic() < deadline, "streamed output not seen"
            time.sleep(0.02)
        vmguest.write_atomic(tmp_path / "cmd" / "k.json", {"kill": "c"})
        r = _wait_file(tmp_path / "res" / "c.json")
        assert r["rc"] == -9 and r["timed_out"] is False
        vmguest.write_atomic(tmp_path / "cmd" / "d.json", {"argv": ["/no/such/binary"]})
        r = _wait_file(tmp_path / "res" / "d.json")
        assert r["rc"] is None and "FileNotFoundError" in str(r["error"])
    finally:
        (tmp_path / "stop").write_text("{}")
        t.join(10)
    assert not t.is_alive()


def test_rail_probe_program_tells_a_refusal_from_a_failure() -> None:
    """The rail probe's program, run here on loopback: a refused connect is a round trip ("ok");
    a source address this host does not have fails with its errno name; each rail on its line."""
    prog = rail_probe_program([(0, "127.0.0.1", "127.0.0.1"), (3, "192.0.2.77", "127.0.0.1")], 2.0)
    r = subprocess.run(
        [sys.executable, "-c", prog], check=False, capture_output=True, text=True, timeout=30
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == ["0 ok", "3 EADDRNOTAVAIL"], r.stdout


# --- run_group: the KVM probe's bounded run ----------------------------------------------------


def _group_env(tag: str) -> dict[str, str]:
    import os

    return {**os.environ, SESSION_MARK_ENV: f"run-group-{tag}-{os.getpid()}"}


def gone(env: dict[str, str]) -> None:
    """Every process of the group died (SIGKILLed members exit asynchronously: a short wait)."""
    until(
        lambda: processes_marked(env[SESSION_MARK_ENV]) == [],
        5,
        lambda: f"the group is gone (left: {processes_marked(env[SESSION_MARK_ENV])})",
    )


def test_run_group_kills_the_whole_group_on_timeout() -> None:
    """vng starting QEMU, in small: the leader's child must die with it when the bound passes
    (subprocess.run(timeout=) kills the leader only; a KVM probe's guest once ran 87 minutes)."""
    env = _group_env("timeout")
    t0 = time.monotonic()
    rc = run_group(["sh", "-c", "sleep 60 & sleep 60"], 1.0, env=env)
    assert rc is None
    assert time.monotonic() - t0 < 10
    gone(env)


def test_run_group_returns_the_status_and_leaves_nothing() -> None:
    env = _group_env("exit")
    assert run_group(["sh", "-c", "sleep 60 & exit 3"], 30.0, env=env) == 3
    gone(env)
