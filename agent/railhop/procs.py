"""Small facts about other processes, read without privileges beyond what the caller has."""

from __future__ import annotations

import os


def pid_alive(pid: int) -> bool:
    """Whether process ``pid`` exists (one that belongs to another user counts as alive)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def netns_ino(pid: int, proc: str = "/proc") -> int | None:
    """The inode of process ``pid``'s network namespace; None when it cannot be read."""
    try:
        return os.stat(f"{proc}/{pid}/ns/net").st_ino
    except OSError:
        return None


def effective_uid(pid: int, proc: str = "/proc") -> int | None:
    """Process ``pid``'s effective uid (the ``Uid:`` line of its status, which any user may
    read; SO_PEERCRED reports the same one); None when it cannot be read."""
    try:
        with open(f"{proc}/{pid}/status", encoding="ascii", errors="replace") as f:
            for line in f:
                if line.startswith("Uid:"):
                    return int(line.split()[2])
    except (OSError, ValueError, IndexError):
        return None
    return None
