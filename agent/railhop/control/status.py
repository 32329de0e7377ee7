"""``railhop status`` text from a table snapshot and the agent's ``status.json`` (connections
per NIC, recent failovers). Formatting is pure (the caller passes the time); only
:func:`read_status_doc` reads a file."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from railhop.control.layout import NicHealth, NicState, TableSnapshot

STATUS_FILE = "status.json"


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


def read_status_doc(path: Path) -> dict[str, Any] | None:
    """The agent's ``status.json`` (written atomically), or None when absent or unreadable."""
    try:
        doc = json.loads(path.read_bytes())
    except (OSError, ValueError):
        return None
    if not isinstance(doc, dict) or doc.get("version") != 1:
        return None
    return doc


def _int(v: object) -> int:
    return v if isinstance(v, int) and not isinstance(v, bool) else 0


def format_lanes(doc: Mapping[str, Any], now_ns: int, *, recent: int = 8) -> list[str]:
    """Lines for connections per NIC and the most recent failovers / fail-backs."""
    nics = doc.get("nics")
    nics = nics if isinstance(nics, dict) else {}
    lines = [f"{'NIC':16} {'lanes':>5} {'conns':>5} {'procs':>5}"]
    for name in sorted(nics):
        v = nics[name] if isinstance(nics[name], dict) else {}
        lines.append(
            f"{name:16} {_int(v.get('lanes')):>5} {_int(v.get('connections')):>5} "
            f"{_int(v.get('processes')):>5}"
        )
    if not nics:
        lines.append("(no lanes reported by plugins)")
    events = doc.get("recent")
    events = [e for e in events if isinstance(e, dict)] if isinstance(events, list) else []
    lines.append(
        f"failovers {_int(doc.get('failovers_total'))}, "
        f"fail-backs {_int(doc.get('failbacks_total'))}; recent:"
    )
    for e in events[-recent:]:
        dur = e.get("duration_ms")
        took = f" in {dur:.1f} ms" if isinstance(dur, int | float) else ""
        err = f" errno {_int(e.get('error'))}" if _int(e.get("error")) else ""
        if _int(e.get("bytes_replayed")):
            err += f", {_int(e.get('bytes_replayed'))} B replayed"
        lines.append(
            f"  {_age(now_ns, _int(e.get('t_ns'))):>7} ago  {e.get('kind', '?')!s:9} "
            f"{e.get('nic', '?')!s:16} pid {_int(e.get('pid'))} "
            f"conn {_int(e.get('conn')):016x}{took}{err}"
        )
    if not events:
        lines.append("  (none)")
    return lines


def format_status(
    snap: TableSnapshot,
    now_ns: int,
    *,
    stale_ns: int | None = None,
    lanes: Mapping[str, Any] | None = None,
) -> str:
    """A readable table: agent liveness, then one line per NIC with its plan; then, given the
    same agent's ``status.json`` (``lanes``), connections per NIC and recent failovers."""
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
    if lanes is not None and _int(lanes.get("agent_pid")) == snap.agent_pid:
        lines += format_agent(lanes)
        lines.append("")
        lines += format_lanes(lanes, now_ns)
    return "\n".join(lines)


def _age_s(now_ns: int, then_ns: int) -> float | None:
    return None if then_ns <= 0 or then_ns > now_ns else round((now_ns - then_ns) / 1e9, 3)


def status_to_dict(
    snap: TableSnapshot,
    now_ns: int,
    *,
    stale_ns: int | None = None,
    lanes: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """``railhop status --json``: the same facts as :func:`format_status`, ages in seconds
    (None: unknown). ``agent.status`` is the agent's ``status.json`` when it is this agent's."""
    if snap.agent_gone:
        liveness = "gone"
    elif _stale(snap, now_ns, stale_ns):
        liveness = "silent"
    else:
        liveness = "alive"
    same = lanes is not None and _int(lanes.get("agent_pid")) == snap.agent_pid
    return {
        "version": 1,
        "agent": {
            "pid": snap.agent_pid,
            "generation": snap.generation,
            "liveness": liveness,
            "alive": liveness == "alive",
            "heartbeat_age_s": _age_s(now_ns, snap.heartbeat_ns),
            "heartbeat_ms": snap.heartbeat_ms,
            "publish_count": snap.publish_count,
            "publish_age_s": _age_s(now_ns, snap.publish_ns),
        },
        "nics": [
            {
                "ifname": n.ifname,
                "rail": n.rail,
                "state": n.state.name.lower(),
                "since_age_s": _age_s(now_ns, n.since_ns),
                "reason": n.reason.name.lower(),
                "pci": n.pci or None,
                "numa": n.numa,
                "speed_mbps": n.speed_mbps,
                "backups": [
                    {
                        "nic": b.local_nic,
                        "remote_rail": b.remote_rail,
                        "weight": b.weight,
                        "distance": b.distance.name if b.distance is not None else None,
                    }
                    for b in snap.plans.get(n.ifname, ())
                ],
            }
            for n in snap.nics
        ],
        "status": dict(lanes) if same and lanes is not None else None,
    }


def format_agent(doc: Mapping[str, Any]) -> list[str]:
    """The agent's privileges (the union over all its threads, and each thread that holds a
    capability) and its trace export's health, from ``status.json``."""
    out: list[str] = []
    priv = doc.get("privileges")
    if isinstance(priv, Mapping) and priv:
        caps = priv.get("effective") or []
        beyond = priv.get("beyond_needed") or []
        out.append(
            f"privileges: uid {priv.get('uid')}, no_new_privs "
            f"{'yes' if priv.get('no_new_privs') else 'no'}, capabilities "
            f"{' '.join(str(c).removeprefix('CAP_').lower() for c in caps) or 'none'}"
            + (f" (beyond what it needs: {' '.join(str(c) for c in beyond)})" if beyond else "")
            + (f", over {priv.get('threads')} threads" if priv.get("threads") else "")
        )
        holders = priv.get("threads_with_capabilities")
        if isinstance(holders, list):
            for t in holders:
                if isinstance(t, Mapping):
                    eff = t.get("effective") or []
                    out.append(
                        f"  thread {t.get('name')} ({t.get('tid')}): "
                        + (" ".join(str(c).removeprefix("CAP_").lower() for c in eff) or "none")
                    )
    exports = doc.get("export")
    if isinstance(exports, list):
        if not exports:
            out.append("trace export: off")
        for e in exports:
            if not isinstance(e, Mapping):
                continue
            state = "ok" if e.get("healthy") else f"FAILING ({e.get('last_error') or 'error'})"
            out.append(
                f"trace export {e.get('exporter')} to {e.get('endpoint')}: {state}; "
                f"{_int(e.get('ok_batches'))} batches sent, "
                f"{_int(e.get('failed_batches'))} failed"
            )
    return out


@dataclass(frozen=True)
class NicCheck:
    """``railhop status --check --nics``: whether enough rails are up (pure result)."""

    ok: bool
    rails_up: int
    rails_total: int
    min_rails_up: int  # what the policy asks for (every rail when it says 0)
    failed: tuple[tuple[str, str, str], ...]  # (ifname, state, reason) of NICs not UP
    message: str  # one line, for node-problem-detector's condition message

    def to_dict(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "rails_up": self.rails_up,
            "rails_total": self.rails_total,
            "min_rails_up": self.min_rails_up,
            "failed": [{"ifname": n, "state": s, "reason": r} for n, s, r in self.failed],
            "message": self.message,
        }


def count_rails(
    nics: Iterable[NicHealth],
) -> tuple[int, int, list[tuple[str, str, str]]]:
    """Pure: (rails with at least one NIC UP, rails, (ifname, state, reason) of every NIC not
    UP). A NIC without a rail is a rail of its own; SUSPECT and RECOVERING are not up. The one
    count behind ``railhop status --check --nics`` and the agent's ``node-status`` file."""
    rails: dict[object, bool] = {}
    failed: list[tuple[str, str, str]] = []
    for n in nics:
        key: object = n.rail if n.rail is not None else ("nic", n.ifname)
        up = n.state is NicState.UP
        rails[key] = rails.get(key, False) or up
        if not up:
            failed.append((n.ifname, n.state.name.lower(), n.reason.name.lower()))
    return sum(rails.values()), len(rails), failed


def rail_counts(nics: Iterable[NicHealth], min_rails_up: int) -> tuple[int, int, int]:
    """Pure: ``(rails up, rails, rails wanted)`` by :func:`count_rails`; wanted is the policy's
    ``health.min_rails_up``, every rail when it says 0. The same count for ``railhop status
    --check --nics`` and the agent's ``railhop_rails*`` gauges."""
    up, total, _ = count_rails(nics)
    return up, total, min_rails_up or total


def check_nics(snap: TableSnapshot) -> NicCheck:
    """Pure: count the rails with at least one managed NIC UP (a NIC without a rail is a rail
    of its own) against the policy's ``health.min_rails_up`` (0: every rail); list every NIC
    that is not UP. SUSPECT and RECOVERING NICs do not count as up."""
    up_count, total, failed = count_rails(snap.nics)
    want = snap.settings.min_rails_up or total
    ok = up_count >= want and total > 0
    if total == 0:
        message = "no NICs published by the agent"
    else:
        nics = ", ".join(f"{n} {s} ({r})" for n, s, r in failed) or "none"
        message = f"{up_count} of {total} rails up (policy wants {want}); NICs not up: {nics}"
    return NicCheck(
        ok=ok,
        rails_up=up_count,
        rails_total=total,
        min_rails_up=want,
        failed=tuple(failed),
        message=message,
    )
