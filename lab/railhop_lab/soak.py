"""Random fault schedules for soaks (the CI soak test and ``bench/soak.py``).

A schedule is a sorted list of ``(t, action, node, nic)``: every fault kind the fabric has
(carrier loss at either veth end, silent blackhole, carrier flapping at 5 Hz) on random NICs
of either node, each held 0.5-3 s then healed; several NICs can be faulted at once, but one
rail (the same NIC index on both nodes) is never touched, so a healthy pair always remains and
no connection may give up.
"""

from __future__ import annotations

import random

from railhop_lab.fabric import Fabric

FAULTS = ("carrier_local", "carrier_remote", "blackhole", "flap")

Step = tuple[float, str, int, int]


def soak_plan(seed: int, duration: float, nics: int = 4, nodes: int = 2) -> list[Step]:
    """A random fault schedule over ``duration`` s (faults start after 1 s and end 4 s before
    the end); the same seed gives the same schedule."""
    rng = random.Random(seed)
    keep = rng.randrange(nics)
    plan: list[Step] = []
    busy_until: dict[tuple[int, int], float] = {}
    t = 1.0
    while t < duration - 4.0:
        node, nic = rng.randrange(nodes), rng.choice([i for i in range(nics) if i != keep])
        if busy_until.get((node, nic), 0.0) <= t:
            action = rng.choice(FAULTS)
            hold = rng.uniform(0.5, 3.0)
            plan.append((t, action, node, nic))
            plan.append((t + hold, "heal", node, nic))
            busy_until[(node, nic)] = t + hold + 0.1
        t += rng.uniform(0.3, 1.5)
    return sorted(plan)


def kept_rail(plan: list[Step], nics: int = 4) -> set[int]:
    """The NIC indexes the schedule never faults."""
    return set(range(nics)) - {nic for _, action, _, nic in plan if action != "heal"}


def apply(fab: Fabric, action: str, node: int, nic: int) -> None:
    """One step of a schedule on the fabric."""
    if action == "heal":
        fab.heal(node, nic)
    elif action == "carrier_local":
        fab.carrier_down(node, nic, end="local")
    elif action == "carrier_remote":
        fab.carrier_down(node, nic, end="remote")
    elif action == "blackhole":
        fab.blackhole(node, nic)
    elif action == "flap":
        fab.flap(node, nic, hz=5, duration=1.0)
    else:
        raise ValueError(f"unknown soak action {action!r}")
