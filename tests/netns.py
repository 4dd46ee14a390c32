"""Enter a network namespace from the current thread (tests only).

Network namespaces are per thread: sockets created while a thread is inside one stay there, so an
in-process paramiko client can connect to namespace hosts while pytest itself stays outside.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
from collections.abc import Iterator
from contextlib import contextmanager

CLONE_NEWNET = 0x40000000
_libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)


def _setns(fd: int) -> None:
    if _libc.setns(fd, CLONE_NEWNET) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"setns failed: {os.strerror(err)}")


@contextmanager
def inside(ns: str) -> Iterator[None]:
    """Run the body (this thread only) inside network namespace ``ns`` (created by ``ip netns add``)."""
    original = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
    target = os.open(f"/run/netns/{ns}", os.O_RDONLY)
    try:
        _setns(target)
        try:
            yield
        finally:
            _setns(original)
    finally:
        os.close(target)
        os.close(original)


CLONE_NEWNS = 0x00020000
MS_BIND = 0x1000
MS_SLAVE = 0x80000


def _mount(source: str | None, target: str, flags: int) -> None:
    src = None if source is None else os.fsencode(source)
    if _libc.mount(src, os.fsencode(target), None, flags, None) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"mount {source or ''} {target}: {os.strerror(err)}")


def _mount_point_of(path: str) -> str:
    """The mount point (as /proc/self/mountinfo lists it) that ``path`` lies on."""
    best = "/"
    with open("/proc/self/mountinfo") as fh:
        for line in fh:
            point = line.split()[4].encode().decode("unicode_escape")  # "\040" for a space
            if (path == point or path.startswith(point.rstrip("/") + "/")) and len(point) > len(best):
                best = point
    return best


def private_bind(directory: str, source: str) -> None:
    """From now on the calling thread, and every process and thread it starts, sees ``source`` at
    ``directory``; nothing changes for the rest of the machine.

    A mount namespace of its own (unshare(CLONE_NEWNS) moves only the calling thread of a process
    with threads: call it from the thread that runs the tests) in which the mount that ``directory``
    lies on is made a slave, so the bind mount never propagates back. Every other mount keeps its
    propagation: network namespaces added (``ip netns add``, under the shared /run/netns) stay
    visible to the whole machine, as without this."""
    if _libc.unshare(CLONE_NEWNS) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"unshare(CLONE_NEWNS): {os.strerror(err)}")
    os.makedirs(directory, exist_ok=True)
    _mount(None, _mount_point_of(os.path.abspath(directory)), MS_SLAVE)
    _mount(source, directory, MS_BIND)
