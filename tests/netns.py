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
