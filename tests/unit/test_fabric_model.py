"""railhop_lab.fabric: the pure parts (names, addresses, parameters, the bridge-port request)."""

from __future__ import annotations

import socket
import struct

import pytest

from railhop_lab.fabric import (
    FabricError,
    brport_state_request,
    flow_queue_plan,
    nic_address,
    node_sysctls,
    owns_netns,
    plan_fabric,
    tbf_params,
    unique_prefix,
)


def test_plan_names_and_addresses() -> None:
    p = plan_fabric(2, 4, "rh")
    assert p.node_ns == ("rhn0", "rhn1")
    assert p.spine_ns == "rhsp"
    n = p.nic(1, 3)
    assert (n.ifname, n.peer, n.address, n.table) == ("nic3", "n1nic3", "10.77.3.2", 103)
    assert nic_address(0, 2) == "10.77.2.1"
    assert len({x.address for x in p.nic_plans}) == 8
    assert len({x.peer for x in p.nic_plans}) == 8
    with pytest.raises(FabricError):
        p.nic(2, 0)


@pytest.mark.parametrize("args", [(0, 4, "rh"), (2, 0, "rh"), (2, 4, "RH"), (2, 4, "r" * 13)])
def test_plan_rejects(args: tuple[int, int, str]) -> None:
    with pytest.raises(FabricError):
        plan_fabric(*args)


def test_owns_netns_is_exact() -> None:
    assert owns_netns("rh", "rhn0")
    assert owns_netns("rh", "rhsp")
    assert owns_netns("rh", "rhn12")
    assert not owns_netns("rh", "rht12n0")
    assert not owns_netns("rh", "rhn0x")
    assert not owns_netns("rh", "xrhn0")


def test_unique_prefix() -> None:
    a, b = unique_prefix(), unique_prefix()
    assert a != b
    assert a.startswith("rh")
    plan_fabric(2, 4, a)  # valid as a prefix


def test_tbf_params() -> None:
    p = tbf_params(200)
    assert p["rate"] == "200mbit"
    assert p["burst"] >= 128 * 1024
    assert tbf_params(10000)["burst"] == 10000 * 1_000_000 // 8 // 250
    with pytest.raises(FabricError):
        tbf_params(0)
    assert p["latency"] == "20ms" and tbf_params(1000, 50)["latency"] == "50ms"
    for bad in (0, 1001):
        with pytest.raises(FabricError):
            tbf_params(200, bad)


def _bucket_of(keys: list[str], sport: int, dport: int) -> list[int]:
    """The buckets whose u32 key matches a packet's port word (offset 20: sport << 16 | dport)."""
    word = sport << 16 | dport
    got = []
    for k, key in enumerate(keys):
        vm, off = key.split("+")
        value, mask = (int(x, 16) for x in vm.split("/"))
        assert off == "20"
        if word & mask == value:
            got.append(k)
    return got


def test_flow_queue_plan() -> None:
    tbf, parent, bucket, limit, keys = flow_queue_plan(1000, 100)
    assert tbf == tbf_params(1000, 100)  # the rate is the tbf's, as with one FIFO
    # the htb never limits: its rates are far above the NIC's; a bucket is guaranteed 1/64
    assert parent == {"rate": "4000mbit", "ceil": "4000mbit"}
    assert bucket["rate"] == f"{1000 * 1000 // 64}kbit" and bucket["ceil"] == "4000mbit"
    assert limit == 1000 * 125 * 100 // 1500  # 100 ms at 1 Gbit/s in 1500-byte packets
    # every port word lands in exactly one bucket, chosen by bits 1-6 of the source port
    assert len(keys) == 64
    for sport in (0, 1, 2, 40000, 40001, 40002, 40126, 40128, 65535):
        assert _bucket_of(keys, sport, 5555) == [(sport >> 1) & 63], sport
    # consecutive even ephemeral ports spread over consecutive buckets
    assert {_bucket_of(keys, 40000 + 2 * i, 80)[0] for i in range(64)} == set(range(64))
    assert flow_queue_plan(8000, 5)[1]["rate"] == "30000mbit"  # htb's 32-bit bytes/s
    assert flow_queue_plan(1, 5)[3] == 64  # never shallower than 64 packets
    with pytest.raises(FabricError):
        flow_queue_plan(1000, 100, queues=65)
    with pytest.raises(FabricError):
        flow_queue_plan(0, 100)


def test_node_sysctls() -> None:
    items = dict(node_sysctls(["nic0", "nic1"]))
    assert items["net/ipv4/conf/nic1/arp_ignore"] == "1"
    assert items["net/ipv4/conf/all/arp_announce"] == "2"
    assert items["net/ipv4/conf/nic0/rp_filter"] == "0"


def test_brport_state_request_bytes() -> None:
    msg = brport_state_request(ifindex=7, state=1, seq=9)
    length, mtype, flags, seq, pid = struct.unpack_from("=IHHII", msg)
    assert (length, mtype, flags, seq, pid) == (len(msg), 19, 0x5, 9, 0)
    family, _, index, _, _ = struct.unpack_from("=BxHiII", msg, 16)
    assert (family, index) == (socket.AF_BRIDGE, 7)
    nla_len, nla_type = struct.unpack_from("=HH", msg, 32)
    assert (nla_len, nla_type) == (12, 12 | 0x8000)  # IFLA_PROTINFO, nested
    assert struct.unpack_from("=HHB", msg, 36) == (5, 1, 1)  # IFLA_BRPORT_STATE = listening
    assert len(msg) == 44
