"""The capability report (``railhop agent --check``): start every source, collect what attached
and what was skipped and why, stop them again."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from pathlib import Path

from railhop.sources.base import Capability, Registry, Source
from railhop.sources.catalogue import SourceOptions, build_sources
from railhop.sources.events import Event


def default_sources(
    ifnames: Sequence[str] | None = None,
    plugin_lib: str | Path | None = None,
    thresholds: Mapping[str, float] | None = None,
    netns: str | None = None,
    root: str = "/",
) -> list[Source]:
    """Every source of the catalogue (:mod:`railhop.sources.catalogue`), in start order
    (kernel hooks first)."""
    return build_sources(
        SourceOptions(
            ifnames=ifnames,
            thresholds=thresholds or {},
            root=root,
            netlink_netns=netns,
            plugin_lib=plugin_lib,
        )
    )


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
