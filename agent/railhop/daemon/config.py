"""The agent's configuration: what ``railhop agent`` parses its options into."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from railhop.sources.ebpf.loader import start_timeout_s


class AgentError(Exception):
    """Base class of the daemon's errors (bad configuration, nothing to manage)."""


@dataclass(frozen=True)
class AgentConfig:
    policy_path: Path | None = None  # None: the built-in default policy
    run_dir: Path | None = None  # None: $RAILHOP_RUN_DIR or /run/railhop
    sys_root: Path = Path("/")
    nics: tuple[str, ...] = ()  # netdevs to manage; empty: every NIC the topology finds
    nics_from: str = ""  # where ``nics`` came from ("--nic", "RAILHOP_NICS"), for the log
    heartbeat_ms: int = 250
    owner_uid: int | None = None  # the job's uid when the agent runs as root
    socket_gid: int | None = None  # jobs of every member of this group may send lane events
    socket_any_uid: bool = False  # any uid may send (attributed and rate-limited per uid)
    reload_interval_s: float = 2.0
    shutdown_timeout_s: float = 5.0
    duration_s: float | None = None  # stop after this long (tests, demo); None: until a signal
    # which default sources to start; "ebpf": carrier (raw tracepoint / qdisc proxy) and TCP
    # lane probes, started in the background when the capability check allows them; "rdma"
    # (RDMA/driver eBPF probes, in the background too) and "verbs" (async events): only where
    # a managed NIC is an RDMA device
    sources: tuple[str, ...] = ("netlink", "sysfs", "ebpf", "rdma", "verbs")
    # trial child + bcc compile, on a busy node (RAILHOP_EBPF_TIMEOUT_S: sources.ebpf.loader)
    ebpf_start_timeout_s: float = dataclasses.field(default_factory=start_timeout_s)
    status_interval_s: float = 0.25  # status.json at most this often
    traces: bool = False  # export failover traces as the OTEL_* variables say
    trace_file: Path | None = None  # also append OTLP/JSON lines here
    metrics_port: int | None = None  # Prometheus endpoint; None: off, 0: an ephemeral port
    metrics_addr: str = "127.0.0.1"  # local scrapes only; --metrics-addr 0.0.0.0 for a remote
    metrics_retry_s: float = 10.0  # a busy metrics port: try again this often
    # after the sources start (railhop.daemon.privileges); `railhop agent` turns it on, an
    # agent embedded in another process (tests, the lab) leaves its host's thread alone
    drop_capabilities: bool = False
    # the plugin library to trace with USDT (lane events for traces/metrics when the plugin does
    # not send them on agent.sock, and per-lane bytes/latency); None: no USDT source
    usdt_lib: Path | None = None
    plugin_nics: tuple[str, ...] = ()  # the plugins' NIC order (RAILHOP_NICS); empty: auto
    # ``node-status`` in the run dir (railhop.daemon.nodestatus): rewritten on every publish
    # and at least this often (its heartbeat), for shell-only readers (the NPD check)
    node_status_interval_s: float = 5.0
    # node-feature-discovery's features.d: the agent writes its node labels there; None: off
    nfd_features_dir: Path | None = None


def with_absolute_paths(cfg: AgentConfig) -> AgentConfig:
    """``cfg`` with every path made absolute against the current directory, once, at start.

    The current directory is process-wide, and libbcc changes it while it compiles an eBPF
    program (it enters the kernel's build directory and back, in the source's start-up thread):
    a relative ``--policy`` read by the loop at that moment was "not found" (issue 19, 9)."""

    def absolute(p: Path | None) -> Path | None:
        return None if p is None else Path(os.path.abspath(p))

    return dataclasses.replace(
        cfg,
        policy_path=absolute(cfg.policy_path),
        run_dir=absolute(cfg.run_dir),
        sys_root=Path(os.path.abspath(cfg.sys_root)),
        trace_file=absolute(cfg.trace_file),
        usdt_lib=absolute(cfg.usdt_lib),
        nfd_features_dir=absolute(cfg.nfd_features_dir),
    )


def choose_nics(cli: Iterable[str], env: Mapping[str, str]) -> tuple[tuple[str, ...], str]:
    """The NICs to manage and where they come from: ``--nic`` first, then ``RAILHOP_NICS``
    (the plugin's own list, ``ifname[:rail],...``: the agent then manages what the jobs use,
    veths without a PCI device included), else auto-detection (``()``, ``"auto-detection"``)."""
    given = parse_nics(cli)
    if given:
        return given, "--nic"
    from_env = env_nic_names(env.get("RAILHOP_NICS", ""))
    if from_env:
        return from_env, "RAILHOP_NICS"
    return (), "auto-detection"


def env_nic_names(value: str) -> tuple[str, ...]:
    """The names in a ``RAILHOP_NICS`` value, read as exact names. The plugin reads the
    variable in ``NCCL_SOCKET_IFNAME`` syntax (prefixes, ``^`` to exclude, ``=`` for exact
    names); the agent does not expand prefixes: a leading ``=`` is dropped (the same meaning),
    and an exclusion list (``^...``) names no NIC to manage, so it gives ``()`` (auto-detection).
    """
    value = value.strip()
    if value.startswith("^"):
        return ()
    value = value.removeprefix("=")
    return tuple(n for n in (x.split(":")[0].strip() for x in value.split(",")) if n)


def parse_nics(values: Iterable[str]) -> tuple[str, ...]:
    """``--nic a,b --nic c`` -> ("a", "b", "c")."""
    return tuple(x for v in values for x in v.split(",") if x)
