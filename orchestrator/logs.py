"""Controller-side copies of node output: nothing a node printed is lost when the terminal scrolls."""

from __future__ import annotations

import os
import re
import threading
import time
from pathlib import Path
from typing import IO


def state_dir() -> Path:
    """``$XDG_STATE_HOME/cluster-bootstrap`` (default ``~/.local/state/cluster-bootstrap``)."""
    base = os.environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state")
    return Path(base) / "cluster-bootstrap"


def new_run_id(kind: str) -> str:
    return time.strftime("%Y%m%d-%H%M%S") + f"-{kind}-{os.getpid()}"


_UNSAFE = re.compile(r"[^A-Za-z0-9._-]")


class RunLog:
    """One file per node under ``<dir>/<node>.log``, appended as output arrives (thread-safe)."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self._files: dict[str, IO[str]] = {}
        self._lock = threading.Lock()

    def path(self, node: str) -> Path:
        return self.directory / f"{_UNSAFE.sub('_', node)}.log"

    def write(self, node: str, line: str) -> None:
        self.write_block(node, line + "\n")

    def write_block(self, node: str, text: str) -> None:
        """Append ``text`` (complete lines, each ending with a newline) to the node's file."""
        with self._lock:
            fh = self._files.get(node)
            if fh is None:
                # node output can hold anything (tokens printed by a script): owner-only, like ~/.ssh
                self.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
                fd = os.open(self.path(node), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
                fh = os.fdopen(fd, "a", encoding="utf-8", errors="replace")
                self._files[node] = fh
            fh.write(text)

    def close(self) -> None:
        with self._lock:
            for fh in self._files.values():
                fh.close()
            self._files.clear()
