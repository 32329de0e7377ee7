"""The railhop agent: one asyncio process, sources -> health -> plan -> publish.

    signals (netlink, sysfs counters, eBPF, verbs)  ─┐
    plugin lane events (agent.sock)                 ─┴─► health model ─► plan(policy) ─► health.tbl

Deciding is separate from acting. The package is split by what each part does:

- :mod:`~railhop.daemon.config`: :class:`AgentConfig` (what ``railhop agent`` parses its options
  into) and :class:`AgentError`;
- :mod:`~railhop.daemon.translate` (pure): a source's event (a typed ``match`` on the classes of
  :mod:`railhop.sources.events`) or a plugin's lane event as a health event, the plugin's USDT
  probes as lane events, the burst guard;
- :mod:`~railhop.daemon.lanes` (pure but for :func:`write_status`): the plugins' lanes, their
  ports for the TCP probe, the recent failovers, ``status.json``;
- :mod:`~railhop.daemon.sockdiag`: who holds a TCP port (sock_diag), so that a lane's ports
  enter the TCP probe's map only when a socket of the reporter's uid on that NIC holds them;
- :mod:`~railhop.daemon.publish` (pure): health model + plan as the published table and as
  tracing decisions;
- :mod:`~railhop.daemon.nodestatus` (pure): the published NICs as ``node-status`` (plain text
  for the node-problem-detector check, which has only a shell) and as an NFD feature file;
- :mod:`~railhop.daemon.loop`: :class:`Agent`, which only moves data between them on one event
  loop. The sources come from the one catalogue (:mod:`railhop.sources.catalogue`) and live in
  one :class:`railhop.sources.base.Registry` (quick ones start at once, eBPF ones in the
  background while the loop already serves heartbeats).

On the loop:

- every input goes through one inbox; the health model's timers are driven by its
  ``next_deadline()``; a publish happens only when a NIC changed state or the policy changed;
- the policy file is re-read when its mtime changes; a file that turned invalid is logged and
  the last good policy stays in force;
- SIGTERM/SIGINT (or ``duration_s``) stop the loop; shutdown (sources, then the control plane,
  which marks the table "agent gone" and removes the socket, then trace export) is bounded by
  ``shutdown_timeout_s``.

Observability (docs/tracing.md): the same inputs feed a :class:`railhop.tracing.FailoverTracer`
(one OpenTelemetry trace per failover, timed by the events' own timestamps, exported as the
``OTEL_*`` variables say, never blocking the loop) and :class:`railhop.metrics.AgentMetrics`
(a Prometheus endpoint when ``metrics_port`` is set). Plugin lane events come from
``agent.sock``, or from the plugin's USDT probes (``usdt_lib``, :class:`UsdtLaneTranslator`);
USDT ones feed traces and metrics only, never the health model.

The pieces it plugs together (topology reader, policy loader, planner, sources) are parameters,
so tests and the demo run it on fixture trees and emulated fabrics.
"""

from railhop.daemon.config import AgentConfig, AgentError, parse_nics
from railhop.daemon.lanes import LaneBook, write_status
from railhop.daemon.loop import Agent, AgentStats, default_sources, plugin_nic_order, run_agent
from railhop.daemon.publish import decisions, published_state, reason_code, to_published
from railhop.daemon.sockdiag import PortChecker
from railhop.daemon.translate import (
    BurstGuard,
    UsdtLaneTranslator,
    aliases,
    health_event_from_lane,
    health_event_from_source,
    health_event_from_verbs,
)

__all__ = [
    "Agent",
    "AgentConfig",
    "AgentError",
    "AgentStats",
    "BurstGuard",
    "LaneBook",
    "PortChecker",
    "UsdtLaneTranslator",
    "aliases",
    "decisions",
    "default_sources",
    "health_event_from_lane",
    "health_event_from_source",
    "health_event_from_verbs",
    "parse_nics",
    "plugin_nic_order",
    "published_state",
    "reason_code",
    "run_agent",
    "to_published",
    "write_status",
]
