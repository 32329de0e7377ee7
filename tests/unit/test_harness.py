"""railhop_lab.harness: command lines, JSON-lines parsing, progress analysis (pure)."""

from __future__ import annotations

import pytest

from railhop_lab.harness import (
    FirstError,
    HarnessConfig,
    HarnessError,
    HarnessProtocolError,
    Progress,
    Summary,
    build_argv,
    longest_gap,
    longest_stall,
    parse_line,
    parse_lines,
    rate_between,
    series,
)

# Lines as the harness prints them (recorded from the contract's examples).
RECORDED = [
    '{"type":"progress","t":0.1,"bytes":0,"per_conn":[0,0],"msgs":0}',
    '{"type":"progress","t":0.2,"bytes":2097152,"per_conn":[1048576,1048576],"msgs":2}',
    "",
    '{"type":"progress","t":0.3,"bytes":6291456,"per_conn":[3145728,3145728],"msgs":6}',
    '{"type":"summary","role":"recv","msgs":6,"bytes":6291456,"elapsed_s":0.31,'
    '"data_errors":0,"request_errors":0,"first_error":null,"gbps":0.162}',
]


def test_parse_recorded_run() -> None:
    progress, summary = parse_lines(RECORDED)
    assert [p.bytes for p in progress] == [0, 2097152, 6291456]
    assert progress[1].per_conn == (1048576, 1048576)
    assert summary == Summary(
        role="recv",
        msgs=6,
        bytes=6291456,
        elapsed_s=0.31,
        data_errors=0,
        request_errors=0,
        first_error=None,
        gbps=0.162,
    )


def test_parse_first_error() -> None:
    line = (
        '{"type":"summary","role":"send","msgs":10,"bytes":10,"elapsed_s":2,"data_errors":0,'
        '"request_errors":3,"first_error":{"code":6,"t":1.25,"where":"test"},"gbps":0}'
    )
    s = parse_line(line)
    assert isinstance(s, Summary)
    assert s.first_error == FirstError(code=6, t=1.25, where="test")
    assert s.first_error.name == "ncclRemoteError"
    assert s.first_error.clean
    assert not FirstError(code=3, t=0, where="isend").clean


def test_parse_keeps_read_time() -> None:
    p = parse_line(RECORDED[1], received_at=12.5)
    assert isinstance(p, Progress)
    assert p.received_at == 12.5


@pytest.mark.parametrize(
    "line",
    [
        "not json",
        "[1,2]",
        '{"t":1}',
        '{"type":"progress","t":0.1,"per_conn":[],"msgs":0}',
        '{"type":"progress","t":0.1,"bytes":"5","per_conn":[],"msgs":0}',
        '{"type":"progress","t":0.1,"bytes":5,"per_conn":[1.5],"msgs":0}',
        '{"type":"progress","t":0.1,"bytes":true,"per_conn":[],"msgs":0}',
        '{"type":"summary","role":"recv","msgs":1}',
        '{"type":"summary","role":"recv","msgs":1,"bytes":1,"elapsed_s":1,"data_errors":0,'
        '"request_errors":0,"first_error":5,"gbps":0}',
    ],
)
def test_parse_rejects_bad_lines(line: str) -> None:
    with pytest.raises(HarnessProtocolError):
        parse_line(line)


def test_unknown_type_is_ignored() -> None:
    assert parse_line('{"type":"hello","x":1}') is None


def test_argv_count() -> None:
    cfg = HarnessConfig(conns=3, devs=(0, 2), sizes=(0, 4096), count=5, seed=7, api=10)
    argv = build_argv("/h", "/p.so", "recv", "/rdv", cfg)
    assert argv == [
        "/h", "--plugin", "/p.so", "--role", "recv", "--rendezvous", "/rdv",
        "--conns", "3", "--devs", "0,2", "--sizes", "0,4096", "--count", "5",
        "--inflight", "8", "--interval-ms", "100", "--deadline", "120",
        "--seed", "7", "--api", "10",
    ]  # fmt: skip


def test_argv_duration_grouped_expect_error() -> None:
    cfg = HarnessConfig(duration=2.5, grouped=4, expect_error=True, deadline=10)
    argv = build_argv("/h", "/p.so", "send", "/rdv", cfg)
    assert argv[argv.index("--duration") + 1] == "2.5"
    assert argv[argv.index("--grouped") + 1] == "4"
    assert "--expect-error" in argv
    assert "--count" not in argv


def test_argv_nccl_order_exit_open_and_the_receivers_seed() -> None:
    cfg = HarnessConfig(count=4, seed=5, recv_seed=6, order="nccl", exit_open=True, share=2)
    send = build_argv("/h", "/p.so", "send", "/rdv", cfg)
    recv = build_argv("/h", "/p.so", "recv", "/rdv", cfg)
    for argv in (send, recv):
        assert argv[argv.index("--order") + 1] == "nccl" and "--exit-open" in argv
        assert argv[argv.index("--share") + 1] == "2"
    assert send[send.index("--seed") + 1] == "5" and recv[recv.index("--seed") + 1] == "6"
    plain = build_argv("/h", "/p.so", "recv", "/rdv", HarnessConfig(count=4, seed=5))
    assert "--order" not in plain and "--exit-open" not in plain and "--share" not in plain
    assert plain[plain.index("--seed") + 1] == "5"


@pytest.mark.parametrize(
    "cfg",
    [
        HarnessConfig(),  # neither count nor duration
        HarnessConfig(count=1, order="proxy"),
        HarnessConfig(count=1, conns=3, share=2),
        HarnessConfig(count=2, conns=2, share=2, grouped=2),
        HarnessConfig(duration=2, conns=2, share=2),
        HarnessConfig(count=1, duration=1),
        HarnessConfig(count=1, inflight=33),
        HarnessConfig(count=1, conns=0),
        HarnessConfig(count=1, sizes=()),
        HarnessConfig(count=1, sizes=(-1,)),
        HarnessConfig(count=1, devs=()),
        HarnessConfig(count=1, api=7),
        HarnessConfig(duration=10, deadline=5),
    ],
)
def test_config_rejects(cfg: HarnessConfig) -> None:
    with pytest.raises(HarnessError):
        build_argv("/h", "/p", "send", "/r", cfg)


def test_bad_role() -> None:
    with pytest.raises(HarnessError):
        build_argv("/h", "/p", "both", "/r", HarnessConfig(count=1))  # type: ignore[arg-type]


def _prog(points: list[tuple[float, int]]) -> list[Progress]:
    return [Progress(t=t, bytes=b, per_conn=(b,), msgs=0) for t, b in points]


def test_longest_stall_and_rates() -> None:
    prog = _prog([(0.1, 0), (0.2, 100), (0.3, 200), (0.4, 200), (0.5, 200), (0.9, 200), (1.0, 300)])
    assert longest_stall(prog) == pytest.approx(0.7)
    assert longest_stall(prog, start=0.0, end=0.35) == pytest.approx(0.1)
    assert rate_between(prog, 0.1, 0.3) == pytest.approx(1000.0)
    assert series(prog)[0] == (0.2, pytest.approx(1000.0))
    assert rate_between(prog, 5, 6) == 0.0


def test_longest_gap_says_where_it_began() -> None:
    prog = _prog([(0.1, 0), (0.2, 100), (0.3, 200), (0.4, 200), (0.5, 200), (0.9, 200), (1.0, 300)])
    assert longest_gap(prog) == (pytest.approx(0.7), pytest.approx(0.3))
    assert longest_gap(prog, start=0.5) == (pytest.approx(0.5), pytest.approx(0.5))
    assert longest_gap(_prog([(0.1, 0), (0.2, 100), (2.3, 100)])) == (
        pytest.approx(2.1),
        pytest.approx(0.2),
    )


def test_longest_stall_open_end() -> None:
    prog = _prog([(0.1, 0), (0.2, 100), (0.3, 100), (2.3, 100)])
    assert longest_stall(prog) == pytest.approx(2.1)
