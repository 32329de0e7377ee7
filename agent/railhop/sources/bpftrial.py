"""Child process that tries to compile, load and attach BPF hook variants with bcc.

bcc compiles in-process and some failures abort the whole process (an LLVM assertion, see
research/ebpf-rdma.md §5.5), so the agent never tries an unproven variant in its own process:
it runs ``python -m railhop.sources.bpftrial`` with a JSON request on stdin and reads JSON lines
back. Request::

    {"src": "/abs/probe.bpf.c", "base": [cflags], "chosen": [[cflags], ...],
     "hooks": [[{"i": 0, "cflags": [...]}, ...], ...],
     "usdt": null | {"path": ..., "probes": [[probe, fn]]},
     "text": null | "<the composed program (sources/compose.py); else src is compiled>",
     "together": false | true}

With ``together``, the first candidate of every hook is first tried in one program with
``chosen`` (``{"start": -2}``): when that loads, each of them is reported done and the whole
as combined, one compile instead of one per hook plus one (a bcc compile takes about 95 s on an
emulated CPU); when it fails (``{"together": false, "err": "..."}``), the hooks are tried one
by one as below.

For each hook its candidates are tried in order until one loads (``{"start": i}`` then
``{"done": i, "ok": true|false, "err": "..."}``); finally all winners plus ``chosen`` are loaded
together (``{"combined": true|false, "err": "..."}``). A line ``{"start": i}`` without its
``done`` means the child died on candidate i. bcc's C diagnostics go to stderr, each attempt's
preceded by a line ``@@railhop-trial <i>``.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

MARK = "@@railhop-trial "
TOGETHER = -2  # the marker and "start" index of the all-first-candidates attempt


def _mark(i: int) -> None:
    """Separate the C diagnostics (bcc writes them to fd 2) of candidate ``i`` from the rest,
    so the parent can attribute them even when the child dies."""
    os.write(2, f"\n{MARK}{i}\n".encode())


def _emit(obj: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def _try(req: dict[str, Any], cflags: list[str]) -> str:
    """Compile+load+attach; '' on success, else the error text."""
    from bcc import BPF, USDT  # deferred: only the child imports bcc for trials

    usdt_ctx = []
    try:
        u = req.get("usdt")
        if u:
            ctx = USDT(path=u["path"])
            for probe, fn in u["probes"]:
                ctx.enable_probe(probe=probe, fn_name=fn)
            usdt_ctx.append(ctx)
        text = req.get("text")
        if text:
            b = BPF(text=text.encode(), cflags=cflags, usdt_contexts=usdt_ctx)
        else:
            b = BPF(src_file=req["src"].encode(), cflags=cflags, usdt_contexts=usdt_ctx)
        b.cleanup()
    except Exception as e:
        return f"{type(e).__name__}: {e}"
    return ""


def main() -> int:
    req = json.loads(sys.stdin.read())
    base: list[str] = list(req["base"])
    winners: list[list[str]] = [list(c) for c in req.get("chosen", [])]
    firsts = [cands[0] for cands in req["hooks"] if cands]
    if req.get("together") and firsts:
        _mark(TOGETHER)
        _emit({"start": TOGETHER})
        flags = base + [f for w in winners for f in w] + [f for c in firsts for f in c["cflags"]]
        err = _try(req, flags)
        if not err:
            for c in firsts:
                _emit({"done": c["i"], "ok": True, "err": ""})
            _emit({"combined": True, "err": ""})
            return 0
        _emit({"together": False, "err": err})
    for cands in req["hooks"]:
        for c in cands:
            _mark(c["i"])
            _emit({"start": c["i"]})
            err = _try(req, base + list(c["cflags"]))
            _emit({"done": c["i"], "ok": not err, "err": err})
            if not err:
                winners.append(list(c["cflags"]))
                break
    if winners:
        _mark(-1)
        _emit({"start": -1})
        flags = base + [f for w in winners for f in w]
        err = _try(req, flags)
        _emit({"combined": not err, "err": err})
    return 0


if __name__ == "__main__":
    sys.exit(main())
