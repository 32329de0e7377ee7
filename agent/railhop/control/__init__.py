"""The control plane between the agent and the plugins of its node.

- a shared-memory health table (``health.tbl``: NIC health and backup plans, seqlock + CRC,
  layout in ``plugin/include/railhop/ctl_table.h``) written by the agent, read by every plugin;
- a Unix socket (``agent.sock``) where plugins send lane events.

Both live in ``$RAILHOP_RUN_DIR`` (default ``/run/railhop``). See docs/control-plane.md.
"""

from railhop.control.errors import ControlError, EventDecodeError, TableError
from railhop.control.lane_events import (
    EventFlag,
    EventType,
    LaneEvent,
    decode_event,
    encode_event,
)
from railhop.control.layout import (
    Backup,
    Distance,
    NicHealth,
    NicState,
    NodeSettings,
    Reason,
    TableSnapshot,
)
from railhop.control.plane import ControlCounters, ControlPlane, default_run_dir
from railhop.control.server import PeerCred, ReceivedEvent
from railhop.control.table import TableWriter, read_table

__all__ = [
    "Backup",
    "ControlCounters",
    "ControlError",
    "ControlPlane",
    "Distance",
    "EventDecodeError",
    "EventFlag",
    "EventType",
    "LaneEvent",
    "NicHealth",
    "NicState",
    "NodeSettings",
    "PeerCred",
    "Reason",
    "ReceivedEvent",
    "TableError",
    "TableSnapshot",
    "TableWriter",
    "decode_event",
    "default_run_dir",
    "encode_event",
    "read_table",
]
