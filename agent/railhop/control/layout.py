"""The health table's bytes: a mirror of ``plugin/include/railhop/ctl_table.h`` and pure codecs.

Every struct is described once as a list of ``(field, struct code)`` pairs; the ``struct``
formats and the offsets derive from it, and ``tests/unit/test_control_layout.py`` compiles a C
program against the header to check that every offset and size here equals the C one.

Nothing in this module does I/O: :func:`encode_payload` turns NIC health and plans into the
bytes of the body, NIC and plan arrays; :func:`decode_table` turns a whole table image back into
a :class:`TableSnapshot` (checking magic, sizes and CRC).
"""

from __future__ import annotations

import enum
import struct
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from railhop.control.errors import TableError

TABLE_FILE = "health.tbl"
SOCKET_FILE = "agent.sock"
RUN_DIR_ENV = "RAILHOP_RUN_DIR"
RUN_DIR_DEFAULT = "/run/railhop"

MAGIC = 0x4C544852  # bytes "RHTL"
LAYOUT_VERSION = 2  # 2: the policy's settings in the body
# minor versions keep every older reader working (new fields in formerly reserved, zero
# bytes); 1: the policy's rail rule, distance limit, backup lanes, min_rails_up, rail peers
LAYOUT_MINOR = 1
MAX_NICS = 64
MAX_BACKUPS = 15
IFNAME_LEN = 16
PCI_LEN = 16
NO_RAIL = 0xFFFF
NO_NUMA = -1
NO_DISTANCE = 0xFF
F_AGENT_GONE = 0x1
S_MIGRATE_ON_SUSPECT = 0x1  # body.settings_flags
# body.rail_rule (policy words); 0: the policy does not set it
RAIL_RULE_CODES = {"same-rail": 1, "allowed-pairs": 2, "any": 3}
RAIL_RULE_NAMES = {v: k for k, v in RAIL_RULE_CODES.items()}
MAX_PEER_RAIL = 63  # nic.rail_peers has one bit per remote rail 0..63

Fields = tuple[tuple[str, str], ...]

HEADER_FIELDS: Fields = (
    ("magic", "I"),
    ("layout_version", "H"),
    ("header_size", "H"),
    ("table_size", "I"),
    ("max_nics", "H"),
    ("max_backups", "H"),
    ("nic_rec_size", "H"),
    ("plan_rec_size", "H"),
    ("agent_pid", "I"),
    ("agent_start_ticks", "Q"),
    ("agent_pidns", "Q"),
    ("generation", "Q"),
    ("seq", "Q"),
    ("heartbeat_ns", "Q"),
)
BODY_FIELDS: Fields = (
    ("crc32", "I"),
    ("flags", "I"),
    ("publish_count", "Q"),
    ("publish_ns", "Q"),
    ("nic_count", "H"),
    ("layout_minor", "H"),
    ("heartbeat_ms", "I"),
    ("completion_ms", "I"),
    ("probe_ms", "I"),
    ("failback_interval_ms", "I"),
    ("settings_flags", "I"),
    ("rail_rule", "B"),
    ("distance_limit", "B"),
    ("min_rails_up", "H"),
    ("backup_lanes", "H"),
    ("reserved1", "10s"),
)
NIC_FIELDS: Fields = (
    ("ifname", f"{IFNAME_LEN}s"),
    ("pci", f"{PCI_LEN}s"),
    ("since_ns", "Q"),
    ("changes", "I"),
    ("rail", "H"),
    ("state", "B"),
    ("reason", "B"),
    ("numa", "h"),
    ("reserved0", "H"),
    ("speed_mbps", "I"),
    ("rail_peers", "Q"),
)
BACKUP_FIELDS: Fields = (
    ("local_nic", "H"),
    ("remote_rail", "H"),
    ("weight", "H"),
    ("distance", "B"),
    ("reserved", "B"),
)
PLAN_FIELDS: Fields = (
    ("count", "B"),
    ("reserved0", "B"),
    ("reserved1", "H"),
    ("plan_version", "I"),
    ("backups", f"{MAX_BACKUPS * 8}s"),
)


def struct_of(fields: Fields) -> struct.Struct:
    return struct.Struct("<" + "".join(code for _, code in fields))


def offsets_of(fields: Fields) -> dict[str, int]:
    """Offset of every field (the format is packed and little-endian, as the C structs are)."""
    out: dict[str, int] = {}
    prefix = "<"
    for name, code in fields:
        out[name] = struct.calcsize(prefix)
        prefix += code
    return out


HEADER = struct_of(HEADER_FIELDS)
BODY = struct_of(BODY_FIELDS)
NIC = struct_of(NIC_FIELDS)
BACKUP = struct_of(BACKUP_FIELDS)
PLAN_HEAD = struct.Struct("<BBHI")
PLAN_SIZE = struct_of(PLAN_FIELDS).size

BODY_OFFSET = 64
NICS_OFFSET = 128
PLANS_OFFSET = NICS_OFFSET + MAX_NICS * NIC.size
TABLE_SIZE = PLANS_OFFSET + MAX_NICS * PLAN_SIZE
SEQ_OFFSET = offsets_of(HEADER_FIELDS)["seq"]
HEARTBEAT_OFFSET = offsets_of(HEADER_FIELDS)["heartbeat_ns"]

assert HEADER.size == 64 and BODY.size == 64 and NIC.size == 64
assert BACKUP.size == 8 and PLAN_SIZE == 128 and TABLE_SIZE == 12416


class NicState(enum.IntEnum):
    """``enum rh_nic_state``: what the agent believes about a NIC."""

    UP = 1
    SUSPECT = 2
    DOWN = 3
    RECOVERING = 4


class Reason(enum.IntEnum):
    """``enum rh_nic_reason``: the latest signal that moved a NIC to its state."""

    NONE = 0
    CARRIER = 1
    OPERSTATE = 2
    PORT_STATE = 3
    COUNTERS = 4
    LANE_TIMEOUT = 5
    LANE_ERROR = 6
    TCP = 7
    FLAPPING = 8
    DEVICE_FATAL = 9
    ADMIN = 10
    OTHER = 255


class Distance(enum.IntEnum):
    """``enum rh_distance``: PCIe/NUMA class, nearest first (= railhop.topology.DistanceClass)."""

    LOC = 0
    PIX = 1
    PXB = 2
    PHB = 3
    NODE = 4
    SYS = 5


@dataclass(frozen=True)
class NicHealth:
    """One NIC as the agent publishes it."""

    ifname: str
    state: NicState
    since_ns: int = 0  # CLOCK_MONOTONIC (time.monotonic_ns) when it entered `state`
    reason: Reason = Reason.NONE
    rail: int | None = None
    pci: str = ""
    numa: int | None = None
    speed_mbps: int = 0


@dataclass(frozen=True)
class Backup:
    """One ranked backup choice for a NIC: a local NIC paired with a remote rail."""

    local_nic: str
    remote_rail: int | None = None  # None: any rail the rail rule allows
    weight: int = 1  # relative share of the moved traffic, 0..65535
    distance: Distance | None = None


Plans = Mapping[str, Sequence[Backup]]


@dataclass(frozen=True)
class NodeSettings:
    """The node policy's settings for every plugin on the node (``timeouts``,
    ``health.migrate_on_suspect``, ``rail_rule``, ``distance_limit``, ``spreading.max_nics``)
    and for ``railhop status --check --nics`` (``health.min_rails_up``). 0 / None: not set by
    the policy (the plugin's default applies); a job's own ``RAILHOP_*`` variable wins over
    both. ``rail_pairs`` (allowed-pairs only) is published per NIC as ``rail_peers``."""

    completion_ms: int = 0
    probe_ms: int = 0
    failback_interval_ms: int = 0
    migrate_on_suspect: bool = False
    rail_rule: str | None = None  # same-rail | allowed-pairs | any
    rail_pairs: frozenset[frozenset[int]] = frozenset()
    distance_limit: Distance | None = None
    backup_lanes: int = 0
    min_rails_up: int = 0  # 0: every rail

    def check(self) -> None:
        for name in ("completion_ms", "probe_ms", "failback_interval_ms"):
            v = getattr(self, name)
            if not 0 <= v <= 0xFFFFFFFF:
                raise TableError(f"setting {name}={v} out of range 0..{0xFFFFFFFF}")
        for name in ("backup_lanes", "min_rails_up"):
            v = getattr(self, name)
            if not 0 <= v <= 0xFFFF:
                raise TableError(f"setting {name}={v} out of range 0..65535")
        if self.rail_rule is not None and self.rail_rule not in RAIL_RULE_CODES:
            raise TableError(f"rail rule {self.rail_rule!r}: want one of {list(RAIL_RULE_CODES)}")

    def rail_peers(self, rail: int | None) -> int:
        """The ``rail_peers`` mask of a NIC on ``rail``: bit r set when its lanes may join a
        remote NIC on rail r under ``allowed-pairs`` (its own rail included); 0 otherwise or
        for rails above MAX_PEER_RAIL."""
        if self.rail_rule != "allowed-pairs" or rail is None or rail > MAX_PEER_RAIL:
            return 0
        mask = 1 << rail
        for pair in self.rail_pairs:
            if rail in pair:
                for other in pair:
                    if other <= MAX_PEER_RAIL:
                        mask |= 1 << other
        return mask

    @property
    def flags(self) -> int:
        return S_MIGRATE_ON_SUSPECT if self.migrate_on_suspect else 0


@dataclass(frozen=True)
class TableSnapshot:
    """A decoded, CRC-checked copy of the table."""

    generation: int
    agent_pid: int
    agent_start_ticks: int
    agent_pidns: int
    seq: int
    heartbeat_ns: int
    flags: int
    publish_count: int
    publish_ns: int
    heartbeat_ms: int
    nics: tuple[NicHealth, ...]
    changes: tuple[int, ...]
    plans: dict[str, tuple[Backup, ...]] = field(default_factory=dict)
    plan_versions: dict[str, int] = field(default_factory=dict)
    settings: NodeSettings = field(default_factory=NodeSettings)
    layout_minor: int = LAYOUT_MINOR

    @property
    def agent_gone(self) -> bool:
        return bool(self.flags & F_AGENT_GONE)


def valid_name(name: str, cap: int, *, may_be_empty: bool) -> bool:
    """Printable ASCII without spaces or '/', shorter than ``cap`` (a NUL must fit)."""
    if not name:
        return may_be_empty
    return len(name) < cap and all("!" <= c <= "~" and c != "/" for c in name)


def _pad(name: str, cap: int) -> bytes:
    return name.encode("ascii").ljust(cap, b"\0")


def _unpad(raw: bytes) -> str:
    return raw.split(b"\0", 1)[0].decode("ascii", "replace")


def encode_header(
    *, agent_pid: int, agent_start_ticks: int, agent_pidns: int, generation: int, heartbeat_ns: int
) -> bytes:
    """The static header of a new table (seq 0)."""
    return HEADER.pack(
        MAGIC,
        LAYOUT_VERSION,
        HEADER.size,
        TABLE_SIZE,
        MAX_NICS,
        MAX_BACKUPS,
        NIC.size,
        PLAN_SIZE,
        agent_pid,
        agent_start_ticks,
        agent_pidns,
        generation,
        0,
        heartbeat_ns,
    )


def encode_nic(nic: NicHealth, changes: int, rail_peers: int = 0) -> bytes:
    if not valid_name(nic.ifname, IFNAME_LEN, may_be_empty=False):
        raise TableError(f"NIC name {nic.ifname!r}: want 1..15 printable ASCII characters")
    if not valid_name(nic.pci, PCI_LEN, may_be_empty=True):
        raise TableError(f"NIC {nic.ifname}: PCI address {nic.pci!r} is not printable or too long")
    rail = NO_RAIL if nic.rail is None else nic.rail
    numa = NO_NUMA if nic.numa is None else nic.numa
    if not 0 <= rail <= NO_RAIL or (nic.rail is not None and rail == NO_RAIL):
        raise TableError(f"NIC {nic.ifname}: rail {nic.rail} out of range 0..65534")
    if not -1 <= numa <= 0x7FFF:
        raise TableError(f"NIC {nic.ifname}: NUMA node {nic.numa} out of range")
    if not 0 <= nic.speed_mbps <= 0xFFFFFFFF or not 0 <= nic.since_ns < 1 << 64:
        raise TableError(f"NIC {nic.ifname}: speed {nic.speed_mbps} or since_ns out of range")
    return NIC.pack(
        _pad(nic.ifname, IFNAME_LEN),
        _pad(nic.pci, PCI_LEN),
        nic.since_ns,
        changes & 0xFFFFFFFF,
        rail,
        NicState(nic.state).value,
        Reason(nic.reason).value,
        numa,
        0,
        nic.speed_mbps,
        rail_peers,
    )


def encode_plan(
    owner: str, backups: Sequence[Backup], index: Mapping[str, int], plan_version: int
) -> bytes:
    """One plan record; ``backups`` beyond MAX_BACKUPS must have been cut by the caller."""
    if len(backups) > MAX_BACKUPS:
        raise TableError(f"plan for {owner}: {len(backups)} backups, at most {MAX_BACKUPS}")
    entries = bytearray()
    for b in backups:
        if b.local_nic not in index:
            raise TableError(f"plan for {owner}: backup NIC {b.local_nic!r} is not published")
        rail = NO_RAIL if b.remote_rail is None else b.remote_rail
        if not 0 <= rail <= NO_RAIL:
            raise TableError(f"plan for {owner}: remote rail {b.remote_rail} out of range")
        if not 0 <= b.weight <= 0xFFFF:
            raise TableError(f"plan for {owner}: weight {b.weight} out of range 0..65535")
        dist = NO_DISTANCE if b.distance is None else Distance(b.distance).value
        entries += BACKUP.pack(index[b.local_nic], rail, b.weight, dist, 0)
    head = PLAN_HEAD.pack(len(backups), 0, 0, plan_version & 0xFFFFFFFF)
    return (head + bytes(entries)).ljust(PLAN_SIZE, b"\0")


def payload_crc(body: bytes, nics: bytes, plans: bytes) -> int:
    """CRC over body[4:], then the used NIC records, then the used plan records."""
    return zlib.crc32(plans, zlib.crc32(nics, zlib.crc32(body[4:])))


@dataclass(frozen=True)
class Payload:
    """The seqlocked part of the table: body at BODY_OFFSET, full NIC and plan arrays."""

    body: bytes
    nics: bytes  # MAX_NICS records, unused ones zero
    plans: bytes  # MAX_NICS records, unused ones zero


def encode_payload(
    nics: Sequence[NicHealth],
    plans: Plans,
    *,
    changes: Sequence[int],
    plan_versions: Sequence[int],
    publish_count: int,
    publish_ns: int,
    flags: int,
    heartbeat_ms: int,
    settings: NodeSettings | None = None,
) -> Payload:
    """Pure: the bytes of one publish. Plans must name published NICs, each <= MAX_BACKUPS."""
    if len(nics) > MAX_NICS:
        raise TableError(f"{len(nics)} NICs, the table holds at most {MAX_NICS}")
    index: dict[str, int] = {}
    for i, nic in enumerate(nics):
        if nic.ifname in index:
            raise TableError(f"NIC {nic.ifname} published twice")
        index[nic.ifname] = i
    for owner in plans:
        if owner not in index:
            raise TableError(f"plan for {owner!r}, which is not a published NIC")
    s = settings or NodeSettings()
    s.check()
    nic_bytes = b"".join(
        encode_nic(n, c, s.rail_peers(n.rail)) for n, c in zip(nics, changes, strict=True)
    )
    plan_bytes = b"".join(
        encode_plan(n.ifname, plans.get(n.ifname, ()), index, v)
        for n, v in zip(nics, plan_versions, strict=True)
    )
    body_tail = BODY.pack(
        0,
        flags,
        publish_count,
        publish_ns,
        len(nics),
        LAYOUT_MINOR,
        heartbeat_ms,
        s.completion_ms,
        s.probe_ms,
        s.failback_interval_ms,
        s.flags,
        RAIL_RULE_CODES.get(s.rail_rule or "", 0),
        NO_DISTANCE if s.distance_limit is None else Distance(s.distance_limit).value,
        s.min_rails_up,
        s.backup_lanes,
        b"",
    )[4:]
    crc = payload_crc(b"\0\0\0\0" + body_tail, nic_bytes, plan_bytes)
    body = struct.pack("<I", crc) + body_tail
    return Payload(
        body=body,
        nics=nic_bytes.ljust(MAX_NICS * NIC.size, b"\0"),
        plans=plan_bytes.ljust(MAX_NICS * PLAN_SIZE, b"\0"),
    )


def check_header(image: bytes) -> tuple[int, ...]:
    """The header fields of a table image, or TableError when it is not a table we can read."""
    if len(image) < TABLE_SIZE:
        raise TableError(f"table is {len(image)} bytes, want at least {TABLE_SIZE} (truncated?)")
    h = HEADER.unpack_from(image, 0)
    want = (MAGIC, LAYOUT_VERSION, HEADER.size, TABLE_SIZE, MAX_NICS, MAX_BACKUPS, NIC.size)
    if h[:8] != (*want, PLAN_SIZE):
        raise TableError(
            f"table header magic {h[0]:#x} layout {h[1]} sizes {h[2:8]}: "
            f"want magic {MAGIC:#x} layout {LAYOUT_VERSION}"
        )
    return h


def decode_table(image: bytes) -> TableSnapshot:
    """Pure: a whole table image (a consistent copy) to a snapshot; TableError if corrupt."""
    h = check_header(image)
    body = image[BODY_OFFSET : BODY_OFFSET + BODY.size]
    crc, flags, publish_count, publish_ns, n, minor, heartbeat_ms, *settings, _r1 = BODY.unpack(
        body
    )
    c_ms, p_ms, fb_ms, s_flags, rule, dist, min_up, lanes = settings
    if minor < 1:  # written before these fields existed: zero bytes, not settings
        rule, dist, min_up, lanes = 0, NO_DISTANCE, 0, 0
    if n > MAX_NICS:
        raise TableError(f"nic_count {n} > {MAX_NICS}")
    nic_bytes = image[NICS_OFFSET : NICS_OFFSET + n * NIC.size]
    plan_bytes = image[PLANS_OFFSET : PLANS_OFFSET + n * PLAN_SIZE]
    if payload_crc(body, nic_bytes, plan_bytes) != crc:
        raise TableError("table CRC mismatch (torn or corrupt)")
    nics: list[NicHealth] = []
    changes: list[int] = []
    pairs: set[frozenset[int]] = set()
    for i in range(n):
        (ifname, pci, since, chg, rail, state, reason, numa, _a, speed, peers) = NIC.unpack_from(
            nic_bytes, i * NIC.size
        )
        pairs |= {frozenset((rail, r)) for r in range(MAX_PEER_RAIL + 1) if peers >> r & 1}
        try:
            st = NicState(state)
            rs = Reason(reason) if reason in Reason._value2member_map_ else Reason.OTHER
        except ValueError as e:
            raise TableError(f"NIC record {i}: state {state} is not a NIC state") from e
        nics.append(
            NicHealth(
                ifname=_unpad(ifname),
                state=st,
                since_ns=since,
                reason=rs,
                rail=None if rail == NO_RAIL else rail,
                pci=_unpad(pci),
                numa=None if numa == NO_NUMA else numa,
                speed_mbps=speed,
            )
        )
        changes.append(chg)
    plans: dict[str, tuple[Backup, ...]] = {}
    versions: dict[str, int] = {}
    for i in range(n):
        count, _a, _b, version = PLAN_HEAD.unpack_from(plan_bytes, i * PLAN_SIZE)
        if count > MAX_BACKUPS:
            raise TableError(f"plan record {i}: {count} backups > {MAX_BACKUPS}")
        entries: list[Backup] = []
        for k in range(count):
            local, rail, weight, dist, _r = BACKUP.unpack_from(
                plan_bytes, i * PLAN_SIZE + PLAN_HEAD.size + k * BACKUP.size
            )
            if local >= n:
                raise TableError(f"plan record {i}: backup NIC index {local} >= {n}")
            entries.append(
                Backup(
                    local_nic=nics[local].ifname,
                    remote_rail=None if rail == NO_RAIL else rail,
                    weight=weight,
                    distance=None if dist > Distance.SYS else Distance(dist),
                )
            )
        if count:
            plans[nics[i].ifname] = tuple(entries)
        versions[nics[i].ifname] = version
    return TableSnapshot(
        generation=h[11],
        agent_pid=h[8],
        agent_start_ticks=h[9],
        agent_pidns=h[10],
        seq=h[12],
        heartbeat_ns=h[13],
        flags=flags,
        publish_count=publish_count,
        publish_ns=publish_ns,
        heartbeat_ms=heartbeat_ms,
        nics=tuple(nics),
        changes=tuple(changes),
        plans=plans,
        plan_versions=versions,
        settings=NodeSettings(
            completion_ms=c_ms,
            probe_ms=p_ms,
            failback_interval_ms=fb_ms,
            migrate_on_suspect=bool(s_flags & S_MIGRATE_ON_SUSPECT),
            rail_rule=RAIL_RULE_NAMES.get(rule),
            rail_pairs=frozenset(p for p in pairs if len(p) == 2),
            distance_limit=Distance(dist) if dist <= Distance.SYS else None,
            backup_lanes=lanes,
            min_rails_up=min_up,
        ),
        layout_minor=minor,
    )
