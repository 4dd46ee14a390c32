"""How bytes reach a node: the interface every transport implements.

A transport knows sockets and processes, never shell syntax: it asks the node's platform to wrap a
command (environment, working directory, privilege) and sends the resulting text.
"""

from __future__ import annotations

import codecs
import logging
import time
from abc import ABC, abstractmethod
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from orchestrator.platforms import Platform

log = logging.getLogger("orchestrator.transports")

Stream = Literal["stdout", "stderr"]
#: called with each complete output line (without its newline) as it arrives
OnLine = Callable[[Stream, str], None]


class BlockHandler:
    """An ``on_line`` handler that also takes many complete lines in one call.

    Transports hand ``block`` every complete line one read brought in (text ending with a newline,
    ``\r\n`` turned into ``\n``), so a fast stream (a training log at 100k lines/s) costs Python work
    per read, not per line. Calling the handler with one line still works (``block`` of that line).
    """

    def __call__(self, stream: Stream, line: str) -> None:
        self.block(stream, line + "\n")

    def block(self, stream: Stream, text: str) -> None:
        raise NotImplementedError


@dataclass
class Result:
    """What one command did on one node (invoke's ``Result`` shape)."""

    node: str
    command: str
    exit_code: int | None  # None: no exit status (timed out, connection lost, cancelled)
    stdout: str
    stderr: str
    duration: float
    timed_out: bool = False

    @property
    def ok(self) -> bool:
        return self.exit_code == 0

    def tail(self, lines: int = 20) -> list[str]:
        """Last ``lines`` lines of stdout and stderr together (stderr last), for failure summaries."""
        text = self.stdout.splitlines() + self.stderr.splitlines()
        return text[-lines:]

    def public_dict(self) -> dict[str, object]:
        return {
            "exit_code": self.exit_code,
            "stdout": self.stdout,
            "stderr": self.stderr,
            "duration": round(self.duration, 4),
            "timed_out": self.timed_out,
        }


@dataclass
class LineSplitter:
    """Turns a byte stream into text lines as they complete.

    Decodes UTF-8 incrementally (a multi-byte character split across reads stays whole) and replaces
    invalid bytes rather than failing: a training log with one bad byte must keep streaming.
    """

    stream: Stream
    on_line: OnLine | None
    keep: int | None = None  # keep only the last N lines (long runs); None keeps everything
    _decoder: codecs.IncrementalDecoder = field(
        default_factory=lambda: codecs.getincrementaldecoder("utf-8")(errors="replace")
    )
    _partial: str = ""
    _chunks: list[str] = field(default_factory=list)
    _tail: deque[str] = field(default_factory=deque)
    _block: Callable[[Stream, str], None] | None = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        self._tail = deque(maxlen=self.keep)
        if isinstance(self.on_line, BlockHandler):
            self._block = self.on_line.block

    def feed(self, data: bytes) -> None:
        text = self._decoder.decode(data)
        if not text:
            return
        self._remember(text)
        if self.on_line is None:
            return
        buf = self._partial + text
        if self._block is not None:
            cut = buf.rfind("\n") + 1
            self._partial = buf[cut:]
            if cut:
                self._block(self.stream, buf[:cut].replace("\r\n", "\n") if "\r" in buf else buf[:cut])
            return
        *complete, self._partial = buf.split("\n")
        for line in complete:
            self.on_line(self.stream, line.removesuffix("\r"))

    def close(self) -> None:
        text = self._decoder.decode(b"", final=True)
        if text:
            self._remember(text)
        if self.on_line is not None:
            rest = self._partial + text
            self._partial = ""
            if rest and self._block is not None:
                self._block(self.stream, rest.replace("\r\n", "\n").removesuffix("\r") + "\n")
            elif rest:
                self.on_line(self.stream, rest.removesuffix("\r"))

    def _remember(self, text: str) -> None:
        if self.keep is None:
            self._chunks.append(text)
            return
        self._tail.extend(text.splitlines(keepends=True))  # the deque drops what is older than keep

    @property
    def text(self) -> str:
        if self.keep is None:
            return "".join(self._chunks)
        return "".join(self._tail)


class Deadline:
    """Remaining time of an optional timeout."""

    def __init__(self, timeout: float | None) -> None:
        self.start = time.monotonic()
        self.end = None if timeout is None else self.start + timeout

    def remaining(self, cap: float) -> float:
        if self.end is None:
            return cap
        return max(0.0, min(cap, self.end - time.monotonic()))

    @property
    def expired(self) -> bool:
        return self.end is not None and time.monotonic() >= self.end

    @property
    def elapsed(self) -> float:
        return time.monotonic() - self.start


class Transport(ABC):
    """One connection to one node, reused by every step."""

    #: "local", "ssh", "winrm"
    kind: str
    #: set by ``close()``; sticky
    _closed: bool = False

    def __init__(self, node_name: str, platform: Platform) -> None:
        self.node_name = node_name
        self.platform = platform
        #: host keys trusted on first use while connecting ("host type SHA256:..."), for the report
        self.recorded_host_keys: list[str] = []
        #: what a user should know about how this node is reached, each said once (e.g. files go
        #: through the shell because the SSH server has no sftp subsystem), for ``-v`` and ``check``
        self.notes: list[str] = []

    @abstractmethod
    def connect(self) -> None:
        """Open the connection (idempotent). Raises ``ConnectError`` subclasses."""

    def plan(self, script: str) -> str:
        """What ``run_raw`` would hand the node's shell for ``script`` (shown by --dry-run)."""
        return script

    @property
    def closed(self) -> bool:
        """Closed by ``close()`` (a cancel: fail fast, Ctrl-C): what fails now was stopped, not broken."""
        return self._closed

    @abstractmethod
    def run_raw(
        self,
        script: str,
        *,
        timeout: float | None = None,
        on_line: OnLine | None = None,
        keep_lines: int | None = None,
    ) -> Result:
        """Run ``script`` (text in the node's shell dialect, see ``Platform.wrap``) and wait for it."""

    def run(
        self,
        command: str,
        *,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        timeout: float | None = None,
        on_line: OnLine | None = None,
        become: bool = False,
        keep_lines: int | None = None,
    ) -> Result:
        """Run shell text ``command`` on the node with ``env`` exported inside ``cwd``.

        ``on_line`` receives each line while the command runs. ``become`` runs it as root (sudo -n for
        other users). ``keep_lines`` bounds how much output the result keeps (None: all).
        """
        script = self.platform.wrap(command, env=env, cwd=cwd, become=become)
        first = command.strip().splitlines()[0] if command.strip() else ""
        # the command only: env values may be sensitive, and -vv is pasted into bug reports
        log.info("%s: run %s%s", self.node_name, first[:120], " (as root)" if become else "")
        result = self.run_raw(script, timeout=timeout, on_line=on_line, keep_lines=keep_lines)
        log.info(
            "%s: %s after %.2fs",
            self.node_name,
            "timed out" if result.timed_out else f"exit {result.exit_code}",
            result.duration,
        )
        result.command = command
        return result

    @abstractmethod
    def put(self, local: Path, remote: str, *, mode: int | None = None) -> None:
        """Copy a local file to ``remote`` on the node.

        ``mode``: the file's permission bits (POSIX nodes), in place before any of its bytes are
        written, so a private file (0o600) is never readable by others, not even while it arrives.
        None: whatever the node's umask gives. Native Windows nodes have no POSIX modes: the file
        inherits its directory's ACL there.
        """

    @abstractmethod
    def get(self, remote: str, local: Path) -> None:
        """Copy ``remote`` from the node to a local file."""

    @abstractmethod
    def close(self) -> None:
        """Close the connection; safe to call twice and from another thread (cancellation)."""

    def describe(self) -> str:
        """Where this transport goes, for messages (never includes secrets)."""
        return self.kind
