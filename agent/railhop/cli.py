"""The railhop command line (click). Each sub-command is a thin layer over a module.

Exit codes, the same for every command: 0 success; 1 a finding (``policy check`` found
problems, ``status`` found no live agent, ``sources`` / ``agent --check`` found nothing that
can attach, ``status --check --nics`` found too few rails up); 2 bad usage or input (click's
usage errors, ``click.BadParameter``) and domain errors (a topology or policy that cannot be
read); 3 unknown (``status --check --nics`` could not read a live agent's table).

``--json`` prints exactly one JSON document with a ``version`` field, also on errors
(:mod:`railhop.cliout`).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import NoReturn

import click

from railhop import __version__, paths
from railhop import topology as topo_mod
from railhop.cliout import JsonCommand, emit
from railhop.health import NicState
from railhop.policy import (
    Plan,
    Policy,
    PolicyError,
    check_file,
    default_policy,
    load_policy,
    plan,
    resolve_rails,
)
from railhop.topology import Topology, TopologyError, read_topology


class DomainError(click.ClickException):
    """A topology or policy error: printed as ``Error: ...``, exit status 2."""

    exit_code = 2


class Finding(click.ClickException):
    """What the command was asked to find out is bad (no live agent, ...): exit status 1."""

    exit_code = 1


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


@cli.command("plugin-install")
@click.option(
    "--dest",
    type=click.Path(file_okay=False, path_type=Path),
    default=Path("/opt/railhop/lib"),
    show_default=True,
    help="Directory the jobs load the plugin from (the DaemonSet's hostPath).",
)
def plugin_install_cmd(dest: Path) -> None:
    """Install both plugin names into DEST, each file replaced atomically."""
    from railhop import plugin_install

    try:
        steps = plugin_install.install(dest)
    except plugin_install.PluginInstallError as e:
        raise DomainError(str(e)) from e
    for line in plugin_install.describe(steps):
        click.echo(line)


# --------------------------------------------------------------------------------------------
# shared options and helpers

_root_option = click.option(
    "--root",
    type=click.Path(exists=True, file_okay=False, path_type=Path),
    default=Path("/"),
    show_default=True,
    help="Read sysfs under DIR/sys (a fixture tree in tests).",
)
_policy_option = click.option(
    "--policy",
    "policy_file",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    default=None,
    help="Policy file for rails (default: automatic rails, built-in policy).",
)
_netdev_option = click.option(
    "--netdev",
    "netdevs",
    multiple=True,
    metavar="NAME",
    help="Also treat this virtual netdev (veth, ...) as a NIC; repeatable.",
)


def _load_policy(path: Path | None) -> Policy:
    if path is None:
        return default_policy()
    try:
        return load_policy(path)
    except PolicyError as e:
        raise DomainError(f"invalid policy {path}:\n{e}") from e


def _read(root: Path, netdevs: Sequence[str]) -> Topology:
    try:
        return read_topology(root, netdevs=netdevs)
    except TopologyError as e:
        raise DomainError(str(e)) from e


def _with_rails(topo: Topology, policy: Policy) -> Topology:
    assignment = resolve_rails(topo, policy)
    for name in assignment.unmatched:
        click.echo(f"warning: policy names NIC {name!r}, which this node does not have", err=True)
    return assignment.apply(topo)


def _table(rows: list[list[str]]) -> str:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join(
        "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows
    )


def _net(rail: int | None, plane: int | None) -> str:
    """``rail`` for plane 0, else ``rail.plane``; ``-`` without a rail."""
    if rail is None:
        return "-"
    return f"{rail}.{plane}" if plane else str(rail)


def _dash(v: object) -> str:
    return "-" if v is None else str(v)


def render_topology(topo: Topology) -> str:
    """The human-readable table printed by ``railhop topology``."""
    rows = [["NIC", "NETDEV", "LINK", "RAIL", "NUMA", "PCI PATH", "GPU", "DIST", "STATE"]]
    for n in topo.nics:
        near = topo.nearest_gpu(n)
        up = n.link_up
        rows.append(
            [
                n.name,
                _dash(n.netdev),
                _dash(n.link_layer),
                _net(n.rail, n.plane),
                _dash(n.numa_node),
                topo_mod.compact_pci_path(n.pci) if n.pci else "(virtual)",
                str(near[0].index) if near else "-",
                near[1].name if near else "-",
                "unknown" if up is None else ("up" if up else "down"),
            ]
        )
    out = [_table(rows)]
    if topo.gpus:
        grows = [["GPU", "VENDOR", "PCI", "NUMA", "PCI PATH"]]
        grows += [
            [
                str(g.index),
                g.vendor,
                g.pci.bdf,
                _dash(g.numa_node),
                topo_mod.compact_pci_path(g.pci),
            ]
            for g in topo.gpus
        ]
        out += ["", _table(grows)]
    numa = ", ".join(f"{x.id} (cpus {x.cpulist or '?'})" for x in topo.numa_nodes) or "unknown"
    out += ["", f"NUMA nodes: {numa}"]
    return "\n".join(out)


# --------------------------------------------------------------------------------------------
# railhop topology


@cli.command("topology", cls=JsonCommand)
@_root_option
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")
@_policy_option
@_netdev_option
def topology_cmd(
    *, root: Path, as_json: bool, policy_file: Path | None, netdevs: tuple[str, ...]
) -> None:
    """Show the node's NICs, rails, NUMA nodes, PCI paths and nearest GPUs.

    RAIL is rail[.plane]; DIST is the PCIe distance class of the NIC from its nearest GPU
    (PIX < PXB < PHB < NODE < SYS); STATE is the link state read from sysfs.
    """
    topo = _with_rails(_read(root, netdevs), _load_policy(policy_file))
    if as_json:
        emit(topo_mod.to_dict(topo))
    else:
        click.echo(render_topology(topo))


# --------------------------------------------------------------------------------------------
# railhop policy ...


@cli.group("policy")
def policy_group() -> None:
    """Validate policy files and preview the plans they produce."""


@policy_group.command("check", cls=JsonCommand)
@click.argument(
    "files",
    nargs=-1,
    required=True,
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document instead.")
def policy_check_cmd(files: tuple[Path, ...], as_json: bool) -> None:
    """Validate policy FILES; print every problem as FILE:LINE:COL: FIELD: MESSAGE (got VALUE).

    Exits 1 when any file has a problem, 2 when a file cannot be read.
    """
    bad = 0
    doc: list[dict[str, object]] = []
    for f in files:
        try:
            issues = check_file(f)
        except PolicyError as e:
            raise DomainError(str(e)) from e
        bad += bool(issues)
        if as_json:
            doc.append(
                {
                    "file": str(f),
                    "ok": not issues,
                    "issues": [
                        {
                            "line": i.line,
                            "column": i.column,
                            "field": i.field,
                            "message": i.message,
                            "value": i.value,
                        }
                        for i in issues
                    ],
                }
            )
            continue
        for issue in issues:
            click.echo(str(issue))
        if not issues:
            click.echo(f"{f}: ok")
    if as_json:
        emit({"files": doc, "ok": not bad})
    if bad:
        if not as_json:
            click.echo(f"{bad} of {len(files)} policy file(s) have errors", err=True)
        raise click.exceptions.Exit(1)


def render_plan(p: Plan) -> str:
    """Readable form of a plan (``railhop policy plan``)."""
    if not p.entries:
        return "every managed NIC is usable: nothing to plan"
    lines = []
    for e in p.entries:
        head = f"{e.nic} (rail {_net(*e.network)}, {e.state.value}): {e.action}"
        lines.append(head + (" -> NO BACKUP, escalate" if e.escalate else ""))
        for rank, pair in enumerate(e.pairs, start=1):
            alts = ",".join(_net(*a) for a in pair.alternates)
            lines.append(
                f"  {rank}. {pair.local:<10} weight {pair.weight:5.3f}  {pair.distance.name:<4}"
                f"  remote rail {_net(*pair.remote)}" + (f" (else {alts})" if alts else "")
            )
    loads = ", ".join(f"{n} {u:.2f}" for n, u in sorted(p.loads.items()))
    lines.append(f"utilisation after migration: {loads}")
    lines += [f"warning: {w}" for w in p.warnings]
    return "\n".join(lines)


@policy_group.command("plan", cls=JsonCommand)
@click.argument("policy_file", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@_root_option
@click.option("--down", multiple=True, metavar="NIC", help="Treat NIC as down (repeatable).")
@click.option("--suspect", multiple=True, metavar="NIC", help="Treat NIC as suspect (repeatable).")
@click.option("--json", "as_json", is_flag=True, help="Print JSON instead of text.")
@_netdev_option
def policy_plan_cmd(
    *,
    policy_file: Path,
    root: Path,
    down: tuple[str, ...],
    suspect: tuple[str, ...],
    as_json: bool,
    netdevs: tuple[str, ...],
) -> None:
    """Preview the backup plan POLICY_FILE gives this node when the named NICs fail."""
    policy = _load_policy(policy_file)
    topo = _read(root, netdevs)
    health: dict[str, NicState] = {}
    for names, state in ((down, NicState.DOWN), (suspect, NicState.SUSPECT)):
        for name in names:
            nic = topo.find_nic(name)
            if nic is None:
                raise click.BadParameter(f"no NIC named {name!r} under {root}", param_hint="NIC")
            health[nic.name] = state
    result = plan(topo, health, policy)
    if as_json:
        emit(plan_to_dict(result))
    else:
        click.echo(render_plan(result))


def plan_to_dict(p: Plan) -> dict[str, object]:
    return {
        "rails": {n: list(r) for n, r in sorted(p.rails.items())},
        "entries": [
            {
                "nic": e.nic,
                "network": list(e.network),
                "state": e.state.value,
                "action": e.action,
                "escalate": e.escalate,
                "pairs": [
                    {
                        "local": x.local,
                        "remote": list(x.remote),
                        "alternates": [list(a) for a in x.alternates],
                        "distance": x.distance.name,
                        "weight": x.weight,
                    }
                    for x in e.pairs
                ],
            }
            for e in p.entries
        ],
        "loads": dict(sorted(p.loads.items())),
        "warnings": list(p.warnings),
    }


# --------------------------------------------------------------------------------------------
# status, agent, sources; commands of other packages (the lab's `railhop demo`)


class Unknown(click.ClickException):
    """The health the command was asked to judge cannot be known (no live agent): exit 3, the
    node-problem-detector's "unknown"."""

    exit_code = 3


@cli.command("status", cls=JsonCommand)
@click.option(
    "--run-dir",
    type=click.Path(file_okay=False, path_type=Path),
    envvar="RAILHOP_RUN_DIR",
    default=None,
    help="The agent's run directory (default $RAILHOP_RUN_DIR or /run/railhop).",
)
@click.option(
    "--check",
    is_flag=True,
    help="Exit 1 unless the agent is alive (heartbeat fresh, not shut down): for probes.",
)
@click.option(
    "--nics",
    "check_nics_",
    is_flag=True,
    help="With --check: judge NIC health instead: print one line; exit 0 when the policy's "
    "health.min_rails_up rails are up, 1 when not, 3 when unknown (no live agent): "
    "node-problem-detector's contract.",
)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON document instead.")
def status_cmd(run_dir: Path | None, check: bool, check_nics_: bool, as_json: bool) -> None:
    """Live NIC health and plans as published by the agent.

    Exits 1 when there is no agent table (no agent ran here) or, with --check, when the agent
    is not alive. With --check --nics: 0 enough rails up, 1 too few (the line lists the NICs
    that are not up), 3 unknown (no table, unreadable, or the agent not alive).
    """
    import time

    from railhop.control import ControlError
    from railhop.control.plane import default_run_dir
    from railhop.control.status import (
        STATUS_FILE,
        agent_alive,
        check_nics,
        format_status,
        read_status_doc,
        status_to_dict,
    )
    from railhop.control.table import read_table

    if check_nics_ and not check:
        raise click.UsageError("--nics is a mode of --check: use --check --nics")
    table = (run_dir or default_run_dir()) / "health.tbl"
    nic_mode = check and check_nics_
    if not table.exists():
        _status_fail(f"no agent table at {table}: is `railhop agent` running?", nic_mode, as_json)
    try:
        snap = read_table(table)
    except (ControlError, OSError) as e:
        _status_fail(f"{table}: {e}", nic_mode, as_json)
    now = time.monotonic_ns()
    if nic_mode:
        if not agent_alive(snap, now):
            _status_fail(f"agent pid {snap.agent_pid} is not alive ({table})", True, as_json)
        result = check_nics(snap)
        if as_json:
            doc = status_to_dict(snap, now, lanes=None)
            emit({**doc, "check": result.to_dict()})
        else:
            click.echo(("ok: " if result.ok else "degraded: ") + result.message)
        raise SystemExit(0 if result.ok else 1)
    lanes = read_status_doc(table.parent / STATUS_FILE)
    if as_json:
        emit(status_to_dict(snap, now, lanes=lanes))
    else:
        click.echo(format_status(snap, now, lanes=lanes), nl=False)
    if check and not agent_alive(snap, now):
        raise SystemExit(1)


def _status_fail(message: str, unknown: bool, as_json: bool) -> NoReturn:
    """No table or no live agent: a finding (exit 1), or with --check --nics "unknown" (exit 3,
    the line also on stdout, where node-problem-detector reads it)."""
    if not unknown:
        raise Finding(message)
    if not as_json:
        click.echo(f"unknown: {message}")
    raise Unknown(message)


@cli.command("agent")
@click.option(
    "--policy",
    "policy_path",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    default=None,
    help="Site policy file (default: the built-in permissive policy). Reloaded when it changes.",
)
@click.option(
    "--run-dir",
    type=click.Path(file_okay=False, path_type=Path),
    envvar="RAILHOP_RUN_DIR",
    default=None,
    help="Where health.tbl and agent.sock live (default $RAILHOP_RUN_DIR or /run/railhop).",
)
@_root_option
@click.option(
    "--nic",
    "nics",
    multiple=True,
    help="Netdevs to manage (repeatable or a,b). Default: RAILHOP_NICS, else auto-detection.",
)
@click.option("--owner-uid", type=int, default=None, help="uid of the jobs (socket owner).")
@click.option(
    "--socket-group",
    default=None,
    help="Jobs of every member of this group (name or gid) may send lane events (socket 0660).",
)
@click.option(
    "--socket-any-uid",
    is_flag=True,
    help="Any uid may send lane events (socket 0666); events are attributed and rate-limited "
    "per uid and process.",
)
@click.option("--heartbeat-ms", type=click.IntRange(10, 60000), default=250, show_default=True)
@click.option("--duration", type=click.FloatRange(min=0.0), default=None, help="Stop after SEC.")
@click.option(
    "--metrics-port",
    type=click.IntRange(0, 65535),
    envvar="RAILHOP_METRICS_PORT",
    default=None,
    help="Serve Prometheus metrics on this port (0: any free port; default: off).",
)
@click.option(
    "--metrics-addr",
    envvar="RAILHOP_METRICS_ADDR",
    default="127.0.0.1",
    show_default=True,
    help="Address of the metrics endpoint (0.0.0.0: every address, for a remote scraper).",
)
@click.option(
    "--traces/--no-traces",
    default=True,
    show_default=True,
    help="Export failover traces as the OTEL_* variables say (OTEL_TRACES_EXPORTER=none: off).",
)
@click.option(
    "--trace-file",
    type=click.Path(dir_okay=False, path_type=Path),
    envvar="RAILHOP_TRACE_FILE",
    default=None,
    help="Also append failover traces as OTLP/JSON lines to this file.",
)
@click.option(
    "--usdt-lib",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    default=None,
    help="Trace this plugin library's USDT probes (lane events, per-lane bytes/latency).",
)
@click.option(
    "--plugin-nics",
    default="",
    envvar="RAILHOP_NICS",
    help="The plugins' NIC order as in RAILHOP_NICS (ifname[:rail],...).",
)
@click.option(
    "--sources",
    default="netlink,sysfs,ebpf,rdma,verbs",
    show_default=True,
    help="Sources to start (comma-separated: netlink, sysfs, ebpf, rdma, verbs; eBPF and rdma "
    "start in the background; rdma and verbs only where a managed NIC is an RDMA device).",
)
@click.option(
    "--keep-capabilities",
    is_flag=True,
    help="Do not drop capabilities once the sources have started (debugging).",
)
@click.option(
    "--node-status-interval",
    type=click.FloatRange(min=0.1, max=3600.0),
    default=5.0,
    show_default=True,
    help="Rewrite RUN_DIR/node-status (the shell-readable health the node-problem-detector "
    "check reads) at least every SEC seconds, and whenever NIC health changes.",
)
@click.option(
    "--nfd-features-dir",
    type=click.Path(file_okay=False, path_type=Path),
    envvar="RAILHOP_NFD_FEATURES_DIR",
    default=None,
    help="Write node labels (railhop.io/rails-up, railhop.io/degraded, ...) as a "
    "node-feature-discovery local feature file into DIR (its features.d); default: off.",
)
@click.option("--check", is_flag=True, help="Print the capability report and exit.")
@click.option("-v", "--verbose", is_flag=True, help="Debug logging.")
@click.option(
    "--log-format",
    type=click.Choice(["text", "json"]),
    envvar="RAILHOP_LOG_FORMAT",
    default="text",
    show_default=True,
    help="Log lines as text (TS LEVEL LOGGER: MSG) or one JSON object per line; "
    "timestamps are ISO 8601 UTC with milliseconds.",
)
def agent_cmd(
    policy_path: Path | None,
    run_dir: Path | None,
    root: Path,
    nics: tuple[str, ...],
    owner_uid: int | None,
    socket_group: str | None,
    socket_any_uid: bool,
    heartbeat_ms: int,
    duration: float | None,
    metrics_port: int | None,
    metrics_addr: str,
    traces: bool,
    trace_file: Path | None,
    usdt_lib: Path | None,
    plugin_nics: str,
    sources: str,
    keep_capabilities: bool,
    node_status_interval: float,
    nfd_features_dir: Path | None,
    check: bool,
    verbose: bool,
    log_format: str,
) -> None:
    """Run the node agent: sources -> health -> plan -> plugins (stops cleanly on SIGTERM)."""
    import logging
    import os

    from railhop import logfmt
    from railhop.control import ControlError
    from railhop.daemon import AgentConfig, AgentError, parse_nics, run_agent
    from railhop.daemon.config import choose_nics

    if check:
        from railhop.sources.cli import run_check

        caps = run_check(parse_nics(nics), str(usdt_lib) if usdt_lib else None, False)
        raise SystemExit(0 if any(c.attached for c in caps) else 1)
    logfmt.configure(logging.DEBUG if verbose else logging.INFO, log_format)
    managed, nics_from = choose_nics(nics, os.environ)
    cfg = AgentConfig(
        policy_path=policy_path,
        run_dir=run_dir,
        sys_root=root,
        nics=managed,
        nics_from=nics_from,
        heartbeat_ms=heartbeat_ms,
        owner_uid=owner_uid,
        socket_gid=_gid(socket_group),
        socket_any_uid=socket_any_uid,
        duration_s=duration,
        traces=traces,
        trace_file=trace_file,
        metrics_port=metrics_port,
        metrics_addr=metrics_addr,
        usdt_lib=usdt_lib,
        plugin_nics=tuple(x.split(":")[0] for x in plugin_nics.split(",") if x),
        sources=tuple(x for x in sources.split(",") if x),
        drop_capabilities=not keep_capabilities,
        node_status_interval_s=node_status_interval,
        nfd_features_dir=nfd_features_dir,
    )
    try:
        code = run_agent(cfg)
    except PolicyError as e:
        raise click.BadParameter(str(e), param_hint="--policy") from e
    except (AgentError, ControlError) as e:
        raise DomainError(str(e)) from e
    raise SystemExit(code)


def _gid(group: str | None) -> int | None:
    if group is None:
        return None
    if group.isdigit():
        return int(group)
    import grp

    try:
        return grp.getgrnam(group).gr_gid
    except KeyError:
        raise click.BadParameter(f"no group {group!r}", param_hint="--socket-group") from None


def _register_sources() -> None:
    from railhop.sources.cli import sources_cmd

    cli.add_command(sources_cmd)


COMMANDS_GROUP = "railhop.commands"  # entry points: commands other packages add to `railhop`
LAB_COMMANDS = {"demo": "Failover demo on an emulated fabric (needs the railhop lab)."}


def _missing_lab_command(name: str, doc: str) -> click.Command:
    """Stands for a lab command when the lab is not installed: says how to get it (exit 2)."""

    @click.command(
        name,
        help=doc,
        context_settings={"ignore_unknown_options": True, "allow_extra_args": True},
    )
    def cmd() -> None:
        raise DomainError(
            f"`railhop {name}` is part of the railhop lab (package railhop-lab), which is not "
            "installed in this environment. From a railhop source tree: `make setup` installs "
            "it, or `pip install ./lab` into the environment that has railhop. Nodes do not "
            "need it: the agent runs without it."
        )

    return cmd


def _register_commands() -> None:
    """Commands that other installed packages register in the ``railhop.commands`` entry-point
    group; the lab's commands are stood in for when the lab is missing. A command that fails to
    load is left out with a warning (the agent's own commands always work)."""
    from importlib.metadata import entry_points

    for ep in entry_points(group=COMMANDS_GROUP):
        if ep.name in cli.commands:
            continue
        try:
            cmd = ep.load()
        except Exception as e:
            click.echo(f"warning: command {ep.name!r} ({ep.value}) failed to load: {e}", err=True)
            continue
        if isinstance(cmd, click.Command):
            cli.add_command(cmd, ep.name)
    for name, doc in LAB_COMMANDS.items():
        if name not in cli.commands:
            cli.add_command(_missing_lab_command(name, doc))


_register_sources()
_register_commands()


def main() -> None:
    cli()
