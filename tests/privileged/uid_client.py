"""A control-socket client that runs as another uid, for the agent's trust tests
(test_control_peercred.py, test_socket_group.py).

The child needs only the standard library, so it runs on the base interpreter
(``PY_ANY_USER``): the checkout's .venv/bin/python is out of reach for other users when the
checkout lives under a directory they cannot traverse (/root is 0700 on Debian).

It connects to the agent's SOCK_SEQPACKET socket (``refused <errno>`` when that fails), sends the
payload ``count`` times (``closed`` when the agent hung up first), then by ``mode``:

- ``send``: prints ``sent`` and exits;
- ``wait``: waits up to ``wait_s`` for the agent to close (``closed``, ``data``, else ``timeout``);
- ``linger``: the same, but ``sent`` when the connection is still open at the end;
- ``hold``: prints ``connected`` at once, then waits as ``wait`` does (until the agent closes, the
  timeout, or the caller kills it).
"""

from __future__ import annotations

import os
import sys

PY_ANY_USER = os.path.realpath(sys.executable)

_CLIENT = r"""
import socket, sys
path, payload, mode = sys.argv[1], bytes.fromhex(sys.argv[2]), sys.argv[4]
count, wait_s = int(sys.argv[3]), float(sys.argv[5])
s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
try:
    s.connect(path)
except OSError as e:
    print("refused", e.errno, flush=True)
    sys.exit(0)
try:
    for _ in range(count):
        s.send(payload)
except (BrokenPipeError, ConnectionResetError):
    print("closed", flush=True)
    sys.exit(0)
if mode == "send":
    print("sent", flush=True)
    sys.exit(0)
if mode == "hold":
    print("connected", flush=True)
s.settimeout(wait_s)
try:
    print("closed" if s.recv(10) == b"" else "data", flush=True)
except ConnectionResetError:
    print("closed", flush=True)
except TimeoutError:
    print("sent" if mode == "linger" else "timeout", flush=True)
"""

MODES = ("send", "wait", "linger", "hold")


def client_argv(
    sock: str | os.PathLike[str], payload: bytes, mode: str, count: int = 1, wait_s: float = 10.0
) -> list[str]:
    """The command line of one client (run it with ``user=``/``group=`` of the uid to test)."""
    if mode not in MODES:
        raise ValueError(f"mode {mode!r}: one of {', '.join(MODES)}")
    return [
        PY_ANY_USER,
        "-c",
        _CLIENT,
        os.fspath(sock),
        payload.hex(),
        str(count),
        mode,
        str(wait_s),
    ]
