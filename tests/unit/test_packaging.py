"""What ships to a node is the agent: the lab (emulated fabric, harness driver, scenarios, demo,
PNG rendering) is its own distribution (``lab/``, package ``railhop_lab``) that adds ``railhop
demo`` through an entry point, and the agent works without it."""

from __future__ import annotations

import ast
import platform
import re
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest
from click.testing import CliRunner

from railhop.cli import COMMANDS_GROUP, _missing_lab_command, cli

REPO = Path(__file__).resolve().parents[2]
AGENT = REPO / "agent" / "railhop"
LAB = REPO / "lab"
LAB_MODULES = {"fabric", "harness", "demo", "scenario", "render", "soak"}


def _pyproject(path: Path) -> dict[str, object]:
    with path.open("rb") as f:
        return tomllib.load(f)


def test_the_agent_wheel_is_built_from_the_agent_package_only() -> None:
    """The wheel's Python content is what ``wheel.packages`` names (scikit-build-core); the
    CMake part installs the plugin, the harness program, bpf sources and policies."""
    sk = _pyproject(REPO / "pyproject.toml")["tool"]["scikit-build"]  # type: ignore[index]
    assert sk["wheel"]["packages"] == ["agent/railhop"]
    assert not (REPO / "agent" / "railhop_lab").exists()


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The wheel built as the node image does (``pip wheel . --no-deps``; the CMake build
    directory of ``make setup`` is reused: seconds)."""
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(out), str(REPO)],
        check=True,
        capture_output=True,
        timeout=600,
    )
    (whl,) = out.glob("railhop-*.whl")
    return whl


def _glibc_needed(data: bytes, tmp: Path) -> tuple[int, int]:
    """The newest GLIBC_x.y symbol version an ELF file imports (``objdump -T``)."""
    f = tmp / "elf"
    f.write_bytes(data)
    out = subprocess.run(
        ["objdump", "-T", str(f)], check=True, capture_output=True, text=True, timeout=60
    ).stdout
    found = {tuple(int(x) for x in v.split(".")[:2]) for v in re.findall(r"GLIBC_([0-9.]+)", out)}
    assert found, out[:500]
    return max(found)  # type: ignore[return-value]


def test_the_wheel_is_py3_none_manylinux_and_its_binaries_need_no_newer_glibc(
    wheel: Path, tmp_path: Path
) -> None:
    """The plugin does not link libpython: one wheel serves every CPython 3. Its platform tag
    names the glibc its binaries need; a binary that needs a newer one fails here."""
    if platform.machine() != "x86_64":
        pytest.fail(f"the wheel's tag is pinned for x86_64 only (machine {platform.machine()})")
    name = wheel.name
    m = re.fullmatch(r"railhop-[^-]+-py3-none-manylinux_(\d+)_(\d+)_x86_64\.whl", name)
    assert m, name
    tagged = (int(m.group(1)), int(m.group(2)))
    z = zipfile.ZipFile(wheel)
    assert (
        "Tag: py3-none-manylinux_"
        in z.read(next(n for n in z.namelist() if n.endswith(".dist-info/WHEEL"))).decode()
    )
    bins = [n for n in z.namelist() if n.endswith(".so") or n.endswith("railhop-harness")]
    assert {Path(n).name for n in bins} >= {"libnccl-net-railhop.so", "librccl-net-railhop.so"}
    for n in bins:
        data = z.read(n)
        needed = _glibc_needed(data, tmp_path)
        assert needed <= tagged, f"{n} needs GLIBC_{needed}, the wheel says {tagged}"
        assert b"libpython" not in data, f"{n} links libpython"
        f = tmp_path / "needed"
        f.write_bytes(data)
        dyn = subprocess.run(
            ["objdump", "-p", str(f)], check=True, capture_output=True, text=True, timeout=60
        ).stdout
        needed_libs = set(re.findall(r"NEEDED\s+(\S+)", dyn))
        # libc and OpenSSL 3's libcrypto (the handshake HMAC) only: both in the usual images
        assert needed_libs <= {"libc.so.6", "libcrypto.so.3", "libm.so.6"}, (n, needed_libs)
    # the tag is no looser than needed either: it is the newest version some binary imports
    assert max(_glibc_needed(z.read(n), tmp_path) for n in bins) == tagged


def test_the_built_agent_wheel_holds_no_lab_code(wheel: Path) -> None:
    """Reads the built wheel's file list."""
    names = zipfile.ZipFile(wheel).namelist()
    py = {n for n in names if n.endswith(".py")}
    assert "railhop/daemon/loop.py" in py and "railhop/cli.py" in py
    assert not [n for n in names if n.startswith("railhop_lab")]
    assert not [n for n in py if Path(n).stem in LAB_MODULES], sorted(py)
    assert "railhop/data/bpf/carrier.bpf.c" in names
    assert not [n for n in names if n.endswith("blackhole.bpf.c")]  # a test helper


def test_no_lab_module_in_the_agent_package() -> None:
    found = sorted(str(p.relative_to(AGENT)) for p in AGENT.rglob("*.py") if p.stem in LAB_MODULES)
    assert found == [], f"lab modules inside the agent package: {found}"


def test_the_agent_never_imports_the_lab() -> None:
    """The agent reaches lab commands only through the entry-point group, never by name."""
    bad = []
    for p in AGENT.rglob("*.py"):
        for node in ast.walk(ast.parse(p.read_text(), str(p))):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module]
            bad += [
                f"{p.relative_to(AGENT)}: {n}" for n in names if n.split(".")[0] == "railhop_lab"
            ]
    assert bad == []


def test_the_lab_is_its_own_distribution_registering_demo() -> None:
    lab = _pyproject(LAB / "pyproject.toml")["project"]
    assert lab["name"] == "railhop-lab"  # type: ignore[index]
    assert "railhop" in lab["dependencies"]  # type: ignore[index]
    eps = lab["entry-points"][COMMANDS_GROUP]  # type: ignore[index]
    assert eps == {"demo": "railhop_lab.cli:demo_cmd"}
    assert {p.stem for p in (LAB / "railhop_lab").glob("*.py")} >= LAB_MODULES


def test_the_node_image_does_not_carry_the_lab() -> None:
    """scripts/build-image.sh installs the railhop wheel only (pip wheel . / install railhop)."""
    script = (REPO / "scripts" / "build-image.sh").read_text()
    assert "railhop_lab" not in script and "./lab" not in script and "railhop-lab" not in script


def test_demo_comes_from_the_installed_lab() -> None:
    from railhop_lab.cli import demo_cmd

    assert cli.commands["demo"] is demo_cmd
    out = CliRunner().invoke(cli, ["demo", "--help"])
    assert out.exit_code == 0 and "--rate-mbit" in out.output


def test_without_the_lab_demo_says_how_to_get_it() -> None:
    out = CliRunner().invoke(_missing_lab_command("demo", "x"), ["--quick", "--out", "d"])
    assert out.exit_code == 2
    assert "railhop-lab" in out.output and "pip install ./lab" in out.output


def test_the_cli_without_the_lab_installed() -> None:
    """A process whose environment has no lab: `railhop demo` exits 2 with the hint, the
    agent's commands still work."""
    code = (
        "import importlib.metadata as m, sys\n"
        "real = m.entry_points\n"
        "m.entry_points = lambda **kw: (\n"
        "    [] if kw.get('group') == 'railhop.commands' else real(**kw))\n"
        "sys.modules['railhop_lab'] = None  # importing it raises ImportError\n"
        "from railhop.cli import main\n"
        "sys.argv = ['railhop', *sys.argv[1:]]\n"
        "main()\n"
    )

    def railhop(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-c", code, *args],
            check=False,
            capture_output=True,
            text=True,
            timeout=60,
        )

    demo = railhop("demo", "--quick")
    assert demo.returncode == 2, demo.stderr
    assert "part of the railhop lab" in demo.stderr and "pip install ./lab" in demo.stderr
    topo = railhop("topology", "--root", str(REPO / "tests" / "fixtures" / "sys" / "dgx-h100"))
    assert topo.returncode == 0 and "ibp25s0" in topo.stdout, topo.stderr
