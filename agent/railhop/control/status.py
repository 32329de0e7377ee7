"""``railhop status`` text from a table snapshot (pure: no I/O, the caller passes the time)."""

from __future__ import annotations

from railhop.control.layout import TableSnapshot


def _age(now_ns: int, then_ns: int) -> str:
    if then_ns <= 0 or then_ns > now_ns:
        return "-"
    s = (now_ns - then_ns) / 1e9
    if s < 120:
        return f"{s:.1f}s"
    if s < 7200:
        return f"{s / 60:.0f}m"
    return f"{s / 3600:.0f}h"


def _stale(snap: TableSnapshot, now_ns: int, stale_ns: int | None) -> bool:
    stale = stale_ns if stale_ns is not None else 8 * snap.heartbeat_ms * 1_000_000
    return bool(stale) and now_ns - snap.heartbeat_ns > stale


def agent_alive(snap: TableSnapshot, now_ns: int, *, stale_ns: int | None = None) -> bool:
    """True while the agent that wrote ``snap`` is running and its heartbeat is fresh."""
    return not snap.agent_gone and not _stale(snap, now_ns, stale_ns)


def format_status(snap: TableSnapshot, now_ns: int, *, stale_ns: int | None = None) -> str:
    """A readable table: agent liveness, then one line per NIC with its plan."""
    if snap.agent_gone:
        alive = "gone (shut down cleanly)"
    elif _stale(snap, now_ns, stale_ns):
        alive = f"silent for {_age(now_ns, snap.heartbeat_ns)} (plugins work alone)"
    else:
        alive = "alive"
    lines = [
        f"agent pid {snap.agent_pid} generation {snap.generation}: {alive}; "
        f"publish #{snap.publish_count} {_age(now_ns, snap.publish_ns)} ago",
        f"{'NIC':16} {'rail':>4} {'state':10} {'since':>7} {'reason':14} {'pci':13} backups",
    ]
    for n in snap.nics:
        plan = snap.plans.get(n.ifname, ())
        backups = ", ".join(
            f"{b.local_nic}(rail {'*' if b.remote_rail is None else b.remote_rail}, w {b.weight})"
            for b in plan
        )
        lines.append(
            f"{n.ifname:16} {'-' if n.rail is None else n.rail:>4} {n.state.name.lower():10} "
            f"{_age(now_ns, n.since_ns):>7} {n.reason.name.lower():14} {n.pci or '-':13} "
            f"{backups or '-'}"
        )
    return "\n".join(lines)
