"""The BTF reader against hand-built BTF blobs (layout of include/uapi/linux/btf.h)."""

from __future__ import annotations

import struct

import pytest

from railhop.sources import btf as B


class Blob:
    """Builds a little-endian BTF blob: type records with ids from 1, one string table."""

    def __init__(self) -> None:
        self.strings = bytearray(b"\0")
        self.types = bytearray()
        self.n = 0

    def s(self, name: str) -> int:
        if not name:
            return 0
        off = len(self.strings)
        self.strings += name.encode() + b"\0"
        return off

    def add(
        self,
        name: str,
        kind: int,
        vlen: int,
        size_or_type: int,
        tail: bytes = b"",
        *,
        kflag: bool = False,
    ) -> int:
        info = (kind << 24) | vlen | (1 << 31 if kflag else 0)
        self.types += struct.pack("<III", self.s(name), info, size_or_type) + tail
        self.n += 1
        return self.n

    def int_(self, name: str, size: int) -> int:
        return self.add(name, B.KIND_INT, 0, size, struct.pack("<I", size * 8))

    def struct(
        self,
        name: str,
        size: int,
        members: list[tuple[str, int, int]],
        kflag: bool = False,
        kind: int = B.KIND_STRUCT,
    ) -> int:
        tail = b"".join(struct.pack("<III", self.s(n), t, off) for n, t, off in members)
        return self.add(name, kind, len(members), size, tail, kflag=kflag)

    def build(self) -> bytes:
        hdr = struct.pack(
            "<HBBIIIII",
            B.BTF_MAGIC,
            1,
            0,
            24,
            0,
            len(self.types),
            len(self.types),
            len(self.strings),
        )
        return hdr + bytes(self.types) + bytes(self.strings)


@pytest.fixture
def blob() -> bytes:
    b = Blob()
    u16 = b.int_("unsigned short", 2)  # 1
    u32 = b.int_("unsigned int", 4)  # 2
    ptr = b.add("", B.KIND_PTR, 0, 0)  # 3: void *
    # anonymous struct { u16 skc_dport; u16 skc_num; } inside an anonymous union
    anon_s = b.struct("", 4, [("skc_dport", u16, 0), ("skc_num", u16, 16)])  # 4
    anon_u = b.struct("", 4, [("skc_portpair", u32, 0), ("", anon_s, 0)], kind=B.KIND_UNION)  # 5
    b.struct("sock_common", 16, [("skc_daddr", u32, 0), ("", anon_u, 96)])  # 6
    # bitfield struct (kind_flag): offsets carry the bitfield size in the top 8 bits
    b.struct(
        "net_device",
        64,
        [("flags", u32, (3 << 24) | 5), ("ifindex", u32, 224 * 8), ("name", ptr, 280 * 8)],
        kflag=True,
    )  # 7
    b.add(
        "netdev_state_t",
        B.KIND_ENUM,
        2,
        4,
        struct.pack("<Ii", b.s("__LINK_STATE_START"), 0)
        + struct.pack("<Ii", b.s("__LINK_STATE_NOCARRIER"), 2),
    )  # 8
    proto = b.add("", B.KIND_FUNC_PROTO, 0, 0)  # 9
    b.add("netif_carrier_off", B.KIND_FUNC, 0, proto)  # 10
    tp_proto = b.add(
        "", B.KIND_FUNC_PROTO, 2, 0, struct.pack("<II", 0, ptr) + struct.pack("<II", 0, ptr)
    )  # 11
    tp_ptr = b.add("", B.KIND_PTR, 0, tp_proto)  # 12
    b.add("btf_trace_qdisc_reset", B.KIND_TYPEDEF, 0, tp_ptr)  # 13
    b.add("", B.KIND_CONST, 0, u32)  # 14
    return b.build()


def test_member_offsets(blob: bytes) -> None:
    t = B.parse(blob)
    assert t.member_offset("sock_common", "skc_daddr") == 0
    assert t.member_offset("sock_common", "skc_dport") == 12  # 96 bits + 0 through the anon union
    assert t.member_offset("sock_common", "skc_num") == 14
    assert t.member_offset("net_device", "ifindex") == 224
    assert t.member_offset("net_device", "name") == 280


def test_bitfield_and_missing_members_raise(blob: bytes) -> None:
    t = B.parse(blob)
    with pytest.raises(B.BTFError, match="bitfield"):
        t.member_offset("net_device", "flags")
    with pytest.raises(B.BTFError, match="no member"):
        t.member_offset("net_device", "nope")
    with pytest.raises(B.BTFError, match="no struct"):
        t.member_offset("Qdisc", "dev_queue")


def test_enum_func_and_raw_tracepoints(blob: bytes) -> None:
    t = B.parse(blob)
    assert t.enum_value("netdev_state_t", "__LINK_STATE_NOCARRIER") == 2
    with pytest.raises(B.BTFError):
        t.enum_value("netdev_state_t", "__LINK_STATE_DORMANT")
    assert t.has_func("netif_carrier_off")
    assert not t.has_func("netif_carrier_on")
    assert t.has_raw_tracepoint("qdisc_reset")
    assert not t.has_raw_tracepoint("tcp_retransmit_skb")
    assert t.raw_tracepoint_nargs("qdisc_reset") == 1
    assert t.raw_tracepoint_nargs("tcp_retransmit_skb") is None


@pytest.mark.parametrize(
    ("mutate", "match"),
    [
        (lambda b: b[:10], "shorter than its header"),
        (lambda b: b"\x00\x00" + b[2:], "bad BTF magic"),
        (lambda b: b[:-5], "past the end"),
        (
            lambda b: b[:4] + struct.pack("<I", 24) + b[8:12] + struct.pack("<I", 13) + b[16:],
            "truncated",
        ),
    ],
)
def test_malformed_blobs(blob: bytes, mutate: object, match: str) -> None:
    assert callable(mutate)
    with pytest.raises(B.BTFError, match=match):
        B.parse(mutate(blob))


def test_load_missing_file(tmp_path: object) -> None:
    with pytest.raises(B.BTFError, match="no BTF"):
        B.load(str(tmp_path))
