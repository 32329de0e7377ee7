"""Decoders against raw bytes captured on this project's 6.18 kernel (ring-buffer records and an
rtnetlink datagram), paired with the values they must decode to."""

from __future__ import annotations

import pytest

from railhop.sources import decode as D
from railhop.sources.events import (
    CarrierDown,
    DevlinkHealth,
    Mlx5CmdFailure,
    PluginLaneEvent,
    RdmaCmEvent,
    RdmaPortEvent,
    TcpSuspect,
)
from railhop.sources.netlink import LinkTracker, parse

# carrier.bpf.c, raw tracepoint qdisc_reset: veth rhcapA (ifindex 40, init netns 4026531833)
# lost carrier
RAW_TP_CARRIER = "d719b69786010000010000000200000028000000f9ffffef72686361704100000000000000000000"
# carrier.bpf.c, raw tracepoint qdisc_reset from dev_close(): fabric nic0 (ifindex 2, netns
# 4026532317) set administratively down, carrier not yet off
RAW_TP_DEV_CLOSE = (
    "8e8f2a376b0800000d0000000200000002000000dd0100f06e696330000000000000000000000000"
)
# carrier.bpf.c, tracepoint qdisc:qdisc_reset: 16 bytes copied from the __data_loc string, so the
# next string ("noqueue") follows the name's NUL
TP_QDISC = "67d33fa3e800000003000000030000000000000000000000726863617041006e6f71756575650000"
TP_QDISC_NULL = "122e0896e800000003000000030000000000000000000000286e756c6c29006e6f6f700000000000"
# tcp_lane.bpf.c, raw tracepoints: retransmit / loss / ETIMEDOUT,
# 10.213.0.1:{48736,48726} -> 10.213.0.2:33177 in netns 4026532695
RAW_TP_RETRANS = (
    "2f08d63288010000040000000200000060be99810200010000000000570300f00ad50001"
    "0000000000000000000000000ad50002000000000000000000000000"
)
RAW_TP_LOSS = (
    "dee24f3388010000060000000200000056be99810200010004000000570300f00ad50001"
    "0000000000000000000000000ad50002000000000000000000000000"
)
RAW_TP_ERROR = (
    "0ffa1b7088010000050000000200000060be9981020007006e000000570300f00ad50001"
    "0000000000000000000000000ad50002000000000000000000000000"
)
# tcp_lane.bpf.c, tracepoint tcp:tcp_retransmit_skb
TP_RETRANS = (
    "16e9a216ec00000004000000030000005c8217a80200010000000000000000000ad50001"
    "0000000000000000000000000ad50002000000000000000000000000"
)
# plugin_usdt.bpf.c: railhop:lane_down(3, 1, -110) from pid 16327
USDT_LANE_DOWN = (
    "2762eadfed0000000c0000000400000002000000c73f0000030000000000000001000000"
    "0000000092ffffffffffffff0000000000000000"
)
# rtnetlink RTM_NEWLINK: veth nic0 (ifindex 3) after its peer went down
NL_NIC0_DOWN = (
    "d805000010000000000000000000000000000100030000000310000000000000090003006e69633000000000"
    "08000d00e803000005001000030000000500110000000000050043000000000008000400dc05000008003200"
    "4400000008003300ffff000008001b000000000008001e000000000008003d000000000008001f0002000000"
    "08002800ffff0000080029000000010008003a000000010008003f0000000100080040000000010008003b00"
    "f8ff070008003c00ffff00000800420000000000080020000200000005002100000000000800230003000000"
    "08002f000100000008003000020000000600440000000000060045000000000005002700000000000a000100"
    "7e6db9a1984800000a000200ffffffffffff0000cc00170002000000000000000300000000000000b4000000"
    "000000000a010000000000000000000000000000000000000000000000000000000000000000000000000000"
    "0000000000000000000000000000000000000000000000000000000000000000000000000000000000000000"
    "0000000000000000000000000000000000000000000000000000000000000000000000000000000000000000"
    "0000000000000000000000000000000000000000000000000000000000000000000000000000000000000000"
    "00000000640007000200000003000000b40000000a0100000000000000000000000000000000000000000000"
    "0000000000000000000000000000000000000000000000000000000000000000000000000000000000000000"
    "000000000000000000000000000000000c002b00050002000000000010001200090001007665746800000000"
    "08000500020000000c0006006e6f71756575650030031a008c00020088000100000000000000000000000000"
    "0100000001000000010000000100000000000000010000000000000000000000000000000000000000000000"
    "0000000000000000000000000000000000000000000000000000000000000000000000000000000000000000"
    "0000000010270000e80300000000000000000000000000000000000001000000a0020a000800010000000080"
    "14000500ffff0000b2900100ac740000e8030000f40002000000000040000000dc0500000100000001000000"
    "0100000001000000ffffffffa00f0000e803000000000000803a090080510100030000005802000010000000"
    "0000000001000000010000000100000060ea0000000000000000000000000000000000000000000000000000"
    "01000000000000000000000010270000e8030000010000000000000000000000010000000000000000000000"
    "010000000000000000000000000000000000000080ee36000000000000000000010000000000000000000000"
    "0000000000000000000000000004000000000000ffff0000ffffffff01000000000000000000000000000000"
    "3401030026000000000000000200000000000000980000000000000000000000000000000200000000000000"
    "00000000000000000000000000000000000000000000000003000000000000000300000000000000e0000000"
    "0000000000000000000000000000000000000000000000000000000000000000000000000000000000000000"
    "0000000000000000000000000000000000000000000000000000000000000000000000000000000000000000"
    "0000000000000000000000000000000000000000000000000000000000000000000000000000000000000000"
    "0000000000000000020000000000000003000000000000000000000000000000000000000000000098000000"
    "00000000e0000000000000000000000000000000000000000000000000000000000000000000000000000000"
    "3c00060007000000000000000000000000000000000000000000000003000000000000000000000000000000"
    "0000000000000000000000000000000014000700000000000000000000000000000000000500080000000000"
    "24000e00000000000000000000000000000000000000000000000000000000000000000004003e8004004180"
)


def test_raw_tp_carrier() -> None:
    ev = D.decode(bytes.fromhex(RAW_TP_CARRIER), "ebpf.carrier")
    assert ev == CarrierDown(
        ts_ns=0x018697B619D7,
        source="ebpf.carrier",
        hook="raw_tp:qdisc_reset",
        ifname="rhcapA",
        ifindex=40,
        certain=True,
        netns_ino=4026531833,
    )


def test_raw_tp_dev_close_is_a_certain_carrier_down() -> None:
    ev = D.decode(bytes.fromhex(RAW_TP_DEV_CLOSE), "ebpf.carrier")
    assert ev == CarrierDown(
        ts_ns=0x086B372A8F8E,
        source="ebpf.carrier",
        hook="raw_tp:qdisc_reset",
        ifname="nic0",
        ifindex=2,
        operstate="DOWN",
        certain=True,
        netns_ino=4026532317,
    )
    # the same record cut short is refused, not half-decoded
    with pytest.raises(D.DecodeError):
        D.decode(bytes.fromhex(RAW_TP_DEV_CLOSE)[:30], "ebpf.carrier")


def test_tp_qdisc_is_an_uncertain_carrier_down() -> None:
    ev = D.decode(bytes.fromhex(TP_QDISC), "c")
    assert isinstance(ev, CarrierDown)
    assert (ev.ifname, ev.ifindex, ev.certain, ev.hook) == ("rhcapA", 0, False, "tp:qdisc_reset")
    assert D.decode(bytes.fromhex(TP_QDISC_NULL), "c").ifname == "(null)"  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("hexrec", "reason", "value", "state", "hook"),
    [
        (RAW_TP_RETRANS, "retransmit", 0, 1, "raw_tp"),
        (RAW_TP_LOSS, "loss", 4, 1, "raw_tp"),
        (RAW_TP_ERROR, "error", 110, 7, "raw_tp"),
    ],
)
def test_tcp_records(hexrec: str, reason: str, value: int, state: int, hook: str) -> None:
    ev = D.decode(bytes.fromhex(hexrec), "ebpf.tcp")
    assert isinstance(ev, TcpSuspect)
    assert (ev.reason, ev.value, ev.state, ev.hook) == (reason, value, state, hook)
    assert (ev.saddr, ev.daddr) == ("10.213.0.1", "10.213.0.2")
    assert ev.sport in (48736, 48726)
    assert ev.dport == 33177
    assert ev.netns_ino == 4026532695


def test_tp_retransmit() -> None:
    ev = D.decode(bytes.fromhex(TP_RETRANS), "ebpf.tcp")
    assert ev == TcpSuspect(
        ts_ns=0xEC16A2E916,
        source="ebpf.tcp",
        hook="tp",
        reason="retransmit",
        sport=33372,
        dport=43031,
        saddr="10.213.0.1",
        daddr="10.213.0.2",
        value=0,
        state=1,
    )


def test_usdt_lane_down() -> None:
    ev = D.decode(bytes.fromhex(USDT_LANE_DOWN), "usdt.plugin")
    assert ev == PluginLaneEvent(
        ts_ns=0xEDDFEA6227,
        source="usdt.plugin",
        hook="usdt",
        probe="lane_down",
        pid=16327,
        args=(3, 1, -110, 0),
    )


def _drv(kind: int, ab: tuple[int, int], dev: bytes, name: bytes, msg: bytes) -> bytes:
    return D.DRV.pack(123, kind, 3, ab[0], ab[1], dev, name, msg)


def test_driver_records() -> None:
    ev = D.decode(_drv(7, (0, 0), b"0000:17:00.0", b"fw_fatal", b"FW fatal error"), "r")
    assert ev == DevlinkHealth(
        ts_ns=123,
        source="r",
        hook="tp",
        device="0000:17:00.0",
        reporter="fw_fatal",
        msg="FW fatal error",
    )
    ev = D.decode(_drv(8, (7, -110), b"", b"", b""), "r")
    assert ev == RdmaCmEvent(
        ts_ns=123, source="r", hook="tp", event="UNREACHABLE", code=7, status=-110
    )
    ev = D.decode(_drv(9, (0, 0), b"mlx5_0", b"", b""), "r")
    assert isinstance(ev, RdmaCmEvent) and (ev.event, ev.device) == ("DEVICE_REMOVED", "mlx5_0")
    ev = D.decode(_drv(10, (4, -1), b"", b"MODIFY_QP", b"bad resource state"), "r")
    assert ev == Mlx5CmdFailure(
        ts_ns=123,
        source="r",
        hook="tp",
        command="MODIFY_QP",
        status_str="bad resource state",
        status=4,
        syndrome=0xFFFFFFFF,
    )
    ev = D.decode(D.DRV.pack(5, 11, 1, 10, 1, b"mlx5_1", b"", b""), "r")
    assert ev == RdmaPortEvent(
        ts_ns=5, source="r", hook="fentry", device="mlx5_1", event="PORT_ERR", code=10, port=1
    )


@pytest.mark.parametrize(
    "raw",
    [b"", b"\0" * 15, bytes.fromhex(RAW_TP_CARRIER)[:39], bytes.fromhex(RAW_TP_RETRANS)[:63]],
)
def test_short_records_are_rejected(raw: bytes) -> None:
    with pytest.raises(D.DecodeError):
        D.decode(raw, "x")


def test_unknown_kind_is_rejected() -> None:
    with pytest.raises(D.DecodeError, match="unknown record kind 99"):
        D.decode(D.HDR.pack(1, 99, 3) + bytes(64), "x")


def test_struct_sizes_match_the_header_comments() -> None:
    assert (D.HDR.size, D.NETDEV.size, D.TCP.size, D.DRV.size, D.USDT.size) == (16, 40, 64, 152, 56)


def test_netlink_datagram() -> None:
    msgs = parse(bytes.fromhex(NL_NIC0_DOWN))
    assert len(msgs) == 1
    m = msgs[0]
    assert (m.event, m.ifindex, m.ifname, m.operstate, m.carrier, m.admin_up) == (
        "RTM_NEWLINK",
        3,
        "nic0",
        "LOWERLAYERDOWN",
        False,
        True,
    )
    tr = LinkTracker("netlink")
    tr.seed(m.__class__("RTM_NEWLINK", 3, "nic0", "UP", True, True))
    ev = tr.update(m, 42)
    assert ev == CarrierDown(
        ts_ns=42,
        source="netlink",
        hook="netlink",
        ifname="nic0",
        ifindex=3,
        operstate="LOWERLAYERDOWN",
        certain=True,
    )
