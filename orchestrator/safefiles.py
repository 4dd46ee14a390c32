"""Files named after something from outside (a node, a run) written here, and only inside their directory.

A name is one path component: never a path (``/``, ``\\``, ``..``), never a link followed. Node names
are already restricted by the inventory (host-name characters); this is the second fence, at the
place where a name becomes a file.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from importlib import resources
from pathlib import Path
from typing import Any, BinaryIO

# O_NOFOLLOW exists on every POSIX system; on Windows (no symlink attack through os.open there) it is 0
NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)


def check_component(name: str) -> str:
    """``name`` when it is one harmless path component, else ValueError."""
    if name in ("", ".", "..") or any(c in name for c in "/\\\0") or name != name.strip("\n\r"):
        raise ValueError(f"{name!r} cannot be a file name: it is not one plain path component")
    return name


def write_inside(directory: Path, name: str, data: bytes, mode: int = 0o600) -> Path:
    """Write ``data`` to ``directory/name`` atomically, creating or replacing that entry itself.

    The bytes go to a new temporary file (``O_EXCL | O_NOFOLLOW``) renamed over ``name``: an existing
    symlink at ``name`` is replaced, never written through, and a reader never sees half a file.
    """
    check_component(name)
    path = directory / name
    tmp = directory / f".{name}.{os.getpid()}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | NOFOLLOW, mode)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        if hasattr(os, "fchmod"):
            os.fchmod(fd, mode)  # the umask may have narrowed it: the mode asked for, no wider
    except BaseException:
        os.close(fd)
        tmp.unlink(missing_ok=True)
        raise
    os.close(fd)
    os.replace(tmp, path)
    return path


#: what to do about a directory here another user can change
_HERE_FIX = (
    "bootstrap writes there (runs/ is kept in the directory it is started from): start it from a"
    " directory only you or root can write to, e.g. under your home (one all can write to, such as"
    " /tmp, only with the sticky bit)"
)


@functools.cache
def _walk() -> Callable[[str], str | None]:
    """The nodes' walk (steps/probes/safe_path.py, shipped as text to run there), for this machine."""
    namespace: dict[str, Any] = {"__name__": "safe_path"}
    source = resources.files("orchestrator.steps.probes").joinpath("safe_path.py").read_text()
    exec(compile(source, "safe_path.py", "exec"), namespace)
    fix = namespace["SAFE_PATH_FIX"]
    return lambda path: (said := namespace["unsafe_path"](path)) and said.replace(fix, _HERE_FIX)


def check_here(directory: Path) -> None:
    """Refuse (UnsafeDirectoryError, exit 2) a ``directory`` of this machine that another user could
    change, from ``/`` down to its deepest existing component (a link followed, as the kernel does):
    one who can write the directory bootstrap was started from could swap runs/<run-id> for a link
    between its creation and the files written into it (run.json, the nodes' logs, fetched files)."""
    from orchestrator.errors import UnsafeDirectoryError

    if said := _walk()(os.path.abspath(directory)):
        raise UnsafeDirectoryError(said)


def private_dirs(directory: Path) -> Path:
    """Create ``directory`` and every missing parent owner-only (0700): what is copied or logged
    into them (a fetched launch script, a node's output) is readable by this user alone, whatever the
    umask. Directories that exist already are left as they are, once walked (:func:`check_here`): no
    other user may be able to change them."""
    check_here(directory)
    missing: list[Path] = []
    current = directory
    while not current.exists() and not current.is_symlink() and current != current.parent:
        missing.append(current)
        current = current.parent
    for path in reversed(missing):
        try:
            os.mkdir(path, 0o700)
        except FileExistsError:
            if not path.is_dir():
                raise
    return directory


@contextmanager
def replacing(path: Path, mode: int = 0o600) -> Iterator[BinaryIO]:
    """A new file to write ``path``'s content into, renamed over ``path`` when the block ends without
    an error (removed otherwise): ``<name>.part`` beside it, created exclusively and never through a
    link (``O_EXCL | O_NOFOLLOW``; an old one, or a link planted under that name, is removed first,
    never followed), with ``mode`` from its first byte."""
    part = path.with_name(check_component(path.name) + ".part")
    part.unlink(missing_ok=True)
    fd = os.open(part, os.O_WRONLY | os.O_CREAT | os.O_EXCL | NOFOLLOW, mode)
    try:
        with os.fdopen(fd, "wb") as fh:
            yield fh
        os.replace(part, path)
    except BaseException:
        part.unlink(missing_ok=True)
        raise
