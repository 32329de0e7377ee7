"""Per-NIC health: a pure state machine fed by typed, timestamped events.

States (``NicState``)::

    UP ──soft signal──► SUSPECT ──enough strikes / probe fail / hard signal──► DOWN
     ▲                    │ quiet for clear_s, or probe ok                      │
     └────────────────────┘                                                    │ link back
     ▲                                                                         ▼ (or hold-off over)
     └──── hold-off over, stable for recover_stable_s, enough probes ──── RECOVERING
                                       any bad signal in RECOVERING: back to DOWN (a flap)

* Hard signals (carrier down, device fatal, agent/admin down) take a NIC DOWN at once.
* Soft signals (lane timeout, lane error, counter-rate breach, probe failure, TCP trouble on a
  lane socket) make it SUSPECT;
  ``suspect_strikes`` of them within ``suspect_window_s`` make it DOWN, and kinds listed in
  ``down_on`` do so at once (TCP trouble never counts as a strike). A probe failure while
  SUSPECT confirms the suspicion.
* Lane events are evidence, not commands: a :class:`LaneTimeout` / :class:`LaneError` carries
  its ``source`` (the reporting process, kernel-verified by the agent). Such a signal takes the
  NIC DOWN (by ``down_on`` or by strikes) only when it is corroborated: ``corroborate_sources``
  distinct sources reported within ``suspect_window_s``, or a kernel signal (TCP trouble on a
  lane socket, a counter breach) or one of the agent's own probes failed within that window.
  Otherwise it makes the NIC SUSPECT only (the reporting process has already moved its own
  connections off the lane); a kernel signal or failed probe that comes later within the window
  still corroborates it (the order of the two does not matter). Signals without a source (the
  agent's own) need no corroboration. A :class:`Suspicion` (what the daemon makes of a lane
  signal whose cause is probably elsewhere: a peer's report, one process timing out on several
  NICs) carries its reporter too and never corroborates anything: only independent evidence
  (kernel signals, the agent's probes, distinct reporting processes) takes a NIC DOWN.
* Flap damping: every entry into DOWN counts a flap; the NIC may return to UP only after a
  hold-off of ``holdoff_initial_s * multiplier**(flaps-1)`` (capped at ``holdoff_max_s``, so it
  never gives up). Flaps are forgotten after ``flap_reset_s`` of continuous UP.
* Hysteresis: RECOVERING needs ``recover_stable_s`` without a bad signal (and
  ``recover_probes`` successful probes) before UP; SUSPECT needs ``suspect_clear_s`` of quiet.
* Evidence: a NIC that went DOWN while its link stayed up (lane timeouts/errors, counters,
  probe failures, device fatal: a silent blackhole looks like this) has nothing that would
  tell it is healthy again, so after the hold-off it waits in RECOVERING for at least one
  :class:`ProbeOk` no older than its entry into DOWN. A probe reported by a process (the daemon
  turns the plugins' FAILBACK / LANE_UP on that NIC into one with its ``source``) counts only
  once ``recover_sources`` distinct processes reported one since the NIC entered DOWN (or
  SUSPECT): one process cannot vouch alone for a NIC that went down; a probe without a source
  (the agent's own) counts at once. A carrier-caused DOWN recovers on carrier up as before
  (``recover_probes`` still applies to both).

Nothing here reads a clock: every event carries its time ``t`` (seconds, any monotonic origin)
and timers advance through :func:`tick`; :func:`next_deadline` tells the caller when to tick.
Events older than the last one seen for that NIC are applied at the last time seen.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, ClassVar

__all__ = [
    "SOFT_KINDS",
    "AdminDown",
    "AdminUp",
    "CarrierDown",
    "CarrierUp",
    "CounterBreach",
    "DeviceFatal",
    "Event",
    "HealthError",
    "HealthModel",
    "HealthParams",
    "LaneError",
    "LaneTimeout",
    "NicHealth",
    "NicState",
    "ProbeFail",
    "ProbeOk",
    "Suspicion",
    "TcpSuspect",
    "Transition",
    "initial",
    "next_deadline",
    "probes_needed",
    "step",
    "tick",
]


class HealthError(Exception):
    """Base class of every error raised by :mod:`railhop.health`."""


class NicState(enum.Enum):
    UP = "up"  # carries traffic
    SUSPECT = "suspect"  # soft signals seen; still carries traffic, not a backup target
    DOWN = "down"  # must not carry traffic; its traffic is planned away
    RECOVERING = "recovering"  # looks healthy again; waiting out hold-off and stability

    @property
    def usable(self) -> bool:
        return self is NicState.UP


# --------------------------------------------------------------------------------------------
# events


@dataclass(frozen=True)
class Event:
    """Something observed about NIC ``nic`` at time ``t`` (seconds)."""

    nic: str
    t: float
    kind: ClassVar[str] = "event"


@dataclass(frozen=True)
class CarrierDown(Event):
    """Link lost: netdev carrier off, RDMA port left ACTIVE, verbs PORT_ERR."""

    kind: ClassVar[str] = "carrier_down"


@dataclass(frozen=True)
class CarrierUp(Event):
    """Link back: carrier on, port ACTIVE, verbs PORT_ACTIVE."""

    kind: ClassVar[str] = "carrier_up"


@dataclass(frozen=True)
class DeviceFatal(Event):
    """The device is gone or broken (verbs DEVICE_FATAL, devlink health error)."""

    kind: ClassVar[str] = "device_fatal"


@dataclass(frozen=True)
class AdminDown(Event):
    """The agent or an operator marked the NIC down; only :class:`AdminUp` undoes it."""

    reason: str = ""
    kind: ClassVar[str] = "admin_down"


@dataclass(frozen=True)
class AdminUp(Event):
    kind: ClassVar[str] = "admin_up"


@dataclass(frozen=True)
class LaneTimeout(Event):
    """A plugin saw no progress on a cleared-to-send chunk for the completion timeout.
    ``source``: who reported it (the agent names the process, e.g. ``"uid 1000 pid 42"``);
    empty for a signal the agent itself trusts."""

    detail: str = ""
    source: str = ""
    kind: ClassVar[str] = "lane_timeout"


@dataclass(frozen=True)
class LaneError(Event):
    """A plugin's lane failed with a transport error (``source`` as for LaneTimeout)."""

    detail: str = ""
    source: str = ""
    kind: ClassVar[str] = "lane_error"


@dataclass(frozen=True)
class CounterBreach(Event):
    """An error counter rose faster than the policy allows (``rate`` > ``threshold`` per s)."""

    counter: str = ""
    rate: float = 0.0
    threshold: float = 0.0
    kind: ClassVar[str] = "counter_breach"


@dataclass(frozen=True)
class TcpSuspect(Event):
    """TCP trouble (retransmit, loss state, socket error) on a plugin lane socket of this NIC.
    Makes the NIC SUSPECT (the plugins then run their confirming probe on its lanes) but never
    counts as a strike: retransmits alone do not take a NIC down."""

    detail: str = ""
    kind: ClassVar[str] = "tcp_suspect"


@dataclass(frozen=True)
class Suspicion(Event):
    """A soft signal that may only make the NIC SUSPECT (the daemon downgrades to this a lane
    signal whose cause is probably not this NIC, e.g. one process timing out on several NICs
    at once). Never a strike, never corroboration of another signal. ``source``: the reporter
    (as for :class:`LaneTimeout`)."""

    detail: str = ""
    source: str = ""
    kind: ClassVar[str] = "suspicion"


@dataclass(frozen=True)
class ProbeOk(Event):
    """A probe of the NIC passed. ``source``: the process that reported it (a plugin's lane
    came up or failed back on the NIC); empty for the agent's own probe."""

    source: str = ""
    kind: ClassVar[str] = "probe_ok"


@dataclass(frozen=True)
class ProbeFail(Event):
    kind: ClassVar[str] = "probe_fail"


_HARD = (CarrierDown, DeviceFatal, AdminDown)
_SOFT = (LaneTimeout, LaneError, CounterBreach, ProbeFail, TcpSuspect, Suspicion)
_KERNEL = (TcpSuspect, CounterBreach, ProbeFail)  # independent of any reporter's words
SOFT_KINDS = frozenset(c.kind for c in _SOFT)


# --------------------------------------------------------------------------------------------
# parameters and state


@dataclass(frozen=True)
class HealthParams:
    """Tuning of the state machine (from the policy's ``health`` and ``flap_damping``)."""

    suspect_strikes: int = 3
    suspect_window_s: float = 2.0
    suspect_clear_s: float = 5.0
    down_on: frozenset[str] = frozenset({"lane_timeout"})
    recover_stable_s: float = 0.5
    recover_probes: int = 0
    holdoff_initial_s: float = 1.0
    holdoff_max_s: float = 60.0
    holdoff_multiplier: float = 2.0
    flap_reset_s: float = 60.0
    corroborate_sources: int = 2  # distinct reporters a lane signal needs to take a NIC down
    recover_sources: int = 2  # distinct reporters whose passing probes count as evidence

    def __post_init__(self) -> None:
        if self.corroborate_sources < 1:
            raise HealthError(f"corroborate_sources must be >= 1, got {self.corroborate_sources}")
        if self.recover_sources < 1:
            raise HealthError(f"recover_sources must be >= 1, got {self.recover_sources}")
        if self.suspect_strikes < 1:
            raise HealthError(f"suspect_strikes must be >= 1, got {self.suspect_strikes}")
        if self.recover_probes < 0:
            raise HealthError(f"recover_probes must be >= 0, got {self.recover_probes}")
        for name in ("suspect_window_s", "suspect_clear_s", "recover_stable_s", "flap_reset_s"):
            if getattr(self, name) < 0:
                raise HealthError(f"{name} must be >= 0, got {getattr(self, name)}")
        if not 0 <= self.holdoff_initial_s <= self.holdoff_max_s:
            raise HealthError(
                f"need 0 <= holdoff_initial_s ({self.holdoff_initial_s}) <= holdoff_max_s "
                f"({self.holdoff_max_s})"
            )
        if self.holdoff_multiplier < 1:
            raise HealthError(f"holdoff_multiplier must be >= 1, got {self.holdoff_multiplier}")
        unknown = self.down_on - SOFT_KINDS
        if unknown:
            raise HealthError(f"down_on: unknown event kinds {sorted(unknown)}")

    def holdoff(self, flaps: int) -> float:
        """Hold-off after the ``flaps``-th consecutive failure (1-based), capped; never infinite."""
        if flaps <= 0:
            return 0.0
        # cap the exponent so huge flap counts cannot overflow
        exp = min(flaps - 1, 1000)
        try:
            value = self.holdoff_initial_s * self.holdoff_multiplier**exp
        except OverflowError:
            value = self.holdoff_max_s
        return min(value, self.holdoff_max_s)


@dataclass(frozen=True)
class NicHealth:
    """Everything the machine remembers about one NIC."""

    nic: str
    state: NicState
    since: float  # when the current state was entered
    t: float  # time of the last event or tick applied
    reason: str = ""
    link_up: bool = True
    admin_down: bool = False
    strikes: tuple[float, ...] = ()  # times of recent soft signals (SUSPECT)
    last_bad: float | None = None  # time of the last bad signal of any kind
    flaps: int = 0  # failures not yet forgiven
    holdoff_until: float = 0.0
    probes_ok: int = 0  # successful probes in RECOVERING
    need_evidence: bool = False  # DOWN with the link up: UP only after a ProbeOk
    stable_since: float | None = None  # last entry into UP
    reporters: tuple[tuple[float, str], ...] = ()  # recent lane signals: (time, source)
    kernel_bad: float | None = None  # last kernel signal or failed agent probe
    held: tuple[float, str] | None = None  # last lane signal held back uncorroborated (t, kind)
    vouchers: tuple[str, ...] = ()  # processes that reported a passing probe since DOWN/SUSPECT


@dataclass(frozen=True)
class Transition:
    nic: str
    t: float
    old: NicState
    new: NicState
    reason: str


def initial(nic: str, t: float, *, link_up: bool | None = True) -> NicHealth:
    """A NIC as first seen: UP, or DOWN (without hold-off) when its link is known to be down."""
    if link_up is False:
        return NicHealth(nic, NicState.DOWN, t, t, "link down at start", link_up=False)
    return NicHealth(nic, NicState.UP, t, t, "initial", stable_since=t)


def _enter(h: NicHealth, state: NicState, t: float, reason: str, **kw: Any) -> NicHealth:
    return replace(h, state=state, since=t, reason=reason, **kw)


def probes_needed(h: NicHealth, p: HealthParams) -> int:
    """Successful probes RECOVERING needs before UP."""
    return max(p.recover_probes, 1 if h.need_evidence else 0)


def _go_down(
    h: NicHealth, t: float, reason: str, p: HealthParams, *, evidence: bool = True
) -> NicHealth:
    """Enter DOWN; ``evidence``: the cause leaves the link up, so recovery needs a probe."""
    if h.state is NicState.DOWN:
        return replace(h, last_bad=t)
    flaps = h.flaps
    if (
        h.state is not NicState.RECOVERING
        and h.stable_since is not None
        and t >= h.stable_since + p.flap_reset_s
    ):
        flaps = 0
    flaps += 1
    return _enter(
        h,
        NicState.DOWN,
        t,
        reason,
        flaps=flaps,
        holdoff_until=t + p.holdoff(flaps),
        strikes=(),
        last_bad=t,
        probes_ok=0,
        need_evidence=evidence,
        vouchers=(),
    )


def step(h: NicHealth, ev: Event, p: HealthParams) -> NicHealth:
    """Apply one event to one NIC's health (timers are advanced to ``ev.t`` first)."""
    if ev.nic != h.nic:
        raise HealthError(f"event for {ev.nic!r} applied to NIC {h.nic!r}")
    t = max(ev.t, h.t)
    h = tick(h, t, p)
    if isinstance(ev, _HARD):
        if isinstance(ev, AdminDown):
            h = replace(h, admin_down=True)
            reason = f"admin down{': ' + ev.reason if ev.reason else ''}"
        else:
            h = replace(h, link_up=False) if isinstance(ev, CarrierDown) else h
            reason = ev.kind.replace("_", " ")
        if isinstance(ev, CarrierDown):
            h = replace(h, need_evidence=False)  # carrier up will say when it is back
        h = _go_down(h, t, reason, p, evidence=isinstance(ev, DeviceFatal))
    elif isinstance(ev, CarrierUp | AdminUp):
        h = replace(h, link_up=True) if isinstance(ev, CarrierUp) else replace(h, admin_down=False)
        if h.state is NicState.DOWN and h.link_up and not h.admin_down:
            h = _enter(h, NicState.RECOVERING, t, ev.kind.replace("_", " "), probes_ok=0)
    elif isinstance(ev, _SOFT):
        h = _soft(h, ev, t, p)
    elif isinstance(ev, ProbeOk):
        h, counts = _vouched(h, ev, p)
        if not counts:
            pass  # one process's word: recorded, not yet evidence
        elif ev.t < h.since and h.state in (NicState.DOWN, NicState.RECOVERING):
            pass  # evidence from before the failure says nothing about now
        elif h.state is NicState.SUSPECT:
            h = _enter(h, NicState.UP, t, "probe ok", strikes=(), stable_since=h.stable_since)
        elif h.state is NicState.DOWN and h.link_up and not h.admin_down:
            h = _enter(h, NicState.RECOVERING, t, "probe ok", probes_ok=1)
        elif h.state is NicState.RECOVERING:
            h = replace(h, probes_ok=h.probes_ok + 1)
    else:
        raise HealthError(f"unknown event type {type(ev).__name__}")
    return tick(replace(h, t=t), t, p)


def _vouched(h: NicHealth, ev: ProbeOk, p: HealthParams) -> tuple[NicHealth, bool]:
    """Records a passing probe; whether it now counts as one (see the module doc)."""
    if not ev.source:
        return h, True
    if h.state is NicState.UP or (ev.t < h.since and h.state is not NicState.SUSPECT):
        return h, False  # nothing to vouch for, or evidence from before the failure
    seen = (*tuple(s for s in h.vouchers if s != ev.source)[-31:], ev.source)
    if len(seen) < p.recover_sources:
        return replace(h, vouchers=seen), False
    return replace(h, vouchers=()), True


def _corroborated(h: NicHealth, ev: Event, t: float, p: HealthParams) -> tuple[NicHealth, bool]:
    """Records ``ev`` as evidence; whether the NIC may now go DOWN on it (see the module doc)."""
    source = getattr(ev, "source", "")
    if isinstance(ev, _KERNEL):
        return replace(h, kernel_bad=t), True
    if isinstance(ev, Suspicion):
        return h, False  # one reporter's doubt: never evidence for anything else
    if not source:
        return h, True
    recent = tuple((at, s) for at, s in h.reporters if t - at < p.suspect_window_s)
    recent = (*recent[-31:], (t, source))
    h = replace(h, reporters=recent)
    if len({s for _, s in recent}) >= p.corroborate_sources:
        return h, True
    return h, h.kernel_bad is not None and t - h.kernel_bad < p.suspect_window_s


def _soft(h: NicHealth, ev: Event, t: float, p: HealthParams) -> NicHealth:
    desc = ev.kind.replace("_", " ")
    if isinstance(ev, CounterBreach) and ev.counter:
        desc = f"{desc} {ev.counter} {ev.rate:g}/s > {ev.threshold:g}/s"
    h, corroborated = _corroborated(h, ev, t, p)
    if h.state is NicState.DOWN:
        return replace(h, last_bad=t)
    if not corroborated:
        # one reporter alone: suspicion, never DOWN (its own connections already moved)
        desc = f"{desc} (uncorroborated)"
        if not isinstance(ev, Suspicion):
            h = replace(h, held=(t, ev.kind))
        if h.state is NicState.UP:
            return _enter(h, NicState.SUSPECT, t, desc, last_bad=t, vouchers=())
        return replace(h, last_bad=t)
    if h.held is not None and isinstance(ev, _KERNEL):
        # corroboration works in either order: a kernel signal (or failed agent probe) after
        # a lane signal held back within the window decides for that lane signal
        t0, kind = h.held
        h = replace(h, held=None)
        if t - t0 < p.suspect_window_s and kind in p.down_on and h.state is not NicState.RECOVERING:
            return _go_down(h, t, f"{kind.replace('_', ' ')} corroborated by {desc}", p)
    if h.state is NicState.RECOVERING:
        return _go_down(h, t, f"{desc} while recovering", p)
    if ev.kind in p.down_on:
        return _go_down(h, t, desc, p)
    if h.state is NicState.SUSPECT and isinstance(ev, ProbeFail):
        return _go_down(h, t, "probe failed while suspect", p)
    if isinstance(ev, TcpSuspect | Suspicion):  # suspicion only: the plugins' probes decide
        if h.state is NicState.UP:
            return _enter(h, NicState.SUSPECT, t, desc, last_bad=t, vouchers=())
        return replace(h, last_bad=t)
    strikes = (*(s for s in h.strikes if t - s < p.suspect_window_s), t)
    if len(strikes) >= p.suspect_strikes:
        return _go_down(h, t, f"{len(strikes)} strikes within {p.suspect_window_s:g}s: {desc}", p)
    if h.state is NicState.UP:
        return _enter(h, NicState.SUSPECT, t, desc, strikes=strikes, last_bad=t, vouchers=())
    return replace(h, strikes=strikes, last_bad=t)


def tick(h: NicHealth, now: float, p: HealthParams) -> NicHealth:
    """Advance timers to ``now``: clear SUSPECT, start/finish RECOVERING, forgive old flaps."""
    now = max(now, h.t)
    if h.state is NicState.SUSPECT:
        last = h.last_bad if h.last_bad is not None else h.since
        if now >= last + p.suspect_clear_s:
            h = _enter(h, NicState.UP, last + p.suspect_clear_s, "quiet", strikes=())
    if (
        h.state is NicState.DOWN
        and h.link_up
        and not h.admin_down
        and now >= h.holdoff_until
        and h.flaps > 0
    ):
        # a failure without link loss (blackhole, errors): try again once the hold-off is over
        h = _enter(h, NicState.RECOVERING, h.holdoff_until, "hold-off over", probes_ok=0)
    if h.state is NicState.RECOVERING:
        ready = max(h.holdoff_until, h.since + p.recover_stable_s)
        if now >= ready and h.probes_ok >= probes_needed(h, p):
            at = max(ready, h.t)
            h = _enter(h, NicState.UP, at, "recovered", stable_since=at, need_evidence=False)
    if (
        h.state is NicState.UP
        and h.flaps
        and h.stable_since is not None
        and now >= h.stable_since + p.flap_reset_s
    ):
        h = replace(h, flaps=0)
    return replace(h, t=now)


def next_deadline(h: NicHealth, p: HealthParams) -> float | None:
    """The earliest time at which :func:`tick` would change ``h``; ``None`` if only events can."""
    if h.state is NicState.SUSPECT:
        last = h.last_bad if h.last_bad is not None else h.since
        return last + p.suspect_clear_s
    if h.state is NicState.DOWN and h.link_up and not h.admin_down and h.flaps > 0:
        return h.holdoff_until
    if h.state is NicState.RECOVERING:
        if h.probes_ok < probes_needed(h, p):
            return None
        return max(h.holdoff_until, h.since + p.recover_stable_s)
    if h.state is NicState.UP and h.flaps and h.stable_since is not None:
        return h.stable_since + p.flap_reset_s
    return None


# --------------------------------------------------------------------------------------------
# all NICs of a node


@dataclass(frozen=True)
class HealthModel:
    """The health of every NIC of a node; :meth:`apply` and :meth:`tick` return new models."""

    params: HealthParams
    nics: Mapping[str, NicHealth] = field(default_factory=dict)

    @classmethod
    def create(
        cls,
        names: Iterable[str],
        t: float,
        params: HealthParams | None = None,
        *,
        link_up: Mapping[str, bool | None] | None = None,
    ) -> HealthModel:
        links = link_up or {}
        return cls(
            params or HealthParams(), {n: initial(n, t, link_up=links.get(n, True)) for n in names}
        )

    def __getitem__(self, nic: str) -> NicHealth:
        try:
            return self.nics[nic]
        except KeyError:
            raise HealthError(f"unknown NIC {nic!r}") from None

    @property
    def states(self) -> dict[str, NicState]:
        return {n: h.state for n, h in self.nics.items()}

    def apply(self, ev: Event) -> tuple[HealthModel, Transition | None]:
        old = self[ev.nic]
        new = step(old, ev, self.params)
        return self._with(new), _transition(old, new)

    def tick(self, now: float) -> tuple[HealthModel, list[Transition]]:
        out: dict[str, NicHealth] = {}
        changes: list[Transition] = []
        for name, h in self.nics.items():
            out[name] = tick(h, now, self.params)
            tr = _transition(h, out[name])
            if tr is not None:
                changes.append(tr)
        return replace(self, nics=out), changes

    def next_deadline(self) -> float | None:
        times = [d for h in self.nics.values() if (d := next_deadline(h, self.params)) is not None]
        return min(times) if times else None

    def _with(self, h: NicHealth) -> HealthModel:
        nics = dict(self.nics)
        nics[h.nic] = h
        return replace(self, nics=nics)


def _transition(old: NicHealth, new: NicHealth) -> Transition | None:
    if old.state is new.state and old.since == new.since:
        return None
    return Transition(new.nic, new.since, old.state, new.state, new.reason)
