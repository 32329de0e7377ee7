"""``railhop agent --check`` / ``railhop sources``: print the capability report.

Not registered by this package: the CLI owner adds ``cli.add_command(sources_cmd)`` or calls
:func:`run_check` from ``railhop agent --check``.
"""

from __future__ import annotations

import json

import click

from railhop import paths
from railhop.sources.base import Capability
from railhop.sources.report import capability_report, default_sources


def run_check(
    nics: tuple[str, ...] = (), plugin: str | None = None, as_json: bool = False
) -> list[Capability]:
    """Start and stop every source, print one line (or JSON object) per hook."""
    lib = plugin
    if lib is None:
        try:
            lib = str(paths.plugin_path())
        except paths.NotInstalledError:
            lib = str(paths.LIB_DIR / paths.NCCL_PLUGIN_NAME)  # reported as "no library"
    caps = capability_report(default_sources(ifnames=list(nics) or None, plugin_lib=lib))
    for c in caps:
        if as_json:
            click.echo(
                json.dumps(
                    {
                        "source": c.source,
                        "hook": c.hook,
                        "status": c.status.value,
                        "mechanism": c.mechanism,
                        "reason": c.reason.value,
                        "detail": c.detail,
                    }
                )
            )
        else:
            click.echo(c.line())
    return caps


@click.command("sources")
@click.option("--nic", "nics", multiple=True, help="Netdev to watch (repeatable; default all).")
@click.option("--plugin", type=click.Path(dir_okay=False), help="Plugin library for USDT probes.")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per line.")
def sources_cmd(nics: tuple[str, ...], plugin: str | None, as_json: bool) -> None:
    """Report which event sources and probes can attach on this node, and why not.

    Exits 1 when nothing can attach (a finding), 2 on bad usage."""
    caps = run_check(nics, plugin, as_json)
    if not any(c.attached for c in caps):
        raise SystemExit(1)
