"""Pure: the node's NIC health as plain text for consumers with nothing but a shell.

Two files, both written by the agent's loop (:meth:`railhop.daemon.loop.Agent`) atomically
(temp file + rename):

- ``$RAILHOP_RUN_DIR/node-status`` (:func:`format_node_status`), read by the
  node-problem-detector check ``deploy/helm/railhop/files/railhop-check.sh`` (POSIX ``sh`` and
  ``date``, no Python, no railhop). One ``key value...`` line each::

      # railhop node status (docs/operations.md, "Node health to scheduling")
      version 1
      heartbeat 1733572000      # CLOCK_REALTIME seconds of the write (compare with `date +%s`)
      refresh 5                 # the agent rewrites the file at least this often (seconds)
      pid 4242
      rails_up 3
      rails_total 4
      min_rails_up 0            # the policy's health.min_rails_up (0: every rail)
      verdict degraded          # ok | degraded | gone (the agent shut down cleanly)
      nic nic0 0 up none        # nic IFNAME RAIL|- STATE REASON
      nic nic2 2 down carrier

  A reader treats a missing file, another version, ``verdict gone`` or a heartbeat older
  than its bound (3 x ``refresh``, at least 10 s) as unknown.

- an NFD local feature file (:func:`nfd_features`), ``key=value`` lines that
  node-feature-discovery's ``local`` source turns into node labels (no API credentials on the
  agent's side), with an ``# +expiry-time=`` directive so that a dead agent's labels expire.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

from railhop.control import NicHealth
from railhop.control.status import count_rails

NODE_STATUS_FILE = "node-status"
NODE_STATUS_VERSION = 1
NFD_FEATURE_FILE = "railhop"  # in the features.d directory; NFD ignores dot files (our temps)
NFD_PREFIX = "railhop.io/"
VERDICTS = ("ok", "degraded", "gone")


@dataclass(frozen=True)
class NodeStatus:
    """What ``node-status`` says (:func:`node_status` builds it, :func:`format_node_status`
    writes it, :func:`parse_node_status` reads it back)."""

    heartbeat_s: int  # CLOCK_REALTIME seconds
    refresh_s: int
    agent_pid: int
    rails_up: int
    rails_total: int
    min_rails_up: int  # the policy's value: 0 means every rail
    verdict: str  # ok | degraded | gone
    nics: tuple[tuple[str, int | None, str, str], ...] = ()  # (ifname, rail, state, reason)

    @property
    def rails_wanted(self) -> int:
        return self.min_rails_up or self.rails_total

    @property
    def degraded(self) -> bool:
        return self.rails_total == 0 or self.rails_up < self.rails_wanted


def node_status(
    nics: Sequence[NicHealth],
    min_rails_up: int,
    *,
    heartbeat_s: int,
    refresh_s: int,
    agent_pid: int,
    gone: bool = False,
) -> NodeStatus:
    """Pure: the node status of the published NICs under the policy's ``min_rails_up``, with
    the same count as ``railhop status --check --nics`` (:func:`count_rails`)."""
    up, total, _ = count_rails(nics)
    want = min_rails_up or total
    verdict = "gone" if gone else ("ok" if total > 0 and up >= want else "degraded")
    return NodeStatus(
        heartbeat_s=heartbeat_s,
        refresh_s=max(1, refresh_s),
        agent_pid=agent_pid,
        rails_up=up,
        rails_total=total,
        min_rails_up=min_rails_up,
        verdict=verdict,
        nics=tuple((n.ifname, n.rail, n.state.name.lower(), n.reason.name.lower()) for n in nics),
    )


def format_node_status(st: NodeStatus) -> bytes:
    """Pure: ``node-status``'s bytes (every line ends with a newline, a shell's ``read``
    sees the last one too)."""
    lines = [
        '# railhop node status (docs/operations.md, "Node health to scheduling")',
        f"version {NODE_STATUS_VERSION}",
        f"heartbeat {st.heartbeat_s}",
        f"refresh {st.refresh_s}",
        f"pid {st.agent_pid}",
        f"rails_up {st.rails_up}",
        f"rails_total {st.rails_total}",
        f"min_rails_up {st.min_rails_up}",
        f"verdict {st.verdict}",
    ]
    for ifname, rail, state, reason in st.nics:
        lines.append(f"nic {ifname} {'-' if rail is None else rail} {state} {reason}")
    return ("\n".join(lines) + "\n").encode()


class NodeStatusError(ValueError):
    """A ``node-status`` text that is not version 1 or lacks a field."""


def parse_node_status(text: str) -> NodeStatus:
    """Pure: the inverse of :func:`format_node_status` (for tests and tools); NodeStatusError
    for another version, a missing or malformed field or an unknown verdict."""
    fields: dict[str, str] = {}
    nics = []
    for line in text.splitlines():
        parts = line.split()
        if not parts or parts[0].startswith("#"):
            continue
        if parts[0] == "nic":
            if len(parts) != 5:
                raise NodeStatusError(f"bad nic line: {line!r}")
            _, name, rail, state, reason = parts
            nics.append((name, None if rail == "-" else int(rail), state, reason))
        elif len(parts) == 2:
            fields[parts[0]] = parts[1]
    if fields.get("version") != str(NODE_STATUS_VERSION):
        raise NodeStatusError(f"version {fields.get('version')!r}, not {NODE_STATUS_VERSION}")
    try:
        st = NodeStatus(
            heartbeat_s=int(fields["heartbeat"]),
            refresh_s=int(fields["refresh"]),
            agent_pid=int(fields["pid"]),
            rails_up=int(fields["rails_up"]),
            rails_total=int(fields["rails_total"]),
            min_rails_up=int(fields["min_rails_up"]),
            verdict=fields["verdict"],
            nics=tuple(nics),
        )
    except KeyError as e:
        raise NodeStatusError(f"missing field {e.args[0]}") from e
    except ValueError as e:
        raise NodeStatusError(str(e)) from e
    if st.verdict not in VERDICTS:
        raise NodeStatusError(f"unknown verdict {st.verdict!r}")
    return st


def stale_bound_s(refresh_s: int) -> int:
    """How old a heartbeat may be before a reader calls the file unknown (the check script's
    default: 3 missed rewrites, at least 10 s)."""
    return max(10, 3 * refresh_s)


def nfd_features(st: NodeStatus, expiry_s: int) -> bytes:
    """Pure: the NFD local feature file for ``st``: node labels ``railhop.io/rails-up``,
    ``rails-total``, ``min-rails-up`` (the count wanted: the policy's, or every rail) and
    ``degraded`` (``true``/``false``), valid until ``expiry_s`` (CLOCK_REALTIME seconds, as
    NFD's ``# +expiry-time=`` directive in RFC 3339 UTC): a dead agent's labels expire."""
    expiry = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(expiry_s))
    lines = [
        "# railhop node labels for node-feature-discovery's local source",
        f"# +expiry-time={expiry}",
        f"{NFD_PREFIX}rails-up={st.rails_up}",
        f"{NFD_PREFIX}rails-total={st.rails_total}",
        f"{NFD_PREFIX}min-rails-up={st.rails_wanted}",
        f"{NFD_PREFIX}degraded={'true' if st.degraded else 'false'}",
    ]
    return ("\n".join(lines) + "\n").encode()
