"""The agent's run directory, shared with the jobs of its node: created and written so that no
job can redirect a write of the (root) agent.

- The directory belongs to the agent's uid (root on a node) and is 0755: jobs may read the table
  and reach the socket (whose own mode decides who may connect), never create, rename or remove
  anything in it. A directory of another uid, or a symlink, is refused; one that an earlier
  version gave to the job's uid is taken back.
- Every file is written through a descriptor of the directory (``dir_fd``): a temp file of a
  random name created with ``O_CREAT | O_EXCL | O_NOFOLLOW`` (never an existing file, never
  through a symlink), every byte written (a short ``write`` is continued, a zero-length one is
  an error), then renamed into place inside the same directory.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import stat
from pathlib import Path

from railhop.control.errors import ControlError

DIR_MODE = 0o755


def open_run_dir(run_dir: Path, *, owner_uid: int | None = None) -> int:
    """Creates ``run_dir`` (0755, the agent's uid) when missing and returns an ``O_DIRECTORY |
    O_NOFOLLOW`` descriptor of it. ControlError for a symlink, a non-directory, or a directory
    of a uid other than the agent's (``owner_uid``'s is taken back: earlier versions gave it
    the directory)."""
    run_dir.parent.mkdir(mode=DIR_MODE, parents=True, exist_ok=True)
    with contextlib.suppress(FileExistsError):
        os.mkdir(run_dir, DIR_MODE)
    try:
        fd = os.open(run_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as e:
        raise ControlError(
            f"run directory {run_dir} is not a directory (a symlink?): {e.strerror}"
        ) from e
    try:
        st = os.fstat(fd)
        if not stat.S_ISDIR(st.st_mode):
            raise ControlError(f"run directory {run_dir} is not a directory")
        me = os.geteuid()
        if st.st_uid != me and not (owner_uid is not None and st.st_uid == owner_uid):
            raise ControlError(
                f"run directory {run_dir} is owned by uid {st.st_uid}, not by this agent (uid {me})"
            )
        if st.st_uid != me:
            os.fchown(fd, me, -1)
        os.fchmod(fd, DIR_MODE)
    except OSError as e:
        os.close(fd)
        raise ControlError(f"run directory {run_dir}: {e.strerror}") from e
    except ControlError:
        os.close(fd)
        raise
    return fd


def write_all(fd: int, data: bytes) -> None:
    """Writes every byte of ``data`` to ``fd``; OSError when the kernel takes none."""
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        if n <= 0:
            raise OSError(0, f"write wrote {n} of {len(view)} bytes")
        view = view[n:]


def create_temp(dir_fd: int, name: str, mode: int = 0o644) -> tuple[int, str]:
    """A new file of a random name next to ``name`` in ``dir_fd``: (fd, temp name). Never opens
    an existing file or follows a symlink."""
    for _ in range(16):
        tmp = f".{name}.{secrets.token_hex(8)}.tmp"
        try:
            fd = os.open(
                tmp,
                os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                mode,
                dir_fd=dir_fd,
            )
        except FileExistsError:
            continue
        try:
            os.fchmod(fd, mode)  # the umask must not decide who can read it
        except OSError:
            os.close(fd)
            os.unlink(tmp, dir_fd=dir_fd)
            raise
        return fd, tmp
    raise OSError(17, f"no free temp name for {name}")


def install(dir_fd: int, tmp: str, name: str) -> None:
    """Renames ``tmp`` over ``name`` inside ``dir_fd`` (atomic for readers)."""
    os.rename(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)


def write_file(dir_fd: int, name: str, data: bytes, mode: int = 0o644) -> None:
    """Writes ``data`` as ``name`` in ``dir_fd`` atomically (temp file + rename); OSError on
    any failure, and then nothing is left behind."""
    fd, tmp = create_temp(dir_fd, name, mode)
    try:
        try:
            write_all(fd, data)
        finally:
            os.close(fd)
        install(dir_fd, tmp, name)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp, dir_fd=dir_fd)
        raise


def write_file_at(path: Path, data: bytes, mode: int = 0o644) -> None:
    """:func:`write_file` for a path: its directory is opened ``O_NOFOLLOW`` first."""
    dfd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        write_file(dfd, path.name, data, mode)
    finally:
        os.close(dfd)
