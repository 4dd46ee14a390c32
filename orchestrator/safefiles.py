"""Files named after something from outside (a node, a run) written here, and only inside their directory.

A name is one path component: never a path (``/``, ``\\``, ``..``), never a link followed. Node names
are already restricted by the inventory (host-name characters); this is the second fence, at the
place where a name becomes a file.
"""

from __future__ import annotations

import os
from pathlib import Path

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
