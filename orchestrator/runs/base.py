"""The node side of run management, declared once: what each OS's run scripts must do (runs/posix.py
for Linux and WSL nodes, runs/windows.py for native Windows nodes)."""

from __future__ import annotations

import os
from abc import ABC, abstractmethod
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from orchestrator.errors import UnsafeDirectoryError
from orchestrator.platforms import UNSAFE_DIR_EXIT, Platform

if TYPE_CHECKING:
    from orchestrator.transports import Result


class RunOps(ABC):
    """The scripts that start, stop, inspect and read a run in the node's own shell, and how paths
    are told apart there. Every script names the run by its directory (runs/layout.py)."""

    #: the launch script's name in the run directory
    launcher: str
    #: whether ``tail`` uses the node's Python when given one
    uses_python: bool = False

    platform: Platform

    @abstractmethod
    def start(self, run_dir: str, node_log: str, marker: str, nonce: str) -> str:
        """Start the launcher detached (it outlives our connection), wait until it has written its
        pid file; prints the record (orchestrator/records.py, ``nonce``) ``started "PID ..."``
        (``started-before "PID ..."``, exit 3: it ran before)."""

    @abstractmethod
    def stop(self, run_dir: str, marker: str, grace: float, nonce: str) -> str:
        """Stop every process of the run; prints one record ``stop stopped TERMED KILLED LEFT``,
        ``stop terminated COUNT LEFT`` (no grace period: native Windows) or ``stop
        exited CODE|gone|not-started|no-run``."""

    @abstractmethod
    def status(self, run_dir: str, marker: str, node_log: str, nonce: str) -> str:
        """One record per value, its kind the value's name and one field: now, started, alive, rc,
        ended, stopped, size, modified, spoke (when a rank last printed: its own file's time), last,
        and one ``gpu "INDEX, UTIL, USED, TOTAL"`` per GPU where nvidia-smi exists (``state
        no-run``: no run directory)."""

    @abstractmethod
    def tail(
        self,
        run_dir: str,
        marker: str,
        node_log: str,
        offset: int,
        *,
        nonce: str,
        follow: bool,
        python: str | None,
        interval: float | None,
        lines: int | None = None,
        samples: str = "",
    ) -> str:
        """The log from ``offset`` in the tail protocol (runs/tail.py), its records with ``nonce``.
        ``lines``: from the ``lines``-th last complete line instead (``offset`` ignored): the record
        ``start OFFSET`` first; ``samples``: the nonce of the node's samples in the log (records
        `logs` does not show), which those lines do not count ("": none known)."""

    @abstractmethod
    def list_files(
        self, candidates: Sequence[Sequence[str]], nonce: str, near: Sequence[Sequence[str]] = ()
    ) -> str:
        """For each entry the first of its candidate paths that exists, as one record: ``file I SIZE
        PATH``, ``dir I PATH LISTING`` (LISTING: ``SIZE NUL RELPATH NUL`` per file below it,
        ``/``-separated), or ``missing I``."""

    @abstractmethod
    def which_exist(self, paths: Sequence[str], nonce: str) -> str:
        """The record ``have I`` for each of ``paths`` that exists (anything: a file, a directory)."""

    @abstractmethod
    def is_absolute(self, path: str) -> bool:
        """A path ``fetch`` takes as it is (else: looked for in the run, then the code directory)."""

    def local_parts(self, path: str) -> list[str] | None:
        """``path`` as safe parts of a local path below the fetch destination (None: unsafe)."""
        return safe_parts(path)


#: the bytes of names a directory's listing for `fetch` may hold (about 80,000 files of 100-character
#: paths): a node's listing is cut there on the node, so no listing a run wrote (millions of names,
#: or very long ones) fills the controller's memory; fetch says so and copies the files listed
LISTING_CAP = 8 << 20


def safe_parts(path: str) -> list[str] | None:
    """The names of a ``/`` path, to be joined below a directory here: every leading, doubled or
    trailing ``/`` and every ``.`` dropped (``//etc/x`` is ``etc``, ``x``: never a root of its own);
    None when nothing is left, or a name climbs out (``..``) or holds a NUL."""
    parts = [p for p in path.split("/") if p not in ("", ".")]
    if not parts or any(p == ".." or "\0" in p for p in parts):
        return None
    return parts


def below(root: Path, parts: Sequence[str]) -> Path:
    """``root`` joined with ``parts`` (from :func:`safe_parts`), checked to lie below ``root``: a
    copy from a node is never written anywhere else here, whatever names the node sent."""
    path = root.joinpath(*parts)
    top, where = os.path.normpath(root), os.path.normpath(path)
    odd = any(not p or p in (".", "..") or "/" in p or "\0" in p for p in parts)
    if not parts or odd or where == top or os.path.commonpath([top, where]) != top:
        raise ValueError(f"{'/'.join(parts)!r} does not lie below {root}")
    return path


def refused_dir(result: Result, node: str) -> UnsafeDirectoryError | None:
    """The error of a script that refused a run directory another user could have planted or can
    change (``new_private_dir``, ``check_own_dir``: exit UNSAFE_DIR_EXIT); None for any other end.
    Its message is the script's one line: the path, its owner and mode, what to do."""
    if result.exit_code != UNSAFE_DIR_EXIT:
        return None
    said = [line for line in result.stderr.splitlines() if line.startswith("refusing ")]
    text = said[-1] if said else "refusing the run directory: " + " | ".join(result.tail(3))
    return UnsafeDirectoryError(text, node=node)
