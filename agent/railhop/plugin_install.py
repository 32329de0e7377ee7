"""``railhop plugin-install``: puts the plugin libraries into a host directory that jobs load them
from (the DaemonSet's initContainer writes the node's ``/opt/railhop/lib``).

Both names are installed: ``libnccl-net-railhop.so`` (NCCL >= 2.20 resolves
``NCCL_NET_PLUGIN=railhop`` to it) and ``librccl-net-railhop.so`` (RCCL's name for the same
library). Each file is replaced atomically: the new content goes to a temp file in the same
directory, is fsync'ed, and is renamed over the old name, then the directory is fsync'ed. A job
that has the old file mapped keeps its inode (the rename never writes into it); a job that
starts afterwards loads the new one; nobody ever sees a half-written library. A file whose
content is already the same is left alone (same inode, no rename).

Deciding (:func:`plan_install`, pure) is apart from acting (:func:`install`).
"""

from __future__ import annotations

import contextlib
import enum
import hashlib
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from railhop import paths

PLUGIN_NAMES = (paths.NCCL_PLUGIN_NAME, paths.RCCL_PLUGIN_NAME)
FILE_MODE = 0o644
DIR_MODE = 0o755
_CHUNK = 1 << 20


class PluginInstallError(OSError):
    """The plugin could not be installed (source missing, destination not writable, ...)."""


class Action(enum.Enum):
    INSTALL = "installed"  # no file of that name yet
    REPLACE = "replaced"  # a different file: replaced atomically
    KEEP = "unchanged"  # the same content already there


@dataclass(frozen=True)
class Step:
    name: str
    source: Path
    dest: Path
    action: Action


def digest(path: Path) -> str | None:
    """sha256 of ``path``'s content; None when there is no regular file to read."""
    h = hashlib.sha256()
    try:
        with path.open("rb") as f:
            while chunk := f.read(_CHUNK):
                h.update(chunk)
    except (FileNotFoundError, IsADirectoryError):
        return None
    return h.hexdigest()


def plan_install(
    sources: Mapping[str, Path],
    dest_dir: Path,
    source_digests: Mapping[str, str],
    dest_digests: Mapping[str, str | None],
) -> list[Step]:
    """What to do for each name: install (absent), replace (other content) or keep (same)."""
    steps = []
    for name in sorted(sources):
        have = dest_digests.get(name)
        if have is None:
            action = Action.INSTALL
        elif have == source_digests[name]:
            action = Action.KEEP
        else:
            action = Action.REPLACE
        steps.append(Step(name, sources[name], dest_dir / name, action))
    return steps


def default_sources() -> dict[str, Path]:
    """The installed package's plugin files, by the name they get on the host."""
    try:
        return {
            paths.NCCL_PLUGIN_NAME: paths.plugin_path(rccl=False),
            paths.RCCL_PLUGIN_NAME: paths.plugin_path(rccl=True),
        }
    except paths.NotInstalledError as e:
        raise PluginInstallError(str(e)) from e


def _fsync_dir(d: Path) -> None:
    fd = os.open(d, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def copy_atomic(source: Path, dest: Path) -> None:
    """Copies ``source`` to ``dest`` through a temp file in ``dest``'s directory: write, fsync,
    chmod 0644, rename, fsync the directory. The temp file is removed on any failure."""
    tmp = dest.with_name(f".{dest.name}.tmp-{os.getpid()}")
    with contextlib.suppress(FileNotFoundError):
        tmp.unlink()  # left by an earlier run of this pid that died
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        try:
            with source.open("rb") as src:
                while chunk := src.read(_CHUNK):
                    view = memoryview(chunk)
                    while view:
                        view = view[os.write(fd, view) :]
            os.fchmod(fd, FILE_MODE)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.rename(tmp, dest)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise
    _fsync_dir(dest.parent)


def install(dest_dir: Path, sources: Mapping[str, Path] | None = None) -> list[Step]:
    """Installs every plugin name into ``dest_dir`` (created 0755 if missing) and returns what
    was done for each. PluginInstallError names the file and the reason on any failure."""
    srcs = dict(sources) if sources is not None else default_sources()
    try:
        dest_dir.mkdir(mode=DIR_MODE, parents=True, exist_ok=True)
    except OSError as e:
        raise PluginInstallError(f"cannot create {dest_dir}: {e.strerror or e}") from e
    if not dest_dir.is_dir():
        raise PluginInstallError(f"{dest_dir} is not a directory")
    src_digests: dict[str, str] = {}
    for name, src in srcs.items():
        d = digest(src)
        if d is None:
            raise PluginInstallError(f"{src} (for {name}) is not a readable file")
        src_digests[name] = d
    steps = plan_install(
        srcs, dest_dir, src_digests, {name: digest(dest_dir / name) for name in srcs}
    )
    for step in steps:
        if step.action is Action.KEEP:
            continue
        try:
            copy_atomic(step.source, step.dest)
        except OSError as e:
            raise PluginInstallError(
                f"cannot install {step.source} as {step.dest}: {e.strerror or e}"
            ) from e
    return steps


def describe(steps: Sequence[Step]) -> list[str]:
    """One line per file, for the CLI."""
    return [f"{s.action.value}: {s.dest} (from {s.source})" for s in steps]
