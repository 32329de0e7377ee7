"""The agent's configuration: what ``railhop agent`` parses its options into."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path


class AgentError(Exception):
    """Base class of the daemon's errors (bad configuration, nothing to manage)."""


@dataclass(frozen=True)
class AgentConfig:
    policy_path: Path | None = None  # None: the built-in default policy
    run_dir: Path | None = None  # None: $RAILHOP_RUN_DIR or /run/railhop
    sys_root: Path = Path("/")
    nics: tuple[str, ...] = ()  # netdevs to manage; empty: every NIC the topology finds
    heartbeat_ms: int = 250
    owner_uid: int | None = None  # the job's uid when the agent runs as root
    reload_interval_s: float = 2.0
    shutdown_timeout_s: float = 5.0
    duration_s: float | None = None  # stop after this long (tests, demo); None: until a signal
    # which default sources to start; "ebpf": carrier (raw tracepoint / qdisc proxy) and TCP
    # lane probes, started in the background when the capability check allows them
    sources: tuple[str, ...] = ("netlink", "sysfs", "ebpf")
    ebpf_start_timeout_s: float = 180.0  # trial child + bcc compile, on a busy node
    status_interval_s: float = 0.25  # status.json at most this often
    traces: bool = False  # export failover traces as the OTEL_* variables say
    trace_file: Path | None = None  # also append OTLP/JSON lines here
    metrics_port: int | None = None  # Prometheus endpoint; None: off, 0: an ephemeral port
    metrics_addr: str = "0.0.0.0"  # a scrape target listens on every address
    # the plugin library to trace with USDT (lane events for traces/metrics when the plugin does
    # not send them on agent.sock, and per-lane bytes/latency); None: no USDT source
    usdt_lib: Path | None = None
    plugin_nics: tuple[str, ...] = ()  # the plugins' NIC order (RAILHOP_NICS); empty: auto


def parse_nics(values: Iterable[str]) -> tuple[str, ...]:
    """``--nic a,b --nic c`` -> ("a", "b", "c")."""
    return tuple(x for v in values for x in v.split(",") if x)
