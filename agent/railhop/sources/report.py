"""The capability report (``railhop agent --check``): start every source, collect what attached
and what was skipped and why, stop them again."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from pathlib import Path

from railhop.sources.base import Capability, Registry, Source
from railhop.sources.ebpf import CarrierSource, RdmaDriverSource, TcpLaneSource
from railhop.sources.events import Event
from railhop.sources.netlink import NetlinkSource
from railhop.sources.sysfs import SysfsCounterSource
from railhop.sources.usdt import UsdtSource
from railhop.sources.verbs import VerbsSource


def default_sources(
    ifnames: Sequence[str] | None = None,
    plugin_lib: str | Path | None = None,
    thresholds: Mapping[str, float] | None = None,
    netns: str | None = None,
    root: str = "/",
) -> list[Source]:
    """The agent's standard set of sources, in start order (kernel hooks first)."""
    names = set(ifnames) if ifnames else None
    out: list[Source] = [
        CarrierSource(ifnames=names, root=root),
        TcpLaneSource(root=root),
        RdmaDriverSource(root=root),
        NetlinkSource(ifnames=names, netns=netns),
        SysfsCounterSource(thresholds or {}, ifnames=list(ifnames or []), root=root),
        VerbsSource(root=root),
    ]
    if plugin_lib is not None:
        out.append(UsdtSource(plugin_lib, root=root))
    return out


async def check_async(sources: Sequence[Source], timeout_s: float = 180.0) -> list[Capability]:
    reg = Registry(sources, log_capabilities=False)  # the caller prints the records

    def discard(_ev: Event) -> None:
        return None

    try:
        return await asyncio.wait_for(reg.start_all(discard), timeout_s)
    finally:
        await reg.stop_all()


def capability_report(sources: Sequence[Source] | None = None) -> list[Capability]:
    """Start and stop ``sources`` (default: :func:`default_sources`) and return their records."""
    return asyncio.run(check_async(list(sources) if sources is not None else default_sources()))
