"""railhop.sources.compose: preludes and fragments put together into the text bcc compiles."""

from __future__ import annotations

from pathlib import Path

import pytest

from railhop import paths
from railhop.sources.compose import INCLUDE, ComposeError, compose
from railhop.sources.ebpf.carrier import CARRIER
from railhop.sources.ebpf.rdma import RDMA_DRV
from railhop.sources.ebpf.tcp import TCP_LANE
from railhop.sources.usdt import LANE_PROBES
from railhop.sources.usdt import SPEC as USDT_SPEC
from railhop.sources.verbs_usdt import VERBS_SPEC as VERBS_USDT_SPEC


def test_preludes_then_file_with_fragments_and_line_markers(tmp_path: Path) -> None:
    (tmp_path / "pre.c").write_text("int pre;\n")
    (tmp_path / "frag.c").write_text("int frag_a;\nint frag_b;\n")
    (tmp_path / "p.bpf.c").write_text(
        'int one;\n// @railhop-include "frag.c"\nint three;\n  //@railhop-include "frag.c"  \n'
    )
    text = compose(tmp_path, "p.bpf.c", ("pre.c",))
    assert text.splitlines() == [
        "#define RH_COMPOSED 1",
        '#line 1 "pre.c"',
        "int pre;",
        '#line 1 "p.bpf.c"',
        "int one;",
        '#line 1 "frag.c"',
        "int frag_a;",
        "int frag_b;",
        '#line 3 "p.bpf.c"',
        "int three;",
        '#line 1 "frag.c"',
        "int frag_a;",
        "int frag_b;",
        '#line 5 "p.bpf.c"',
    ]
    # without preludes or directives the file is unchanged (after the markers)
    (tmp_path / "plain.bpf.c").write_text("int x;\n")
    assert (
        compose(tmp_path, "plain.bpf.c") == '#define RH_COMPOSED 1\n#line 1 "plain.bpf.c"\nint x;\n'
    )


def test_errors(tmp_path: Path) -> None:
    with pytest.raises(ComposeError, match=r"missing\.c"):
        compose(tmp_path, "missing.c")
    (tmp_path / "q.bpf.c").write_text('// @railhop-include "nope.c"\n')
    with pytest.raises(ComposeError, match=r"nope\.c"):
        compose(tmp_path, "q.bpf.c")
    with pytest.raises(ComposeError, match="bad file name"):  # only files of the bpf directory
        compose(tmp_path, "q.bpf.c", ("../x.c",))
    # a path in the directive is not a directive: the line stays a comment
    (tmp_path / "p.bpf.c").write_text('// @railhop-include "../etc/passwd"\n')
    assert compose(tmp_path, "p.bpf.c").endswith('// @railhop-include "../etc/passwd"\n')
    (tmp_path / "loop.c").write_text('// @railhop-include "loop.c"\n')
    with pytest.raises(ComposeError, match="deeper"):
        compose(tmp_path, "loop.c")


def test_shipped_probes_compose_and_share_one_ring_buffer() -> None:
    d = paths.bpf_dir()
    for spec in (CARRIER, TCP_LANE, RDMA_DRV, USDT_SPEC, VERBS_USDT_SPEC):
        assert spec.preludes[0] == "rh_ringbuf.c"
        text = compose(d, spec.file, spec.preludes)
        # one definition of the ring buffer and drop counter, from the prelude, in every probe
        assert text.count("BPF_RINGBUF_OUTPUT(rh_events") == 1, spec.file
        assert text.count("BPF_ARRAY(rh_drops") == 1, spec.file
        assert "rh_events.ringbuf_reserve" not in (d / spec.file).read_text()
        assert not any(INCLUDE.match(ln) for ln in text.splitlines())
    usdt = compose(d, USDT_SPEC.file, USDT_SPEC.preludes)
    # one handler per lane probe
    assert usdt.count('#line 1 "rh_usdt_lane.c"') == len(LANE_PROBES) == 7
    # both USDT programs take rh_usdt_reserve() from their shared prelude, defined once
    for spec in (USDT_SPEC, VERBS_USDT_SPEC):
        text = compose(d, spec.file, spec.preludes)
        assert text.count("rh_usdt_ev *rh_usdt_reserve(") == 1, spec.file
        assert "rh_usdt_reserve(__u32" not in (d / spec.file).read_text(), spec.file
