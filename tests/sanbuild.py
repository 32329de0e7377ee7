"""Sanitizer builds of the plugin and the harness from this tree, for the privileged suites.

``sanitizer_build("address")`` reuses ``build/ctest-address`` (``make ctest`` configures and
builds it before pytest runs); ``"thread"`` configures ``build/ctest-thread`` the same way
(``make ctest-tsan``). Only the plugin and the harness are built (incremental: a second call
is quick). ``RAILHOP_<KIND>_PLUGIN_PATH`` / ``RAILHOP_<KIND>_HARNESS_PATH`` (KIND ASAN, TSAN)
point at other builds instead.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from conftest import require

REPO = Path(__file__).resolve().parents[1]
KINDS = {"address": "ASAN", "thread": "TSAN"}

# One runtime option set per kind: a report fails the process (exit status), nothing else
# changes its behaviour. Leak checking stays off: a torch-like exit leaves the plugin's memory
# in use by design (tests/privileged/test_nccl_order.py checks the exit itself).
SANITIZER_ENV = {
    "address": {"ASAN_OPTIONS": "detect_leaks=0:halt_on_error=1:exitcode=86:abort_on_error=0"},
    "thread": {"TSAN_OPTIONS": "halt_on_error=0:exitcode=66:second_deadlock_stack=1"},
}
REPORT_MARKERS = ("ERROR: AddressSanitizer", "WARNING: ThreadSanitizer", "ERROR: ThreadSanitizer")


def sanitizer_build(kind: str) -> tuple[Path, Path]:
    """(plugin, harness) of a ``kind`` sanitizer build (cmake + ninja, incremental)."""
    env = KINDS[kind]
    plugin = os.environ.get(f"RAILHOP_{env}_PLUGIN_PATH")
    harness = os.environ.get(f"RAILHOP_{env}_HARNESS_PATH")
    if plugin and harness:
        return Path(plugin), Path(harness)
    require(bool(shutil.which("cmake") and shutil.which("ninja")), "cmake and ninja")
    build = REPO / "build" / f"ctest-{kind}"
    if not (build / "build.ninja").is_file():
        subprocess.run(
            [
                "cmake",
                "-S",
                str(REPO),
                "-B",
                str(build),
                "-G",
                "Ninja",
                "-DRAILHOP_BUILD_TESTS=ON",
                f"-DRAILHOP_SANITIZE={kind}",
                "-DCMAKE_BUILD_TYPE=RelWithDebInfo",
            ],
            check=True,
            capture_output=True,
            timeout=300,
        )
    subprocess.run(
        ["cmake", "--build", str(build), "--target", "nccl-net-railhop", "railhop-harness"],
        check=True,
        capture_output=True,
        timeout=900,
    )
    return build / "plugin" / "libnccl-net-railhop.so", build / "plugin" / "railhop-harness"


def sanitizer_reports(text: str) -> list[str]:
    """The sanitizer report lines in a process's stderr."""
    return [line for line in text.splitlines() if any(m in line for m in REPORT_MARKERS)]
