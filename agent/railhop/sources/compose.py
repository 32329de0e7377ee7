"""The program text bcc compiles for a probe: its preludes, then the probe file, with fragments
composed in.

bcc rewrites map calls (``rh_events.ringbuf_reserve(...)``) and USDT argument reads
(``bpf_usdt_readarg``) only in the text it is given, never in an ``#include``d header, so code
that several probes share cannot live in a header. Instead the loader builds the text: the
ProbeSpec's prelude files (``bpf/rh_ringbuf.c``: ring buffer, drop counter, ``RH_RESERVE``) in
order, then the probe file, where each line ``// @railhop-include "<file>"`` is replaced by that
file's text (``bpf/rh_usdt_lane.c``, once per lane probe). ``#line`` directives keep compiler
messages pointing at the real files and lines. No C is generated: only files are put together.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path

from railhop.sources.base import SourceError

INCLUDE = re.compile(r'^\s*//\s*@railhop-include\s+"([A-Za-z0-9_.-]+)"\s*$')
MAX_DEPTH = 4


class ComposeError(SourceError):
    """A prelude or fragment is missing, or fragments include each other too deeply."""


def _read(bpf_dir: Path, name: str) -> str:
    if "/" in name or name.startswith("."):
        raise ComposeError(f"bad file name {name!r}: want a file in {bpf_dir}")
    try:
        return (bpf_dir / name).read_text()
    except OSError as e:
        raise ComposeError(f"{bpf_dir / name}: {e.strerror}") from e


def _expand(bpf_dir: Path, name: str, depth: int) -> list[str]:
    if depth > MAX_DEPTH:
        raise ComposeError(f"{name}: fragments nested deeper than {MAX_DEPTH}")
    out = [f'#line 1 "{name}"']
    for n, line in enumerate(_read(bpf_dir, name).splitlines(), start=1):
        m = INCLUDE.match(line)
        if m is None:
            out.append(line)
            continue
        out += _expand(bpf_dir, m.group(1), depth + 1)
        out.append(f'#line {n + 1} "{name}"')
    return out


def compose(bpf_dir: Path, file: str, preludes: Sequence[str] = ()) -> str:
    """The text of ``file`` (under ``bpf_dir``) as bcc must compile it."""
    lines = ["#define RH_COMPOSED 1"]
    for p in (*preludes, file):
        lines += _expand(bpf_dir, p, 0)
    return "\n".join(lines) + "\n"
