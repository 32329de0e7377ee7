"""``railhop agent --check`` / ``railhop sources``: print the capability report.

Not registered by this package: the CLI owner adds ``cli.add_command(sources_cmd)`` or calls
:func:`run_check` from ``railhop agent --check``.
"""

from __future__ import annotations

from collections.abc import Collection

import click

from railhop import paths
from railhop.cliout import JsonCommand, emit
from railhop.sources.base import Capability
from railhop.sources.catalogue import GROUPS
from railhop.sources.report import capability_report, default_sources


def run_check(
    nics: tuple[str, ...] = (),
    plugin: str | None = None,
    as_json: bool = False,
    groups: Collection[str] = GROUPS,
) -> list[Capability]:
    """Start and stop every source of ``groups``, print one line per hook (or one JSON
    document listing them: ``{"version": 1, "capabilities": [...]}``)."""
    lib = plugin
    if lib is None:
        try:
            lib = str(paths.plugin_path())
        except paths.NotInstalledError:
            lib = str(paths.LIB_DIR / paths.NCCL_PLUGIN_NAME)  # reported as "no library"
    srcs = default_sources(ifnames=list(nics) or None, plugin_lib=lib, groups=groups)
    caps = capability_report(srcs)
    if as_json:
        emit(
            {
                "capabilities": [
                    {
                        "source": c.source,
                        "hook": c.hook,
                        "status": c.status.value,
                        "mechanism": c.mechanism,
                        "reason": c.reason.value,
                        "detail": c.detail,
                    }
                    for c in caps
                ],
                "attached": any(c.attached for c in caps),
            }
        )
        return caps
    for c in caps:
        click.echo(c.line())
    return caps


@click.command("sources", cls=JsonCommand)
@click.option("--nic", "nics", multiple=True, help="Netdev to watch (repeatable; default all).")
@click.option("--plugin", type=click.Path(dir_okay=False), help="Plugin library for USDT probes.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document instead.")
@click.option(
    "--sources",
    "groups",
    default=",".join(GROUPS),
    show_default=True,
    help="Comma-separated source groups to check (each eBPF group compiles its programs).",
)
def sources_cmd(nics: tuple[str, ...], plugin: str | None, as_json: bool, groups: str) -> None:
    """Report which event sources and probes can attach on this node, and why not.

    Exits 1 when nothing can attach (a finding), 2 on bad usage."""
    chosen = [g.strip() for g in groups.split(",") if g.strip()]
    unknown = sorted(set(chosen) - set(GROUPS))
    if unknown or not chosen:
        raise click.BadParameter(
            f"unknown group(s) {', '.join(unknown) or '(none given)'}; known: {', '.join(GROUPS)}",
            param_hint="--sources",
        )
    caps = run_check(nics, plugin, as_json, chosen)
    if not any(c.attached for c in caps):
        raise SystemExit(1)
