"""The capability report (``railhop agent --check``): start every source, collect what attached
and what was skipped and why, stop them again."""

from __future__ import annotations

import asyncio
from collections.abc import Collection, Mapping, Sequence
from pathlib import Path

from railhop.sources.base import Capability, Registry, Source, starts_slowly
from railhop.sources.catalogue import GROUPS, SourceOptions, build_sources
from railhop.sources.ebpf.loader import START_TIMEOUT_S, start_timeout_s
from railhop.sources.events import Event


def default_sources(
    ifnames: Sequence[str] | None = None,
    plugin_lib: str | Path | None = None,
    thresholds: Mapping[str, float] | None = None,
    netns: str | None = None,
    root: str = "/",
    groups: Collection[str] = GROUPS,
) -> list[Source]:
    """The sources of ``groups`` (default: every one) of the catalogue
    (:mod:`railhop.sources.catalogue`), in start order (kernel hooks first)."""
    return build_sources(
        SourceOptions(
            ifnames=ifnames,
            thresholds=thresholds or {},
            root=root,
            netlink_netns=netns,
            plugin_lib=plugin_lib,
        ),
        groups,
    )


async def check_async(
    sources: Sequence[Source], timeout_s: float | None = None
) -> list[Capability]:
    """Start and stop ``sources`` within ``timeout_s`` (default: one eBPF source's start bound,
    ``RAILHOP_EBPF_TIMEOUT_S``, per source that starts slowly, at least 180 s)."""
    if timeout_s is None:
        slow = sum(1 for s in sources if starts_slowly(s))
        timeout_s = max(START_TIMEOUT_S, start_timeout_s() * max(1, slow))
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
