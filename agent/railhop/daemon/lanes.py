"""Lane bookkeeping: the plugins' lanes as their lane events describe them, and the
``status.json`` file ``railhop status`` reads."""

from __future__ import annotations

import json
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from railhop.control import EventType, LaneEvent
from railhop.control.rundir import write_file_at


@dataclass
class _Lane:
    nic: str
    conn: tuple[int, int]  # (pid, conn_id)
    ports: tuple[int, ...]
    uid: int = 0


class LaneBook:
    """The plugins' lanes as their lane events describe them (pure: no I/O, no clock):
    which NIC each lane uses (connections per NIC for ``railhop status``), which local TCP
    ports belong to which NIC (the TCP probe's port map) and the recent failovers and
    fail-backs. Lanes are keyed by (peer pid as the agent sees it, connection id, lane index);
    bounded in size.

    A port a lane names is only a claim: :meth:`update` returns the new claims (ports to
    check) and the ports that left the map; the caller asks the kernel who holds them and
    :meth:`confirm` maps those a socket of the claimant's uid on that NIC holds, at most
    ``max_ports_per_uid`` per uid (the eBPF map holds 4096: one job cannot fill it)."""

    MAX_LANES = 65536
    MAX_FAILOVERS = 32
    MAX_PORTS_PER_UID = 512

    def __init__(self, max_ports_per_uid: int = MAX_PORTS_PER_UID) -> None:
        self._lanes: dict[tuple[int, int, int], _Lane] = {}
        self._refs: dict[int, int] = {}
        self.port_nic: dict[int, str] = {}  # confirmed ports only
        self._port_uid: dict[int, int] = {}
        self._uid_ports: dict[int, int] = {}
        self.max_ports_per_uid = max_ports_per_uid
        self.quota_refused = 0

        self._open: dict[tuple[int, int], dict[str, Any]] = {}
        # failovers past their first completion, awaiting FAIR_SHARE
        self._ramping: dict[tuple[int, int], dict[str, Any]] = {}
        self.failovers: deque[dict[str, Any]] = deque(maxlen=self.MAX_FAILOVERS)
        self.failover_count = 0
        self.failback_count = 0

    def update(self, ev: LaneEvent, pid: int, uid: int = 0) -> tuple[list[int], list[int]]:
        """Apply one lane event from process ``pid`` of ``uid``; returns (ports newly claimed,
        to check and :meth:`confirm`; ports removed from the map)."""
        added: list[int] = []
        removed: list[int] = []
        key = (pid, ev.conn_id, ev.lane)
        if ev.type is EventType.LANE_UP and ev.promoted and key in self._lanes:
            return added, removed  # a warm standby promoted: the lane and its ports, as known
        if ev.type is EventType.LANE_UP:
            old = self._lanes.pop(key, None)
            if old is not None:
                removed += self._release(old)
            if len(self._lanes) >= self.MAX_LANES:  # bounded: forget the oldest
                removed += self._release(self._lanes.pop(next(iter(self._lanes))))
            ports = tuple(p for p in ev.local_ports if 0 < p < 65536)
            self._lanes[key] = _Lane(ev.nic, (pid, ev.conn_id), ports, uid)
            for port in ports:
                self._refs[port] = self._refs.get(port, 0) + 1
                if port not in self.port_nic:
                    added.append(port)
        elif ev.type in (EventType.LANE_DOWN, EventType.LANE_ERROR, EventType.LANE_TIMEOUT):
            old = self._lanes.pop(key, None)
            if old is not None:
                removed += self._release(old)
        elif ev.type is EventType.FAILOVER_START:
            self.failover_count += 1
            rec: dict[str, Any] = {
                "kind": "failover",
                "pid": pid,
                "conn": ev.conn_id,
                "nic": ev.nic,
                "t_ns": ev.t_ns,
                "error": ev.error,
                "duration_ms": None,
            }
            if len(self._open) >= self.MAX_LANES:
                self._open.clear()
            self._open[(pid, ev.conn_id)] = rec
            self.failovers.append(rec)
        elif ev.type is EventType.FAILOVER_END:  # the first completion after the move
            done = self._open.pop((pid, ev.conn_id), None)
            if done is not None:
                done["duration_ms"] = round(ev.duration_ns / 1e6, 3)
                # (sender side; the field is new in the plugin's events: absent -> 0)
                done["bytes_replayed"] = int(getattr(ev, "bytes_replayed", 0))
                if len(self._ramping) >= self.MAX_LANES:
                    self._ramping.clear()
                self._ramping[(pid, ev.conn_id)] = done
        elif ev.type is EventType.FAIR_SHARE:
            done = self._ramping.pop((pid, ev.conn_id), None)
            if done is not None:
                done["fair_share_ms"] = round(ev.duration_ns / 1e6, 3)
        elif ev.type is EventType.FAILBACK:
            self.failback_count += 1
            self.failovers.append(
                {
                    "kind": "failback",
                    "pid": pid,
                    "conn": ev.conn_id,
                    "nic": ev.nic,
                    "t_ns": ev.t_ns,
                    "error": 0,
                    "duration_ms": None,
                }
            )
        return added, [p for p in removed if p not in added]

    def confirm(self, owned: list[tuple[int, str, int]]) -> list[int]:
        """Maps the claims the kernel backs (``(uid, nic, port)``) whose lane still exists,
        within each uid's quota; returns the ports now mapped."""
        out = []
        for uid, nic, port in owned:
            if port in self.port_nic or port not in self._refs:
                continue
            if self._uid_ports.get(uid, 0) >= self.max_ports_per_uid:
                self.quota_refused += 1
                continue
            self.port_nic[port] = nic
            self._port_uid[port] = uid
            self._uid_ports[uid] = self._uid_ports.get(uid, 0) + 1
            out.append(port)
        return out

    def _unmap(self, port: int) -> bool:
        if self.port_nic.pop(port, None) is None:
            return False
        uid = self._port_uid.pop(port, 0)
        left = self._uid_ports.get(uid, 0) - 1
        if left > 0:
            self._uid_ports[uid] = left
        else:
            self._uid_ports.pop(uid, None)
        return True

    def _release(self, lane: _Lane) -> list[int]:
        out = []
        for port in lane.ports:
            n = self._refs.get(port, 0) - 1
            if n <= 0:
                self._refs.pop(port, None)
                if self._unmap(port):
                    out.append(port)
            else:
                self._refs[port] = n
        return out

    def per_nic(self) -> dict[str, dict[str, int]]:
        """NIC -> lanes, connections and processes using it now."""
        lanes: dict[str, int] = {}
        conns: dict[str, set[tuple[int, int]]] = {}
        for lane in self._lanes.values():
            lanes[lane.nic] = lanes.get(lane.nic, 0) + 1
            conns.setdefault(lane.nic, set()).add(lane.conn)
        return {
            nic: {
                "lanes": lanes[nic],
                "connections": len(conns[nic]),
                "processes": len({c[0] for c in conns[nic]}),
            }
            for nic in sorted(lanes)
        }

    def status(self, *, agent_pid: int, now_ns: int) -> dict[str, Any]:
        """The content of ``status.json`` (what ``railhop status`` shows under the NIC table)."""
        return {
            "version": 1,
            "agent_pid": agent_pid,
            "written_ns": now_ns,
            "nics": self.per_nic(),
            "failovers_total": self.failover_count,
            "failbacks_total": self.failback_count,
            "recent": list(self.failovers),
        }


def status_bytes(doc: Mapping[str, Any]) -> bytes:
    return json.dumps(doc, separators=(",", ":"), sort_keys=True).encode()


def write_status(path: Path, doc: Mapping[str, Any]) -> None:
    """Write ``doc`` as JSON to ``path`` atomically: a new temp file (O_EXCL | O_NOFOLLOW,
    random name) through the directory's descriptor, every byte, renamed into place. OSError on
    any failure (the agent logs it at WARNING and counts it)."""
    write_file_at(path, status_bytes(doc))
