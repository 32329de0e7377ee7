"""The policy as typed, immutable values (built from data that already passed validation)."""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from railhop.health import HealthParams
from railhop.topology import DistanceClass

__all__ = [
    "HealthPolicy",
    "Network",
    "Policy",
    "RailAssign",
    "RailMode",
    "RailRule",
    "Rails",
    "RuleKind",
    "Spreading",
    "Timeouts",
    "default_policy",
]

Network = tuple[int, int]
"""A NIC's ``(rail, plane)``: the fabric it is cabled to. Planes are separate fabrics."""


class RailMode(enum.Enum):
    AUTO = "auto"
    EXPLICIT = "explicit"


class RuleKind(enum.Enum):
    SAME_RAIL = "same-rail"
    ALLOWED_PAIRS = "allowed-pairs"
    ANY = "any"


@dataclass(frozen=True)
class RailAssign:
    rail: int
    plane: int = 0
    nic: str | None = None
    pci: str | None = None

    @property
    def key(self) -> str:
        return self.nic if self.nic is not None else (self.pci or "").lower()


@dataclass(frozen=True)
class Rails:
    mode: RailMode = RailMode.AUTO
    assign: tuple[RailAssign, ...] = ()
    exclude: tuple[str, ...] = ()


@dataclass(frozen=True)
class RailRule:
    """Which (local network, remote network) pairs a lane may join.

    * ``same-rail``: both ends on the same rail and plane;
    * ``allowed-pairs``: same rail and plane, or rails listed together in ``pairs``/``groups``
      (unordered) with equal planes;
    * ``any``: every pair (the fabric connects all rails and planes).
    """

    kind: RuleKind = RuleKind.ANY
    pairs: frozenset[frozenset[int]] = frozenset()

    def allows(self, local: Network, remote: Network) -> bool:
        if self.kind is RuleKind.ANY:
            return True
        if local[1] != remote[1]:
            return False
        if local[0] == remote[0]:
            return True
        return (
            self.kind is RuleKind.ALLOWED_PAIRS and frozenset((local[0], remote[0])) in self.pairs
        )


@dataclass(frozen=True)
class Timeouts:
    """The plugins' timeouts, published to them through the health table. None: the policy
    does not set it (the plugin's built-in default applies); a job's RAILHOP_* variable wins
    over both."""

    completion_s: float | None = None
    probe_s: float | None = None
    failback_interval_s: float | None = None


@dataclass(frozen=True)
class Spreading:
    max_nics: int = 0  # 0 = every eligible NIC
    min_weight: float = 0.0


@dataclass(frozen=True)
class HealthPolicy:
    params: HealthParams = field(default_factory=HealthParams)
    counters: Mapping[str, float] = field(default_factory=dict)
    counter_window_s: float = 10.0
    migrate_on_suspect: bool = False
    min_rails_up: int = 0  # 0: every rail (railhop status --check --nics)


@dataclass(frozen=True)
class Policy:
    version: int = 1
    name: str = "builtin-default"
    description: str = ""
    rails: Rails = field(default_factory=Rails)
    rule: RailRule = field(default_factory=RailRule)
    distance_limit: DistanceClass = DistanceClass.NODE
    timeouts: Timeouts = field(default_factory=Timeouts)
    spreading: Spreading = field(default_factory=Spreading)
    health: HealthPolicy = field(default_factory=HealthPolicy)
    source: str | None = None  # file it was loaded from
    # top-level keys the file sets: the plugins get rail_rule / distance_limit only when set
    explicit: frozenset[str] = frozenset()

    @classmethod
    def from_data(cls, data: Mapping[str, Any], source: str | None = None) -> Policy:
        """Build from a mapping that passed :func:`railhop.policy.validate.validate_data`."""
        r = data.get("rails", {})
        rails = Rails(
            mode=RailMode(r.get("mode", "auto")),
            assign=tuple(
                RailAssign(
                    rail=int(a["rail"]),
                    plane=int(a.get("plane", 0)),
                    nic=a.get("nic"),
                    pci=a["pci"].lower() if "pci" in a else None,
                )
                for a in r.get("assign", [])
            ),
            exclude=tuple(str(x) for x in r.get("exclude", [])),
        )
        rr = data.get("rail_rule", {"kind": "any"})
        pairs = {frozenset(int(x) for x in p) for p in rr.get("pairs", [])}
        for g in rr.get("groups", []):
            pairs |= {frozenset((int(a), int(b))) for a in g for b in g if a != b}
        rule = RailRule(RuleKind(rr["kind"]), frozenset(p for p in pairs if len(p) == 2))
        to = data.get("timeouts", {})

        def opt_s(key: str) -> float | None:
            return float(to[key]) / 1000 if key in to else None

        timeouts = Timeouts(
            completion_s=opt_s("completion_ms"),
            probe_s=opt_s("probe_ms"),
            failback_interval_s=opt_s("failback_interval_ms"),
        )
        sp = data.get("spreading", {})
        spreading = Spreading(int(sp.get("max_nics", 0)), float(sp.get("min_weight", 0.0)))
        h = data.get("health", {})
        f = data.get("flap_damping", {})
        hp = HealthParams()

        def ms(m: Mapping[str, Any], key: str, default_s: float) -> float:
            return float(m[key]) / 1000 if key in m else default_s

        params = HealthParams(
            suspect_strikes=int(h.get("suspect_strikes", hp.suspect_strikes)),
            suspect_window_s=ms(h, "suspect_window_ms", hp.suspect_window_s),
            suspect_clear_s=ms(h, "suspect_clear_ms", hp.suspect_clear_s),
            down_on=frozenset(h.get("down_on", hp.down_on)),
            recover_stable_s=ms(h, "recover_stable_ms", hp.recover_stable_s),
            recover_probes=int(h.get("recover_probes", hp.recover_probes)),
            corroborate_sources=int(h.get("corroborate_sources", hp.corroborate_sources)),
            recover_sources=int(h.get("recover_sources", hp.recover_sources)),
            holdoff_initial_s=ms(f, "holdoff_initial_ms", hp.holdoff_initial_s),
            holdoff_max_s=ms(f, "holdoff_max_ms", hp.holdoff_max_s),
            holdoff_multiplier=float(f.get("multiplier", hp.holdoff_multiplier)),
            flap_reset_s=ms(f, "reset_after_ms", hp.flap_reset_s),
        )
        health = HealthPolicy(
            params=params,
            counters={str(k): float(v) for k, v in h.get("counters", {}).items()},
            counter_window_s=ms(h, "counter_window_ms", 10.0),
            migrate_on_suspect=bool(h.get("migrate_on_suspect", False)),
            min_rails_up=int(h.get("min_rails_up", 0)),
        )
        return cls(
            version=int(data["version"]),
            name=str(data.get("name", source or "unnamed")),
            description=str(data.get("description", "")),
            rails=rails,
            rule=rule,
            distance_limit=DistanceClass[data.get("distance_limit", "NODE")],
            timeouts=timeouts,
            spreading=spreading,
            health=health,
            source=source,
            explicit=frozenset(str(k) for k in data),
        )


def default_policy() -> Policy:
    """The built-in policy (same values as ``policies/permissive.yaml``)."""
    return Policy()
