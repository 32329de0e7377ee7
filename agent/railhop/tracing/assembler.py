"""The failover assembler: pure, inputs in (signals, NIC transitions, plans, lane events, each
with its own ``CLOCK_MONOTONIC`` timestamp), finished span descriptions out. No SDK, no clock, no
I/O: ids come from an injected random source, wall-clock times from one offset given at
construction. The span tree it builds is described in :mod:`railhop.tracing`.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from railhop.control.lane_events import EventType, LaneEvent
from railhop.tracing.spans import (
    DECISION,
    DETECTION,
    ESCALATION,
    FAILBACK,
    FAILOVER,
    FAIR_SHARE,
    MIGRATION,
    Attrs,
    SpanDesc,
    SpanEvent,
    StatusCode,
    errno_name,
)

MAX_NICS = 1024  # NIC names remembered for detection signals
MAX_RAMPS = 4096  # migrations that ended and await their FAIR_SHARE


@dataclass(frozen=True)
class _Ramp:
    """A migration that ended (FAILOVER_END): its fair-share span comes with FAIR_SHARE, which
    may arrive after the failover's own trace is over."""

    trace_id: int
    parent_id: int  # the migration span
    nic: str
    peer_pid: int
    detect_ns: int  # FAILOVER_START (monotonic)
    first_ns: int  # FAILOVER_END (monotonic)


# ---------------------------------------------------------------------------------------------
# the assembler's inputs


@dataclass(frozen=True)
class Signal:
    """A bad signal about a NIC (the health model's input), timestamped by its source."""

    nic: str
    source: str  # "netlink", "sysfs", "ebpf", "plugin", ...
    signal: str  # health event kind: "carrier_down", "lane_timeout", ...
    t_ns: int  # CLOCK_MONOTONIC of the signal itself
    handled_ns: int  # CLOCK_MONOTONIC when the agent processed it
    detail: str = ""


@dataclass(frozen=True)
class StateChange:
    """A health-model transition of a NIC (``old``/``new``: ``NicState`` values)."""

    nic: str
    old: str
    new: str
    reason: str
    t_ns: int  # CLOCK_MONOTONIC of the event that caused it
    handled_ns: int  # CLOCK_MONOTONIC when the agent applied it


@dataclass(frozen=True)
class Pair:
    """A backup pair of a decision: lanes from ``local`` to remote network ``rail``/``plane``."""

    local: str
    rail: int
    plane: int = 0
    weight: float = 0.0
    distance: str = ""

    @property
    def label(self) -> str:
        return f"{self.local}->rail{self.rail}" + (f".{self.plane}" if self.plane else "")


@dataclass(frozen=True)
class Decision:
    nic: str
    policy: str
    action: str  # "migrate" | "standby"
    pairs: tuple[Pair, ...]  # ranked, best first (empty: no backup, escalate)
    start_ns: int  # CLOCK_MONOTONIC: planning started
    end_ns: int  # CLOCK_MONOTONIC: plan published

    @property
    def signature(self) -> tuple[object, ...]:
        return (self.policy, self.action, self.pairs)


@dataclass(frozen=True)
class AssemblerConfig:
    signal_window_s: float = 10.0  # bad signals this recent count towards a detection
    migration_timeout_s: float = 30.0  # a migration open longer escalates
    failback_grace_s: float = 10.0  # after the NIC is UP, wait this long for connections
    idle_close_s: float = 60.0  # a plugin-only failover (NIC never DOWN) ends after this quiet
    max_open_s: float = 3600.0  # a failover open this long is closed (outcome "open")
    max_failovers: int = 256  # open failovers kept (oldest closed beyond)
    max_conns: int = 4096  # connections tracked per failover
    # NIC -> hw.id (unique on the host: the PCI address); a NIC not listed: its name
    hw_ids: Mapping[str, str] = field(default_factory=dict)


@dataclass
class _Migration:
    pid: int  # sender's pid
    peer_pid: int  # in the agent's pid namespace
    conn_id: int
    span_id: int
    start_ns: int
    lane: int
    error: int
    remote_nic: str
    events: list[SpanEvent] = field(default_factory=list)
    new_lanes: list[str] = field(default_factory=list)
    standby: bool = False  # a lane it took was a warm standby (promoted, no handshake)
    ended: bool = False
    escalated: bool = False
    failed_back: bool = False


@dataclass
class _Failover:
    nic: str
    trace_id: int
    span_id: int
    start_ns: int  # monotonic
    cause: str
    source: str
    opened_by: str  # "health" | "plugin"
    error_type: str
    last_ns: int
    detected: bool = False
    health_down: bool = False
    health_up_ns: int | None = None
    failback_start_ns: int | None = None
    failback_span_id: int = 0
    failback_events: list[SpanEvent] = field(default_factory=list)
    decision: tuple[object, ...] | None = None
    decisions: int = 0
    migrations: dict[tuple[int, int], _Migration] = field(default_factory=dict)
    escalated: bool = False
    flaps: int = 0
    events: list[SpanEvent] = field(default_factory=list)
    # every source that saw this failure: source -> its first signal (the failover's record of
    # which signal came first and when the others followed; :func:`witness_attrs`)
    witnesses: dict[str, Signal] = field(default_factory=dict)

    def witness(self, sig: Signal) -> None:
        """Remember ``sig`` when it is its source's first (or earlier than what it had)."""
        had = self.witnesses.get(sig.source)
        if had is None and len(self.witnesses) >= MAX_WITNESSES:
            return
        if had is None or sig.t_ns < had.t_ns:
            self.witnesses[sig.source] = sig


MAX_WITNESSES = 32  # sources remembered per failover (a node has a handful)


def witness_order(witnesses: Mapping[str, Signal]) -> list[Signal]:
    """Pure: each source's first signal, earliest first (ties: by source name)."""
    return sorted(witnesses.values(), key=lambda s: (s.t_ns, s.source))


def witness_attrs(witnesses: Mapping[str, Signal]) -> Attrs:
    """Pure: the root span's record of every source that saw the failure, in the order they
    saw it, with each one's delay after the first (``railhop.failover.witness.*``; empty
    when none did)."""
    order = witness_order(witnesses)
    if not order:
        return {}
    t0 = order[0].t_ns
    return {
        "railhop.failover.first_source": order[0].source,
        "railhop.failover.first_signal": order[0].signal,
        "railhop.failover.witness.sources": tuple(s.source for s in order),
        "railhop.failover.witness.signals": tuple(s.signal for s in order),
        "railhop.failover.witness.offsets_ms": tuple(round((s.t_ns - t0) / 1e6, 3) for s in order),
    }


_BAD_LANE = {EventType.LANE_TIMEOUT: "lane_timeout", EventType.LANE_ERROR: "lane_error"}


class FailoverAssembler:
    """Pure: inputs in, finished spans out. Every method returns the spans that just ended.

    ``offset_ns`` converts the inputs' ``CLOCK_MONOTONIC`` ns into epoch ns; ``rand_bits(n)``
    returns n random bits (ids); ``host`` goes on every root span as ``host.name``.
    """

    def __init__(
        self,
        offset_ns: int,
        *,
        host: str = "",
        config: AssemblerConfig | None = None,
        rand_bits: Callable[[int], int] | None = None,
    ) -> None:
        self.offset_ns = offset_ns
        self.host = host
        self.config = config or AssemblerConfig()
        self._rand = rand_bits or random.SystemRandom().getrandbits
        self._open: dict[str, _Failover] = {}
        self._signals: dict[str, list[Signal]] = {}
        self._states: dict[str, str] = {}  # nic -> health state value ("up", "down", ...)
        self._ramps: dict[tuple[int, int], _Ramp] = {}

    # -- helpers

    def _id(self, bits: int) -> int:
        v = 0
        while v == 0:
            v = self._rand(bits)
        return v

    def _wall(self, mono_ns: int) -> int:
        return mono_ns + self.offset_ns

    @property
    def open_failovers(self) -> list[str]:
        """NICs with a failover in progress."""
        return sorted(self._open)

    def _child(
        self,
        fo: _Failover,
        name: str,
        start_ns: int,
        end_ns: int,
        attrs: Attrs,
        *,
        span_id: int | None = None,
        events: Sequence[SpanEvent] = (),
        status: StatusCode = "unset",
        message: str = "",
    ) -> SpanDesc:
        base: Attrs = {"network.interface.name": fo.nic}
        base.update(attrs)
        return SpanDesc(
            name=name,
            trace_id=fo.trace_id,
            span_id=span_id if span_id is not None else self._id(64),
            parent_id=fo.span_id,
            start_ns=self._wall(start_ns),
            end_ns=self._wall(max(start_ns, end_ns)),
            attributes=base,
            events=tuple(events),
            status=status,
            status_message=message,
        )

    def _hw(self, nic: str, state: str) -> Attrs:
        """The ``hw.*`` attributes of a NIC (hardware semantic conventions: ``hw.id`` is
        required with the others; ``hw.name`` is the interface)."""
        return {
            "hw.id": self.config.hw_ids.get(nic) or nic,
            "hw.name": nic,
            "hw.type": "network",
            "hw.state": state,
        }

    def _recent(self, nic: str, now_ns: int) -> list[Signal]:
        horizon = now_ns - int(self.config.signal_window_s * 1e9)
        kept = [s for s in self._signals.get(nic, []) if s.t_ns >= horizon]
        self._signals[nic] = kept
        return kept

    def _open_failover(
        self, nic: str, start_ns: int, *, cause: str, source: str, opened_by: str, error_type: str
    ) -> tuple[_Failover, list[SpanDesc]]:
        out: list[SpanDesc] = []
        if len(self._open) >= self.config.max_failovers:
            oldest = min(self._open.values(), key=lambda f: f.start_ns)
            out += self._close(oldest, oldest.last_ns, "open")
        fo = _Failover(
            nic=nic,
            trace_id=self._id(128),
            span_id=self._id(64),
            start_ns=start_ns,
            cause=cause,
            source=source,
            opened_by=opened_by,
            error_type=error_type,
            last_ns=start_ns,
        )
        self._open[nic] = fo
        return fo, out

    def _detection(
        self, fo: _Failover, signals: Sequence[Signal], end_ns: int, handled_ns: int, reason: str
    ) -> SpanDesc:
        first = signals[0] if signals else None
        start = first.t_ns if first is not None else end_ns
        last = signals[-1] if signals else None
        attrs: Attrs = {
            "railhop.detection.source": fo.source,
            "railhop.detection.signal": fo.cause,
            "railhop.detection.signals": len(signals),
            # signal -> the agent acted on it (what the issue calls "time since the event")
            "railhop.detection.latency_ms": max(0, handled_ns - start) / 1e6,
            "railhop.detection.agent_delay_ms": (
                max(0, last.handled_ns - last.t_ns) / 1e6 if last else 0.0
            ),
            **self._hw(fo.nic, "failed"),
            "error.type": fo.error_type,
        }
        if first is not None and (first.signal, first.source) != (fo.cause, fo.source):
            attrs["railhop.detection.first_signal"] = first.signal
            attrs["railhop.detection.first_source"] = first.source
        if reason:
            attrs["railhop.health.reason"] = reason
        events = [
            SpanEvent(
                s.signal,
                self._wall(s.t_ns),
                {
                    "railhop.detection.source": s.source,
                    **({"detail": s.detail} if s.detail else {}),
                },
            )
            for s in signals
        ]
        fo.detected = True
        for s in signals:
            fo.witness(s)
        return self._child(fo, DETECTION, start, end_ns, attrs, events=events)

    # -- inputs

    def signal(self, sig: Signal) -> list[SpanDesc]:
        """A bad signal (carrier down, lane timeout, counter breach, ...). Remembered for the
        detection span of a failover that starts within ``signal_window_s``."""
        if sig.nic not in self._signals and len(self._signals) >= MAX_NICS:
            self._signals.pop(next(iter(self._signals)))  # bounded, whatever names arrive
        lst = self._signals.setdefault(sig.nic, [])
        lst.append(sig)
        if len(lst) > 64:
            del lst[: len(lst) - 64]
        fo = self._open.get(sig.nic)
        if fo is not None:
            fo.last_ns = max(fo.last_ns, sig.t_ns)
            if fo.failback_start_ns is not None or fo.health_up_ns is not None:
                fo.events.append(
                    SpanEvent(f"{sig.signal} while recovering", self._wall(sig.t_ns), {})
                )
            else:  # a source that saw the failure after the failover opened
                fo.witness(sig)
        return []

    def transition(self, tr: StateChange) -> list[SpanDesc]:
        """A health-model state change (states are ``railhop.health.NicState`` values)."""
        nic, old, new, reason, t_ns, handled_ns = (
            tr.nic,
            tr.old,
            tr.new,
            tr.reason,
            tr.t_ns,
            tr.handled_ns,
        )
        self._states[nic] = new
        out: list[SpanDesc] = []
        fo = self._open.get(nic)
        if new == "down":
            if fo is None:
                signals = sorted(self._recent(nic, t_ns), key=lambda x: x.t_ns)
                first = signals[0] if signals else None
                # the cause is what took the NIC DOWN (its reason: carrier loss, N lane
                # timeouts...), even when a softer signal came first; the trace starts there
                cause = _cause_from_reason(reason)
                if cause == "other" and first is not None:
                    cause = first.signal
                decisive = next((x for x in reversed(signals) if x.signal == cause), first)
                fo, out = self._open_failover(
                    nic,
                    first.t_ns if first else t_ns,
                    cause=cause,
                    source=decisive.source if decisive else "health",
                    opened_by="health",
                    error_type=cause,
                )
                fo.health_down = True
                out.append(self._detection(fo, signals, t_ns, handled_ns, reason))
                self._signals[nic] = []
            else:
                if fo.health_down and (
                    fo.failback_start_ns is not None or fo.health_up_ns is not None
                ):
                    fo.flaps += 1
                    fo.failback_events.append(
                        SpanEvent("flap", self._wall(t_ns), {"railhop.health.reason": reason})
                    )
                    fo.health_up_ns = None
                elif not fo.health_down:
                    fo.events.append(
                        SpanEvent("nic down", self._wall(t_ns), {"railhop.health.reason": reason})
                    )
                fo.health_down = True
            fo.last_ns = max(fo.last_ns, t_ns)
        elif fo is not None and new == "recovering":
            if fo.failback_start_ns is None:
                fo.failback_start_ns = t_ns
                fo.failback_span_id = self._id(64)
            fo.failback_events.append(
                SpanEvent("recovering", self._wall(t_ns), {"railhop.health.reason": reason})
            )
            fo.last_ns = max(fo.last_ns, t_ns)
        elif fo is not None and new == "up" and old in ("down", "recovering"):
            if fo.failback_start_ns is None:
                fo.failback_start_ns = t_ns
                fo.failback_span_id = self._id(64)
            fo.health_up_ns = t_ns
            fo.failback_events.append(
                SpanEvent("nic up", self._wall(t_ns), {"railhop.health.reason": reason})
            )
            fo.last_ns = max(fo.last_ns, t_ns)
            out += self._maybe_finish(fo, t_ns)
        return out

    def decision(self, d: Decision) -> list[SpanDesc]:
        """The plan for a NIC that is not usable; a span when it differs from the last one."""
        fo = self._open.get(d.nic)
        if fo is None or d.action != "migrate" or fo.decision == d.signature:
            return []
        fo.decision = d.signature
        fo.decisions += 1
        chosen = [p for p in d.pairs if p.weight > 0]
        attrs: Attrs = {
            "railhop.policy.name": d.policy,
            "railhop.decision.action": d.action,
            "railhop.decision.candidates": tuple(p.label for p in d.pairs),
            "railhop.decision.pairs": tuple(p.label for p in chosen),
            "railhop.decision.weights": tuple(round(p.weight, 6) for p in chosen),
            "railhop.decision.distances": tuple(p.distance for p in chosen),
            "railhop.decision.seq": fo.decisions,
        }
        out = [self._child(fo, DECISION, d.start_ns, d.end_ns, attrs)]
        fo.last_ns = max(fo.last_ns, d.end_ns)
        if not d.pairs and not fo.escalated:
            fo.escalated = True
            out.append(
                self._child(
                    fo,
                    ESCALATION,
                    d.end_ns,
                    d.end_ns,
                    {
                        "error.type": "no_backup_pair",
                        "railhop.escalation.reason": "no compatible backup pair in the plan",
                        "railhop.policy.name": d.policy,
                    },
                    status="error",
                    message="no compatible backup pair",
                )
            )
        return out

    def lane_event(self, ev: LaneEvent, peer_pid: int, handled_ns: int) -> list[SpanDesc]:
        """A plugin's lane event (its ``t_ns`` is the plugin's CLOCK_MONOTONIC)."""
        out: list[SpanDesc] = []
        kind = _BAD_LANE.get(ev.type)
        if kind is not None:
            detail = f"pid {ev.pid} conn {ev.conn_id:#x} lane {ev.lane}"
            if ev.error:
                detail += f" {errno_name(ev.error)}"
            out += self.signal(Signal(ev.nic, "plugin", kind, ev.t_ns, handled_ns, detail))
            mig = self._find_migration(ev.pid, ev.conn_id)
            if mig is not None:
                mig.events.append(SpanEvent(kind, self._wall(ev.t_ns), _lane_attrs(ev)))
            return out
        if ev.type is EventType.FAILOVER_START:
            fo = self._open.get(ev.nic)
            if fo is None:
                signals = sorted(self._recent(ev.nic, ev.t_ns), key=lambda x: x.t_ns)
                first = signals[0] if signals else None
                etype = errno_name(ev.error) if ev.error else (first.signal if first else "")
                fo, out = self._open_failover(
                    ev.nic,
                    min(ev.t_ns, first.t_ns) if first else ev.t_ns,
                    cause=first.signal if first else "plugin_failover",
                    source=first.source if first else "plugin",
                    opened_by="plugin",
                    error_type=etype or "plugin_failover",
                )
                if not signals:
                    signals = [Signal(ev.nic, "plugin", "failover_start", ev.t_ns, handled_ns, "")]
                out.append(self._detection(fo, signals, ev.t_ns, handled_ns, ""))
                self._signals[ev.nic] = []
            key = (ev.pid, ev.conn_id)
            if key not in fo.migrations and len(fo.migrations) < self.config.max_conns:
                fo.migrations[key] = _Migration(
                    pid=ev.pid,
                    peer_pid=peer_pid,
                    conn_id=ev.conn_id,
                    span_id=self._id(64),
                    start_ns=ev.t_ns,
                    lane=ev.lane,
                    error=ev.error,
                    remote_nic=ev.remote_nic,
                )
            fo.last_ns = max(fo.last_ns, ev.t_ns)
            return out
        if ev.type is EventType.FAILOVER_END:
            mig, fo = self._find(ev.pid, ev.conn_id)
            if mig is None or fo is None or mig.ended:
                return out
            mig.ended = True
            start = min(mig.start_ns, ev.t_ns - ev.duration_ns) if ev.duration_ns else mig.start_ns
            attrs: Attrs = {
                "process.pid": mig.peer_pid,
                "railhop.process.pid": mig.pid,
                "railhop.conn.id": f"{mig.conn_id:#018x}",
                "railhop.conn.epoch": ev.epoch,
                "railhop.lane.id": mig.lane,
                "railhop.migration.duration_ms": (ev.t_ns - start) / 1e6,
                "railhop.migration.first_completion_ms": (ev.t_ns - start) / 1e6,
                "railhop.migration.new_lanes": tuple(mig.new_lanes),
                "railhop.migration.standby": mig.standby,
                "railhop.migration.outcome": "escalated" if mig.escalated else "resumed",
            }
            if mig.remote_nic:
                attrs["railhop.remote.nic"] = mig.remote_nic
            if mig.error:
                attrs["error.type"] = errno_name(mig.error)
            replayed = getattr(ev, "bytes_replayed", None)  # absent on USDT-built events
            if isinstance(replayed, int):
                attrs["railhop.replay.bytes"] = replayed
            out.append(
                self._child(
                    fo, MIGRATION, start, ev.t_ns, attrs, span_id=mig.span_id, events=mig.events
                )
            )
            if len(self._ramps) >= MAX_RAMPS:
                self._ramps.clear()
            self._ramps[(ev.pid, ev.conn_id)] = _Ramp(
                fo.trace_id, mig.span_id, fo.nic, mig.peer_pid, start, ev.t_ns
            )
            fo.last_ns = max(fo.last_ns, ev.t_ns)
            if fo.health_up_ns is not None or not fo.health_down:
                out += self._maybe_finish(fo, ev.t_ns)
            return out
        if ev.type is EventType.FAIR_SHARE:
            ramp = self._ramps.pop((ev.pid, ev.conn_id), None)
            if ramp is None:
                return out
            detect = ramp.detect_ns
            if ev.duration_ns:
                detect = min(detect, ev.t_ns - ev.duration_ns)
            out.append(
                SpanDesc(
                    name=FAIR_SHARE,
                    trace_id=ramp.trace_id,
                    span_id=self._id(64),
                    parent_id=ramp.parent_id,
                    start_ns=self._wall(ramp.first_ns),
                    end_ns=self._wall(max(ramp.first_ns, ev.t_ns)),
                    attributes={
                        "network.interface.name": ramp.nic,
                        "process.pid": ramp.peer_pid,
                        "railhop.process.pid": ev.pid,
                        "railhop.conn.id": f"{ev.conn_id:#018x}",
                        "railhop.migration.first_completion_ms": (ramp.first_ns - detect) / 1e6,
                        "railhop.migration.fair_share_ms": (ev.t_ns - detect) / 1e6,
                    },
                )
            )
            return out
        if ev.type is EventType.LANE_UP:
            mig = self._find_migration(ev.pid, ev.conn_id)
            if mig is None or mig.ended:
                return out
            if ev.standby and not ev.promoted:
                # a warm standby handshaken while the move is open: it carries nothing (a
                # promotion, its second LANE_UP, makes it one of the move's lanes)
                mig.events.append(SpanEvent("standby up", self._wall(ev.t_ns), _lane_attrs(ev)))
                return out
            label = ev.nic + (f"->{ev.remote_nic}" if ev.remote_nic else "")
            mig.new_lanes.append(label)
            mig.standby = mig.standby or ev.promoted
            name = "standby promoted" if ev.promoted else "lane up"
            mig.events.append(SpanEvent(name, self._wall(ev.t_ns), _lane_attrs(ev)))
            return out
        if ev.type is EventType.LANE_DOWN:
            mig = self._find_migration(ev.pid, ev.conn_id)
            if mig is not None and not mig.ended:
                mig.events.append(SpanEvent("lane down", self._wall(ev.t_ns), _lane_attrs(ev)))
            return out
        if ev.type is EventType.FAILBACK:
            fo = self._open.get(ev.nic)
            if fo is None:
                return out
            mig = fo.migrations.get((ev.pid, ev.conn_id))
            if mig is not None:
                mig.failed_back = True
            if fo.failback_start_ns is None:
                fo.failback_start_ns = ev.t_ns
                fo.failback_span_id = self._id(64)
            attrs = _lane_attrs(ev)
            attrs["railhop.conn.id"] = f"{ev.conn_id:#018x}"
            fo.failback_events.append(SpanEvent("connection back", self._wall(ev.t_ns), attrs))
            fo.last_ns = max(fo.last_ns, ev.t_ns)
            out += self._maybe_finish(fo, ev.t_ns)
        return out

    def tick(self, now_ns: int) -> list[SpanDesc]:
        """Timers: migration timeouts (escalation), fail-back grace, idle and maximum ages."""
        out: list[SpanDesc] = []
        c = self.config
        for fo in list(self._open.values()):
            for mig in fo.migrations.values():
                if (
                    not mig.ended
                    and not mig.escalated
                    and now_ns - mig.start_ns > c.migration_timeout_s * 1e9
                ):
                    mig.escalated = True
                    out += self._escalate(
                        fo,
                        now_ns,
                        "migration_timeout",
                        f"connection {mig.conn_id:#x} did not resume within "
                        f"{c.migration_timeout_s:g} s",
                    )
            if fo.health_up_ns is not None and now_ns - fo.health_up_ns > c.failback_grace_s * 1e9:
                out += self._close(fo, now_ns, "failed_back")
            elif not fo.health_down and now_ns - fo.last_ns > c.idle_close_s * 1e9:
                out += self._close(fo, fo.last_ns, "migrated")
            elif now_ns - fo.start_ns > c.max_open_s * 1e9:
                out += self._close(fo, now_ns, "open")
        return out

    def close_all(self, now_ns: int, outcome: str = "agent_stopped") -> list[SpanDesc]:
        """Ends every open failover (agent shutdown): no trace is lost."""
        out: list[SpanDesc] = []
        for fo in list(self._open.values()):
            out += self._close(fo, now_ns, outcome)
        return out

    # -- internals

    def _find(self, pid: int, conn_id: int) -> tuple[_Migration | None, _Failover | None]:
        for fo in self._open.values():
            mig = fo.migrations.get((pid, conn_id))
            if mig is not None and not mig.ended:
                return mig, fo
        return None, None

    def _find_migration(self, pid: int, conn_id: int) -> _Migration | None:
        return self._find(pid, conn_id)[0]

    def _escalate(self, fo: _Failover, t_ns: int, etype: str, why: str) -> list[SpanDesc]:
        fo.escalated = True
        return [
            self._child(
                fo,
                ESCALATION,
                t_ns,
                t_ns,
                {"error.type": etype, "railhop.escalation.reason": why},
                status="error",
                message=why,
            )
        ]

    def _maybe_finish(self, fo: _Failover, t_ns: int) -> list[SpanDesc]:
        """Over when the NIC is usable again (or was never DOWN here) and every migrated
        connection has failed back; the rest wait for the grace period in :meth:`tick`."""
        nic_ok = fo.health_up_ns is not None or not fo.health_down
        pending = [m for m in fo.migrations.values() if not m.failed_back]
        if not nic_ok or fo.failback_start_ns is None or pending:
            return []
        return self._close(fo, t_ns, "failed_back")

    def _close(self, fo: _Failover, t_ns: int, outcome: str) -> list[SpanDesc]:
        self._open.pop(fo.nic, None)
        out: list[SpanDesc] = []
        end = max(t_ns, fo.last_ns)
        for mig in fo.migrations.values():
            if not mig.ended:
                mig.ended = True
                attrs: Attrs = {
                    "process.pid": mig.peer_pid,
                    "railhop.process.pid": mig.pid,
                    "railhop.conn.id": f"{mig.conn_id:#018x}",
                    "railhop.lane.id": mig.lane,
                    "railhop.migration.new_lanes": tuple(mig.new_lanes),
                    "railhop.migration.standby": mig.standby,
                    "railhop.migration.outcome": "unfinished",
                    "error.type": "migration_unfinished",
                }
                out.append(
                    self._child(
                        fo,
                        MIGRATION,
                        mig.start_ns,
                        end,
                        attrs,
                        span_id=mig.span_id,
                        events=mig.events,
                        status="error",
                        message="no FAILOVER_END before the failover ended",
                    )
                )
        back = sum(1 for m in fo.migrations.values() if m.failed_back)
        if fo.failback_start_ns is not None and outcome == "failed_back":
            out.append(
                self._child(
                    fo,
                    FAILBACK,
                    fo.failback_start_ns,
                    end,
                    {
                        **self._hw(fo.nic, "ok"),
                        "railhop.failback.connections": back,
                        "railhop.failback.flaps": fo.flaps,
                    },
                    span_id=fo.failback_span_id,
                    events=fo.failback_events,
                )
            )
        ok = outcome == "failed_back"
        attrs = {
            "network.interface.name": fo.nic,
            **self._hw(fo.nic, "ok" if ok else ("failed" if fo.health_down else "degraded")),
            "error.type": fo.error_type,
            "railhop.failover.cause": fo.cause,
            "railhop.failover.source": fo.source,
            "railhop.failover.opened_by": fo.opened_by,
            "railhop.failover.outcome": "escalated" if fo.escalated and not ok else outcome,
            "railhop.failover.connections": len(fo.migrations),
            "railhop.failover.connections_failed_back": back,
            "railhop.failover.escalated": fo.escalated,
            "railhop.failover.flaps": fo.flaps,
            "railhop.failover.decisions": fo.decisions,
        }
        if self.host:
            attrs["host.name"] = self.host
        attrs.update(witness_attrs(fo.witnesses))
        order = witness_order(fo.witnesses)
        seen = [
            SpanEvent(
                f"seen by {s.source}",
                self._wall(s.t_ns),
                {
                    "railhop.detection.source": s.source,
                    "railhop.detection.signal": s.signal,
                    "railhop.detection.offset_ms": round((s.t_ns - order[0].t_ns) / 1e6, 3),
                    **({"detail": s.detail} if s.detail else {}),
                },
            )
            for s in order
        ]
        out.append(
            SpanDesc(
                name=FAILOVER,
                trace_id=fo.trace_id,
                span_id=fo.span_id,
                parent_id=None,
                start_ns=self._wall(fo.start_ns),
                end_ns=self._wall(end),
                attributes=attrs,
                events=tuple(sorted([*seen, *fo.events], key=lambda e: e.time_ns)),
                status="error" if fo.escalated else "unset",
                status_message="escalated" if fo.escalated else "",
            )
        )
        return out


def _lane_attrs(ev: LaneEvent) -> Attrs:
    a: Attrs = {"network.interface.name": ev.nic, "railhop.lane.id": ev.lane}
    if ev.remote_nic:
        a["railhop.remote.nic"] = ev.remote_nic
    if ev.error:
        a["error.type"] = errno_name(ev.error)
    if ev.local_ports:
        a["railhop.lane.local_ports"] = tuple(ev.local_ports)
    return a


def _cause_from_reason(reason: str) -> str:
    r = reason.lower()
    for word, cause in (
        ("carrier", "carrier_down"),
        ("link down", "carrier_down"),
        ("fatal", "device_fatal"),
        ("admin", "admin_down"),
        ("timeout", "lane_timeout"),
        ("lane error", "lane_error"),
        ("counter", "counter_breach"),
        ("probe", "probe_fail"),
    ):
        if word in r:
            return cause
    return "other"
