"""Controller-side copies of node output: nothing a node printed is lost when the terminal scrolls;
each node's output handler (the run log, the live page, a terminal's ``[node:rank]`` labels)."""

from __future__ import annotations

import os
import re
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Protocol

from orchestrator import records
from orchestrator.safefiles import NOFOLLOW, private_dirs
from orchestrator.transports.base import BlockHandler

try:
    import fcntl
except ImportError:  # not on Windows: no locks there, nothing else changes
    fcntl = None  # type: ignore[assignment]


def state_dir() -> Path:
    """``$XDG_STATE_HOME/cluster-bootstrap`` (default ``~/.local/state/cluster-bootstrap``)."""
    base = os.environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state")
    return Path(base) / "cluster-bootstrap"


_UNSAFE = re.compile(r"[^A-Za-z0-9._-]")

#: RunLog.commit's answers
REPLACED = "replaced"  # the copy is now what was read
KEPT = "kept"  # the copy was left as it was (the part was dropped)
BUSY = "busy"  # left as it was: a running `launch` writes it (or another `logs` wrote the part)


def _try_lock(fd: int) -> bool:
    """An exclusive flock on ``fd`` without waiting; True when it is ours (always where there are
    no locks)."""
    if fcntl is None:
        return True
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


class RunLog:
    """One file per node under ``<dir>/<node>.log``, appended as output arrives (thread-safe).

    Every block is one ``write`` to the file, unbuffered: ``tail -f`` shows the lines while the run
    goes, and a crash or ``kill -9`` of the controller loses nothing already shown. While it
    is open, each file holds a shared ``flock``: a `logs` in another terminal sees that a run is
    still writing it and leaves it alone.

    ``staged`` (`bootstrap logs`, which reads each node's log again from its start): blocks go to
    ``<node>.log.part`` (held with an exclusive ``flock``: a second `logs` of the same run writes no
    part of its own), and ``<node>.log`` changes only in commit(), when the node's read succeeded:
    a failed read (the node gone, reinstalled, its run directory moved) never costs the copy here.
    """

    def __init__(self, directory: Path, *, staged: bool = False) -> None:
        self.directory = directory
        self.staged = staged
        self._files: dict[str, int] = {}  # node: open file descriptor
        self._done: set[str] = set()  # staged: committed, discarded or busy: later blocks are dropped
        self._busy: set[str] = set()  # staged: another `logs` holds the part
        self._lock = threading.Lock()

    def path(self, node: str) -> Path:
        return self.directory / f"{_UNSAFE.sub('_', node)}.log"

    def part_path(self, node: str) -> Path:
        return self.path(node).with_name(self.path(node).name + ".part")

    def write(self, node: str, line: str) -> None:
        self.write_block(node, line + "\n")

    def write_block(self, node: str, text: str) -> None:
        """Append ``text`` (complete lines, or a piece of a very long one) to the node's file: written
        through at once (no buffer here: a block is a read's worth of lines, one system call)."""
        data = text.encode("utf-8", errors="replace")
        with self._lock:
            fd = self._files.get(node)
            if fd is None:
                if node in self._done:
                    return
                fd = self._open(node)
                if fd is None:
                    return
            written = os.write(fd, data)
            while written < len(data):  # a regular file takes it all unless a signal cut in
                written += os.write(fd, data[written:])

    def _open(self, node: str) -> int | None:
        if not self.staged:
            # node output can hold anything (tokens printed by a script): owner-only, like ~/.ssh
            private_dirs(self.directory)
            fd = os.open(self.path(node), os.O_WRONLY | os.O_CREAT | os.O_APPEND | NOFOLLOW, 0o600)
            if fcntl is not None:
                fcntl.flock(fd, fcntl.LOCK_SH)  # "being written": a `logs` does not replace it
        else:
            part = self._open_part(node)
            if part is None:
                self._busy.add(node)
                self._done.add(node)
                return None
            fd = part
        self._files[node] = fd
        return fd

    def _open_part(self, node: str) -> int | None:
        """The node's part file, empty and locked by us; None when another `logs` holds it."""
        private_dirs(self.directory)
        part = self.part_path(node)
        while True:
            fd = os.open(part, os.O_WRONLY | os.O_CREAT | os.O_APPEND | NOFOLLOW, 0o600)
            if not _try_lock(fd):
                os.close(fd)
                return None
            try:
                same = os.stat(part).st_ino == os.fstat(fd).st_ino
            except FileNotFoundError:
                same = False
            if same:
                os.ftruncate(fd, 0)  # what a killed `logs` left there
                return fd
            os.close(fd)  # the one we locked was renamed over the copy meanwhile: open the new one

    def busy(self, node: str) -> bool:
        """Staged: another `logs` of this run was writing the node's part: this one wrote none."""
        return node in self._busy

    def commit(self, node: str, *, only_if_longer: bool = False) -> str:
        """Staged: make what was read the node's copy (``<node>.log.part`` renamed over
        ``<node>.log``; a read of an empty log makes it empty). ``only_if_longer``: only when the
        part holds more bytes than the copy (a read from byte 0 that was cut short: of two prefixes
        of the same append-only log, the longer one), else the part is dropped.

        Returns REPLACED, KEPT, or BUSY (nothing changed: another `logs` held the part, or a running
        `launch` is writing the copy, which then stays the fuller one)."""
        with self._lock:
            if node in self._busy:
                return BUSY
            fd = self._files.pop(node, None)
            part = self.part_path(node)
            if fd is None and (only_if_longer or node in self._done):
                self._done.add(node)
                return KEPT  # nothing was read, or this node's copy was settled already
            self._done.add(node)
            if fd is None:  # nothing was read: an empty part, ours
                fd = self._open_part(node)
                if fd is None:
                    self._busy.add(node)
                    return BUSY
            try:
                final = self.path(node)
                try:
                    held = os.open(final, os.O_RDONLY | NOFOLLOW)
                except FileNotFoundError:
                    held = None
                try:
                    if held is not None and not _try_lock(held):
                        part.unlink(missing_ok=True)
                        return BUSY
                    if only_if_longer and held is not None and os.fstat(held).st_size >= os.fstat(fd).st_size:
                        part.unlink(missing_ok=True)
                        return KEPT
                    os.replace(part, final)  # under our lock on the part: no other `logs` truncates it
                    return REPLACED
                finally:
                    if held is not None:
                        os.close(held)
            finally:
                os.close(fd)

    def settle(self, nodes: Iterable[str], how: Mapping[str, str]) -> dict[str, str]:
        """Staged: each node's copy once its read is over. ``how[node]`` is "replace" (read from the
        start to the end: it becomes the copy), "longer" (cut short: it becomes the copy only when
        longer) or "keep" (the read failed: the copy stays as it was). Returns per node "written",
        "kept", "busy" (another `logs` or a running `launch` writes it: left as it was) or "none"
        (the read failed and there is no copy)."""
        copies: dict[str, str] = {}
        for node in nodes:
            existed = self.path(node).exists()
            if self.busy(node):
                state = BUSY
            elif how.get(node) == "keep":
                self.discard(node)
                state = KEPT
            else:
                state = self.commit(node, only_if_longer=how.get(node) == "longer")
            copies[node] = {REPLACED: "written", BUSY: "busy"}.get(state, "kept" if existed else "none")
        return copies

    def discard(self, node: str) -> None:
        """Staged: drop what was read (the copy stays as it was)."""
        with self._lock:
            self._done.add(node)
            fd = self._files.pop(node, None)
            if fd is not None:
                self.part_path(node).unlink(missing_ok=True)  # ours: we hold its lock
                os.close(fd)

    def close(self) -> None:
        """Close every file; staged: parts not committed are dropped."""
        with self._lock:
            # each file leaves the table before it is closed: a close cut short (a second Ctrl-C)
            # and called again closes each once (it closed them again: EBADF, a traceback)
            while self._files:
                node, fd = self._files.popitem()
                if self.staged:
                    self._done.add(node)
                    self.part_path(node).unlink(missing_ok=True)
                os.close(fd)


# -- a node's output as it arrives: the run log, the live page, and a terminal's labelled lines ------


class LineSink(Protocol):
    """Where node output is shown as labelled lines (the CLI's ``LinePrinter``)."""

    def head(self, node: str, rank: int | None) -> str:
        """``[node:rank] `` (``[node] `` for the launcher's own lines)."""
        ...

    def label(self, node: str, *, stderr: bool = False) -> str:
        """``[node] `` of a command's output, stderr lines marked."""
        ...

    def write_lines(self, head: str, text: str, rewrite: Callable[[str], str] | None = None) -> None:
        """A node's complete lines, each shown after ``head``; ``rewrite`` gets the prefixed block."""
        ...


_RANK_TAG = re.compile(r"\[default(\d+)\]:")


class RankedOutput(BlockHandler):
    """One node's training output: into the controller's log as received, and onto the terminal
    (neutralised) with each line's ``[defaultN]:`` tag (the node's rank capture) replaced by
    ``[node:GLOBAL_RANK]`` (``[node]`` for the launcher's own lines).

    Works on whole blocks of lines with string operations that run in C: a node printing 100k
    lines/s costs a few replaces per read, not a Python call per line.
    """

    def __init__(
        self,
        node: str,
        log: RunLog | None,
        printer: LineSink | None,
        *,
        first_rank: int = 0,
        nproc: int = 0,
        on_block: Callable[[str, str], None] | None = None,
        sample_nonce: str = "",
    ) -> None:
        self.node = node
        self._samples = sample_nonce  # the node's sample records: for the page, not the terminal
        self.log = log
        self.printer = printer
        self.first_rank = first_rank
        self.on_block = on_block
        self._head = printer.head(node, None) if printer else ""
        heads = [printer.head(node, first_rank + r) for r in range(nproc)] if printer else []
        self._tags = [(self._head + f"[default{r}]:", head) for r, head in enumerate(heads)]
        self._other = re.compile("^" + re.escape(self._head) + _RANK_TAG.pattern, re.M)
        self._long: str | None = None  # the label of the line being shown in pieces: its first one's
        #: when a rank of this node last printed (time.monotonic(), time.time()) and its last line
        #: (runs/stall.py: a run whose ranks all went quiet is said to be maybe hung); None: not yet
        self.heard: tuple[float, float, str] | None = None
        self._progress = records.MARK + sample_nonce + " progress " if sample_nonce else "\0"

    def block(self, stream: str, text: str) -> None:
        if self.log is not None:
            self.log.write_block(self.node, text)  # the log keeps what the node sent
        if self.on_block is not None:
            self.on_block(self.node, text)
        if "[default" in text or self._progress in text:  # a rank's line or its bar's newest state
            self._heard(text)
        if self.printer is None:
            return
        if self._long is not None:  # the block starts with the end of a line shown in pieces
            end, text = text.split("\n", 1)
            self.printer.write_lines(self._long, end + "\n")
            self._long = None
        if records.mentions(text, self._samples):
            # samples are the page's; a bar a rank is redrawing with "\r" (no newline yet): shown
            # as that rank's line of the moment (the node sends its newest state every few seconds)
            found = records.decode(text, self._samples)
            text = records.plain(text, self._samples) + "".join(
                f"[default{r.text(0)}]:{r.text(1)}\n"
                for r in found
                if r.kind == "progress" and r.text(0).isdigit()
            )
        if "\r" in text:  # a line redrawn with "\r": what a terminal shows of it, its last state
            text = "\n".join(map(_last_state, text.split("\n")))
        if text:
            self.printer.write_lines(self._head, text, self._ranks if "[default" in text else None)

    def piece(self, stream: str, text: str) -> None:
        """A part of a very long line: logged as it came, otherwise a line like any other."""
        if self.log is not None:
            self.log.write_block(self.node, text)
        if self.on_block is not None:
            self.on_block(self.node, text + "\n")
        self._heard(text[:200])
        if self.printer is not None and self._long is not None:
            self.printer.write_lines(self._long, text + "\n")
        elif self.printer is not None:
            tag = _RANK_TAG.match(text)
            self._long = self.printer.head(self.node, self.first_rank + int(tag[1])) if tag else self._head
            self.printer.write_lines(self._long, text[tag.end() if tag else 0 :] + "\n")

    def _heard(self, text: str) -> None:
        last = ""
        for line in reversed(text.rstrip("\n").rsplit("\n", 8)):  # the newest rank line of the block
            if tag := _RANK_TAG.match(line):
                last = f"[{self.node}:{self.first_rank + int(tag[1])}] {_last_state(line)[tag.end() :]}"
                break
        if not last and self.heard is not None:
            last = self.heard[2]
        self.heard = (time.monotonic(), time.time(), last[:160])

    def _ranks(self, out: str) -> str:
        for tag, rank_head in self._tags:
            out = out.replace(tag, rank_head)
        if "[default" in out:  # a rank beyond nproc, or the tag inside a line: the slow way
            out = self._other.sub(self._rank_head, out)
        return out

    def _rank_head(self, match: re.Match[str]) -> str:
        assert self.printer is not None
        return self.printer.head(self.node, self.first_rank + int(match.group(1)))


def _last_state(line: str) -> str:
    """A line redrawn with "\r" as a terminal shows it: its rank's tag, then its last state (every
    byte stays in the logs; a lone "\r" cannot return to the start of the line and hide its label)."""
    if "\r" not in line:
        return line
    tag = _RANK_TAG.match(line)
    head = line[: tag.end()] if tag else ""
    states = [state for state in line[len(head) :].split("\r") if state]
    return head + (states[-1] if states else "")


def ranked_outputs(
    labels: Mapping[str, tuple[int, int]],
    log: RunLog | None,
    printer: LineSink | None,
    on_block: Callable[[str, str], None] | None,
    sample_nonce: str,
) -> dict[str, RankedOutput]:
    """A run's output handler per node (``labels``: its first global rank and its rank count), each
    writing ``log`` and ``printer`` and handing its blocks to ``on_block`` (the live page)."""
    return {
        name: RankedOutput(
            name, log, printer, first_rank=first, nproc=nproc, on_block=on_block, sample_nonce=sample_nonce
        )
        for name, (first, nproc) in labels.items()
    }


class PrefixedOutput(BlockHandler):
    """One node's command output (`bootstrap run`): into the controller's log as received, and onto
    the terminal (neutralised) as ``[node] line`` (stderr lines marked), a block of lines per write."""

    def __init__(self, node: str, log: RunLog | None, printer: LineSink | None) -> None:
        self.node = node
        self.log = log
        self.printer = printer

    def block(self, stream: str, text: str) -> None:
        if self.log is not None:
            self.log.write_block(self.node, text)  # the log keeps what the node sent
        if self.printer is None:
            return
        self.printer.write_lines(self.printer.label(self.node, stderr=stream == "stderr"), text)

    def piece(self, stream: str, text: str) -> None:
        """A part of a very long line: shown as a line with its label, logged as it came."""
        if self.log is not None:
            self.log.write_block(self.node, text)
        if self.printer is not None:
            self.printer.write_lines(self.printer.label(self.node, stderr=stream == "stderr"), text + "\n")
