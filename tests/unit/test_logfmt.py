"""railhop.logfmt: the agent's log lines carry ISO 8601 UTC timestamps (ms), as text or JSON."""

from __future__ import annotations

import io
import json
import logging
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from railhop.logfmt import JsonFormatter, TextFormatter, configure, iso_utc, make_formatter

# 2026-12-05T06:09:29.123Z
ISO_MS_Z = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{3}Z$")


def record(msg: str, *args: object, **extra: object) -> logging.LogRecord:
    rec = logging.LogRecord("railhop.agent", logging.WARNING, "f.py", 1, msg, args, None)
    for k, v in extra.items():
        setattr(rec, k, v)
    rec.created = 1796451569.1239  # 2026-12-05T06:19:29.123Z
    return rec


def test_iso_utc_is_utc_with_milliseconds() -> None:
    assert iso_utc(0.0) == "1970-01-01T00:00:00.000Z"
    assert iso_utc(1796451569.1239) == "2026-12-05T06:19:29.123Z"
    assert iso_utc(1796451569.9999) == "2026-12-05T06:19:29.999Z"  # truncated, never .1000


def test_text_line() -> None:
    line = TextFormatter().format(record("nic %s down", "nic1"))
    assert line == "2026-12-05T06:19:29.123Z WARNING railhop.agent: nic nic1 down"


def test_json_line_has_the_fields_and_the_extras() -> None:
    line = JsonFormatter().format(record("nic %s down", "nic1", nic="nic1", pid=42, obj={1}))
    assert "\n" not in line
    doc = json.loads(line)
    assert doc == {
        "ts": "2026-12-05T06:19:29.123Z",
        "level": "WARNING",
        "logger": "railhop.agent",
        "msg": "nic nic1 down",
        "nic": "nic1",
        "pid": 42,
        "obj": "{1}",  # not JSON: written with str()
    }


def test_json_line_carries_the_exception() -> None:
    try:
        raise RuntimeError("boom")
    except RuntimeError:
        rec = logging.LogRecord("railhop.x", logging.ERROR, "f.py", 1, "failed", (), sys.exc_info())
    doc = json.loads(JsonFormatter().format(rec))
    assert doc["msg"] == "failed" and "RuntimeError: boom" in doc["exc"]
    assert ISO_MS_Z.match(doc["ts"])


def test_unknown_format_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown log format 'xml'"):
        make_formatter("xml")


@pytest.fixture
def restore_root_logger() -> Iterator[None]:
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    for h in list(root.handlers):
        root.removeHandler(h)
    for h in handlers:
        root.addHandler(h)
    root.setLevel(level)


def test_configure_replaces_handlers(restore_root_logger: None) -> None:
    configure(logging.INFO, "json")
    root = logging.getLogger()
    assert len(root.handlers) == 1 and isinstance(root.handlers[0].formatter, JsonFormatter)
    buf = io.StringIO()
    assert isinstance(root.handlers[0], logging.StreamHandler)
    root.handlers[0].setStream(buf)
    logging.getLogger("railhop.test").info("hello", extra={"nic": "nic0"})
    logging.getLogger("railhop.test").debug("not at INFO")
    lines = buf.getvalue().splitlines()
    assert len(lines) == 1
    doc = json.loads(lines[0])
    assert doc["msg"] == "hello" and doc["nic"] == "nic0" and ISO_MS_Z.match(doc["ts"])


@pytest.mark.parametrize("fmt", ["text", "json"])
def test_agent_logs_in_the_chosen_format(fmt: str, tmp_path: Path) -> None:
    """``railhop agent --log-format FMT`` (a short run on lo, sysfs source only): the agent's
    log lines are timestamped, one JSON object per line for json."""
    r = subprocess.run(
        [
            sys.executable,
            "-c",
            "from railhop.cli import main; main()",
            "agent",
            "--log-format",
            fmt,
            "--run-dir",
            str(tmp_path),
            "--nic",
            "lo",
            "--sources",
            "sysfs",
            "--duration",
            "0.3",
            "--no-traces",
            "--keep-capabilities",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert r.returncode == 0, r.stderr
    logged = [x for x in r.stderr.splitlines() if x.strip()]
    assert any("managing NICs lo" in x for x in logged), r.stderr
    for line in logged:
        if fmt == "json":
            doc = json.loads(line)
            assert ISO_MS_Z.match(doc["ts"]) and doc["level"] and doc["logger"], line
        else:
            ts, level, rest = line.split(" ", 2)
            assert ISO_MS_Z.match(ts) and level.isupper() and ": " in rest, line
