"""The railhop command line (click). Each sub-command is a thin layer over a module that does the work."""

from __future__ import annotations

import click

from railhop import __version__, paths


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="railhop")
def cli() -> None:
    """railhop: NIC-failure resilience for NCCL/RCCL jobs."""


@cli.command("plugin-path")
@click.option("--rccl", is_flag=True, help="Print the RCCL name (librccl-net-railhop.so) instead.")
def plugin_path_cmd(rccl: bool) -> None:
    """Print the absolute path of the installed network plugin (for NCCL_NET_PLUGIN)."""
    try:
        click.echo(str(paths.plugin_path(rccl=rccl)))
    except paths.NotInstalledError as e:
        raise click.ClickException(str(e)) from e


def main() -> None:
    cli()
