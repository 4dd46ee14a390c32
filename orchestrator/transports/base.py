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
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from orchestrator.platforms import Platform

log = logging.getLogger("orchestrator.transports")

Stream = Literal["stdout", "stderr"]
#: called with each complete output line (without its newline) as it arrives
OnLine = Callable[[Stream, str], None]


#: the longest line handed on whole, in characters: a longer one (output without a newline for that
#: long, a progress bar redrawn with ``\r``) is handed on in pieces of this size, each shown as a line.
#: Above the rank capture's own 1 MiB cut on the nodes (runs/tail.py), so a launch never sees it.
MAX_LINE_CHARS = 2 << 20
#: at most this many characters of a command's output are kept for its Result when ``keep`` is set
MAX_TAIL_CHARS = 1 << 20


class BlockHandler:
    """An ``on_line`` handler that also takes many complete lines in one call.

    Transports hand ``block`` every complete line one read brought in (text ending with a newline,
    ``\r\n`` turned into ``\n``), so a fast stream (a training log at 100k lines/s) costs Python work
    per read, not per line. Calling the handler with one line still works (``block`` of that line).
    A line longer than :data:`MAX_LINE_CHARS` arrives through ``piece``, in parts without a newline.
    """

    def __call__(self, stream: Stream, line: str) -> None:
        self.block(stream, line + "\n")

    def block(self, stream: Stream, text: str) -> None:
        raise NotImplementedError

    def piece(self, stream: Stream, text: str) -> None:
        """A part of a line longer than :data:`MAX_LINE_CHARS` (no newline; the line goes on): shown
        as a line of its own. Handlers that keep the exact text (a log) override this."""
        self.block(stream, text + "\n")


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
    """Turns a byte stream into text lines as they complete, in time linear in the input.

    Decodes UTF-8 incrementally (a multi-byte character split across reads stays whole) and replaces
    invalid bytes rather than failing: a training log with one bad byte must keep streaming. Lines end
    at ``\n`` only (``\r\n`` too, its ``\r`` dropped); a line longer than ``max_line`` characters is
    handed on in pieces of that size (``BlockHandler.piece``, or ``on_line`` per piece), so memory for
    a line in the making is bounded too. ``keep``: the Result keeps only the last ``keep`` lines (at
    most :data:`MAX_TAIL_CHARS` characters); None keeps everything.
    """

    stream: Stream
    on_line: OnLine | None
    keep: int | None = None
    max_line: int = MAX_LINE_CHARS
    _decoder: codecs.IncrementalDecoder = field(
        default_factory=lambda: codecs.getincrementaldecoder("utf-8")(errors="replace")
    )
    _partial: list[str] = field(default_factory=list)  # the line in the making, in reads
    _partial_chars: int = 0
    _chunks: list[str] = field(default_factory=list)  # keep None: everything
    _tail: deque[tuple[str, int]] = field(default_factory=deque)  # keep: (text, lines in it)
    _tail_lines: int = 0
    _tail_chars: int = 0
    _block: Callable[[Stream, str], None] | None = field(default=None, init=False, repr=False)
    _piece: Callable[[Stream, str], None] | None = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        if isinstance(self.on_line, BlockHandler):
            self._block, self._piece = self.on_line.block, self.on_line.piece

    def feed(self, data: bytes) -> None:
        text = self._decoder.decode(data)
        if text:
            self._take(text)

    def close(self) -> None:
        text = self._decoder.decode(b"", final=True)
        if text:
            self._take(text)
        rest = "".join(self._partial)
        self._partial, self._partial_chars = [], 0
        if rest:  # the command ended: its last line without a newline is final
            if self.keep is not None:
                self._keep_tail(rest, 1)
            if self._block is not None:
                self._block(self.stream, rest.replace("\r\n", "\n").removesuffix("\r") + "\n")
            elif self.on_line is not None:
                self.on_line(self.stream, rest.removesuffix("\r"))

    def _take(self, text: str) -> None:
        if self.keep is None:
            self._chunks.append(text)
            if self.on_line is None:
                return  # nobody reads lines: the text is all
        # Only the new text is searched, and the line in the making is joined once, when it ends:
        # each character is looked at a bounded number of times, however the reads cut the lines.
        cut = text.rfind("\n") + 1
        if not cut:
            self._partial.append(text)
            self._partial_chars += len(text)
            if self._partial_chars > self.max_line:
                self._cut()
            return
        done = "".join(self._partial) + text[:cut] if self._partial else text[:cut]
        rest = text[cut:]
        self._partial, self._partial_chars = ([rest], len(rest)) if rest else ([], 0)
        first = done.find("\n") + 1
        if first - 1 > self.max_line:  # the line in the making ended long: its pieces, then its end
            self._long(done[:first])
            done = done[first:]
        if len(done) - 1 > self.max_line:  # a read longer than a line may be: look at each line
            self._scan(done)
        elif done:
            self._lines(done)
        if self._partial_chars > self.max_line:
            self._cut()

    def _scan(self, done: str) -> None:
        """Complete lines, any of which may be longer than ``max_line``."""
        start = begin = 0
        while start < len(done):
            end = done.index("\n", start) + 1
            if end - 1 - start > self.max_line:
                if begin < start:
                    self._lines(done[begin:start])
                self._long(done[start:end])
                begin = end
            start = end
        if begin < len(done):
            self._lines(done[begin:])

    def _lines(self, done: str) -> None:
        """Complete lines (``done`` ends with a newline)."""
        if self.keep is not None:
            self._keep_tail(done, done.count("\n"))
        if self._block is not None:
            self._block(self.stream, done.replace("\r\n", "\n") if "\r" in done else done)
        elif self.on_line is not None:
            for line in done.split("\n")[:-1]:
                self.on_line(self.stream, line.removesuffix("\r"))

    def _long(self, line: str) -> None:
        """One line (with its newline) over ``max_line`` characters: its pieces, then its end."""
        while len(line) - 1 > self.max_line:
            self._hand_piece(line[: self.max_line])
            line = line[self.max_line :]
        self._lines(line)

    def _cut(self) -> None:
        """The line in the making is over ``max_line``: hand on its whole pieces, keeping 1 to
        ``max_line`` characters (a line is cut at the same places however the reads fell, and a
        last ``\r``, which may start a ``\r\n``, is never handed on alone)."""
        text = "".join(self._partial)
        handed = (len(text) - 1) // self.max_line * self.max_line
        for start in range(0, handed, self.max_line):
            self._hand_piece(text[start : start + self.max_line])
        rest = text[handed:]
        self._partial, self._partial_chars = [rest], len(rest)

    def _hand_piece(self, piece: str) -> None:
        if self.keep is not None:
            self._keep_tail(piece, 1)
        if self._piece is not None:
            self._piece(self.stream, piece)
        elif self.on_line is not None:
            self.on_line(self.stream, piece)

    def _keep_tail(self, text: str, lines: int) -> None:
        """Keep what the last ``keep`` lines (and :data:`MAX_TAIL_CHARS`) need, drop older text."""
        self._tail.append((text, lines))
        self._tail_lines += lines
        self._tail_chars += len(text)
        keep = max(self.keep or 0, 1)
        while len(self._tail) > 1:
            oldest, count = self._tail[0]
            if self._tail_lines - count < keep and self._tail_chars - len(oldest) < MAX_TAIL_CHARS:
                break
            self._tail.popleft()
            self._tail_lines -= count
            self._tail_chars -= len(oldest)

    @property
    def text(self) -> str:
        """What the Result keeps: everything, or (``keep``) the last ``keep`` lines (a piece of a long
        line counts as a line, as it is shown), at most :data:`MAX_TAIL_CHARS` characters of them."""
        if self.keep is None:
            return "".join(self._chunks)
        need = self.keep
        parts: list[str] = []
        if self._partial and need > 0:
            parts.append("".join(self._partial))
            need -= 1
        for text, lines in reversed(self._tail):
            if need <= 0:
                break
            if lines > need:  # a block of lines: its last ``need``
                start = len(text) - 1
                for _ in range(need):
                    start = text.rfind("\n", 0, start)
                text = text[start + 1 :]
                lines = need
            parts.append(text)
            need -= lines
        return "".join(reversed(parts))[-MAX_TAIL_CHARS:]


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
    #: the address a direct connection reached (the socket's peer), once connected; None for a local
    #: node, a connection through a proxy (its peer is the proxy) and transports that do not know it
    peer_address: str | None = None
    #: seconds a new connection may take before it fails (None: the transport never dials)
    connect_timeout: float | None = None
    #: set by the owner of this transport (the session): wraps every new connection attempt, which
    #: it may refuse at once (a node already found unreachable) or announce while it waits
    dial_watch: Callable[[], AbstractContextManager[None]] | None = None
    #: set while a caller dials again on purpose (a follow waiting for a node to come back): the
    #: owner's memo of a node that never answered (refused at once) does not apply then
    retrying: bool = False

    def __init__(self, node_name: str, platform: Platform) -> None:
        self.node_name = node_name
        self.platform = platform
        #: host keys trusted on first use while connecting ("host type SHA256:..."), for the report
        self.recorded_host_keys: list[str] = []
        #: what a user should know about how this node is reached, each said once (e.g. files go
        #: through the shell because the SSH server has no sftp subsystem), for ``-v`` and ``check``
        self.notes: list[str] = []

    @property
    def connected(self) -> bool:
        """Whether :meth:`connect` would return at once, dialling nothing (False where unknown)."""
        return False

    @abstractmethod
    def connect(self) -> None:
        """Open the connection (idempotent). Raises ``ConnectError`` subclasses. A transport that
        dials runs each new attempt inside :meth:`dialling`."""

    def dialling(self) -> AbstractContextManager[None]:
        """Around one new connection attempt: the owner's :attr:`dial_watch`, else nothing."""
        return self.dial_watch() if self.dial_watch is not None else nullcontext()

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

    def run_brief(self, command: str, *, timeout: float) -> Result:
        """Run ``command``, one that ends at once by itself and starts nothing that could outlive
        it (a line written into a file): transports that surround every command with a watcher
        (ssh: ``stop_on_hangup``) leave that out here (:meth:`run_brief_raw`), two processes fewer on
        the node."""
        log.info("%s: run %s", self.node_name, command[:120])
        result = self.run_brief_raw(self.platform.wrap(command), timeout=timeout)
        log.info("%s: exit %s after %.2fs", self.node_name, result.exit_code, result.duration)
        result.command = command
        return result

    def run_brief_raw(self, script: str, *, timeout: float) -> Result:
        return self.run_raw(script, timeout=timeout)

    @property
    def reaches_windows_host(self) -> bool:
        """Whether :meth:`run_windows` can run PowerShell on the Windows machine of this node."""
        return self.platform.host_shell is self.platform

    def run_windows(
        self,
        command: str,
        *,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        timeout: float | None = None,
        on_line: OnLine | None = None,
        keep_lines: int | None = None,
        become: bool = False,
    ) -> Result:
        """Run PowerShell ``command`` on the Windows machine itself: ``run`` where the node's own shell
        is that machine's (``platform.host_shell``), else only a transport that reaches the Windows
        side of a WSL node can (WinRM); the others raise, naming what to do instead."""
        if self.platform.host_shell is self.platform:
            return self.run(
                command,
                env=env,
                cwd=cwd,
                timeout=timeout,
                on_line=on_line,
                become=become,
                keep_lines=keep_lines,
            )
        from orchestrator.errors import CommandFailedError

        raise CommandFailedError(
            f"this needs PowerShell on the Windows host; this node's commands run in {self.platform.name} "
            f"over {self.kind}, which cannot reach it",
            node=self.node_name,
            hint="reach the node over WinRM (connection: winrm), or run the step's --dry-run script in an "
            "administrator PowerShell on the node",
        )

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
