"""The lab's commands on the ``railhop`` command line (entry-point group ``railhop.commands``,
loaded by :mod:`railhop.cli`)."""

from __future__ import annotations

from pathlib import Path

import click


@click.command("demo")
@click.option(
    "--out",
    "out_dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=Path("railhop-demo"),
    show_default=True,
    help="Where results.json, timeline.png and the traces are written.",
)
@click.option("--rate-mbit", type=click.IntRange(10, 100000), default=200, show_default=True)
@click.option("--quick", is_flag=True, help="Shorter phases (a smoke run).")
@click.option(
    "--no-ebpf",
    is_flag=True,
    help="Agents with the netlink source only (no bcc compile); the blackhole then stays SUSPECT.",
)
def demo_cmd(out_dir: Path, rate_mbit: int, quick: bool, no_ebpf: bool) -> None:
    """Failover demo on an emulated 2-node, 4-NIC fabric (needs root)."""
    from railhop_lab.demo import run_demo

    raise SystemExit(run_demo(out_dir, rate_mbit=rate_mbit, quick=quick, no_ebpf=no_ebpf))
