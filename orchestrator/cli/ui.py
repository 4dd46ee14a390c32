"""Everything a human sees: progress while nodes work, streamed lines, summary tables, messages.

Colours and live displays only on terminals (rich detects pipes and honours NO_COLOR); ``--json``
prints a single JSON document on stdout and nothing else there.

Node text never reaches the operator's terminal raw (neutralise.py): every way out of this module
neutralises it, terminal or pipe. ``LinePrinter``'s write methods take the node's text and
neutralise it before adding prefixes (keeping SGR colour when the printer colours); the consoles
(``UI.out``, ``UI.err``) neutralise the text of everything they render (messages, tables, the
progress display), rich's own styling and cursor control aside. ``--json`` escapes control
characters itself (``\u001b``).
"""

from __future__ import annotations

import json
import os
import re
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import IO, Any

from rich.console import Console
from rich.live import Live
from rich.segment import Segment
from rich.table import Table
from rich.text import Text

from orchestrator import records
from orchestrator.cli.neutralise import neutralise
from orchestrator.executor import NodeEvent
from orchestrator.logs import RunLog
from orchestrator.transports.base import BlockHandler

# ANSI colours for node prefixes (raw escapes: streaming must stay cheap per line)
_PALETTE = ("36", "35", "32", "33", "34", "96", "95", "92", "93", "94")


class NeutralConsole(Console):
    """A rich console that neutralises the text of every segment it writes: a node's text inside a
    message, a table cell or the progress display cannot drive the terminal, whoever built the
    renderable. Rich's own styles (rendered from each segment's style, not its text) and its control
    segments (the live display's cursor moves) are left alone. Callers that pass node text still
    neutralise it first where it is measured (a table column's width, an ellipsis)."""

    # rich's one place where buffered segments become the text written out (a private method, but
    # the only such place; test_terminal_safety.py fails if a rich release stops calling it)
    def _render_buffer(self, buffer: Iterable[Segment]) -> str:
        return super()._render_buffer(
            segment if segment.control else Segment(neutralise(segment.text), segment.style)
            for segment in buffer
        )


class UI:
    def __init__(self, *, json_mode: bool = False, verbose: int = 0, color: bool | None = None) -> None:
        self.json_mode = json_mode
        self.verbose = verbose
        no_color = color is False or "NO_COLOR" in os.environ
        self.out = NeutralConsole(file=sys.stdout, highlight=False, no_color=no_color, soft_wrap=True)
        self.err = NeutralConsole(file=sys.stderr, highlight=False, no_color=no_color, soft_wrap=True)
        for console in (self.out, self.err):
            if not console.is_terminal:
                console.width = 200  # piped: one wide table row per node beats 80-column wrapping
        self.color_out = self.out.is_terminal and not no_color
        self.live = self.err.is_terminal and not json_mode

    # -- messages (stderr) ----------------------------------------------------------------------

    # messages may quote node text (an error's output, the last lines of a failed node): neutralised
    # before rich sees it (rich's Text silently drops \r and \b, which should show)

    def note(self, message: str) -> None:
        self.err.print(Text(neutralise(message), style="dim"))

    def warn(self, message: str) -> None:
        self.err.print(Text("warning: ", style="yellow bold") + Text(neutralise(message)))

    def error(self, message: str) -> None:
        self.err.print(Text("error: ", style="red bold") + Text(neutralise(message)))

    def info(self, message: str) -> None:
        self.err.print(Text(neutralise(message)))

    # -- results (stdout) -----------------------------------------------------------------------

    #: when a list, JSON documents are collected here instead of printed (the main pipeline prints
    #: one document made of its phases' documents)
    collected: list[Any] | None = None

    def print_json(self, doc: Any) -> None:
        if self.collected is not None:
            self.collected.append(doc)
            return
        # ensure_ascii: every control character a node printed travels escaped (\u001b), so the
        # document carries node text exactly and a `cat` of it later cannot drive a terminal
        sys.stdout.write(json.dumps(doc, indent=2, sort_keys=False, default=str, ensure_ascii=True) + "\n")
        sys.stdout.flush()

    def print_table(self, table: Table) -> None:
        self.out.print(table)

    def print_text(self, text: str) -> None:
        self.out.print(Text(neutralise(text)))

    # -- progress -------------------------------------------------------------------------------

    @contextmanager
    def progress(self, nodes: Sequence[str], step: str) -> Iterator[Callable[[NodeEvent], None]]:
        """A per-node progress display; yields the executor's event callback."""
        with self.board(nodes, step) as board:
            yield board.on_event

    @contextmanager
    def board(self, nodes: Sequence[str], step: str, *, interval: float | None = None) -> Iterator[Board]:
        """A per-node progress display for long work: the executor's events (``board.on_event``) and
        what each node is doing now (``board.update(node, activity, detail)``: "installing torch",
        "1.2 GB downloaded"). On a terminal, a live table (state, elapsed time, activity); piped, a
        plain line per node every ``interval`` seconds while it works
        (``[node2] installing torch (1.2 GB downloaded, 45 s)``; default: $BOOTSTRAP_PROGRESS_INTERVAL,
        else 10), and one line as each node finishes."""
        board = Board(self, nodes, step, progress_interval() if interval is None else interval)
        if self.live:
            with Live(
                board.render(),
                console=self.err,
                transient=True,
                refresh_per_second=8,
                get_renderable=board.render,
            ):
                yield board
            return
        if self.json_mode:
            yield board
            return
        ticker = threading.Thread(target=board.tick_until_closed, name=f"progress-{step}", daemon=True)
        ticker.start()
        try:
            yield board
        finally:
            board.close()
            ticker.join(timeout=5)

    # -- streaming ------------------------------------------------------------------------------

    def line_printer(self, nodes: Sequence[str], stream: IO[str] | None = None) -> LinePrinter:
        return LinePrinter(nodes, stream or sys.stdout, color=self.color_out)


def progress_interval() -> float:
    """Seconds between piped progress lines: $BOOTSTRAP_PROGRESS_INTERVAL, else 10."""
    try:
        return max(float(os.environ.get("BOOTSTRAP_PROGRESS_INTERVAL", "") or 10), 0.1)
    except ValueError:
        return 10.0


_STATE_STYLES = {"running": "cyan", "no answer": "yellow", "ok": "green", "failed": "red"}


class Board:
    """Each node's state in one step, shared by the executor's threads, the nodes' workers (what they
    are doing) and the display: a live table on terminals, periodic lines when piped."""

    def __init__(self, ui: UI, nodes: Sequence[str], step: str, interval: float) -> None:
        self.ui = ui
        self.nodes = list(nodes)
        self.step = step
        self.interval = interval
        self._lock = threading.Lock()
        self._status = {n: "waiting" for n in nodes}
        self._activity = {n: "" for n in nodes}
        self._detail = {n: "" for n in nodes}
        self._took: dict[str, float] = {}
        self._started: dict[str, float] = {}
        self._printed: dict[str, float] = {}  # piped: when each node's last progress line was written
        self._closed = threading.Event()

    # -- input (any thread) ---------------------------------------------------------------------

    def on_event(self, event: NodeEvent) -> None:
        with self._lock:
            if event.kind == "start":
                # a node's step may be several fan-outs (sync: check, then build): each phase's
                # first piped line comes an interval after that phase started
                self._started[event.node] = time.monotonic()
                self._printed.pop(event.node, None)
                self._status[event.node] = "running"
                self._activity[event.node] = event.step
                self._detail[event.node] = ""
                return
            if event.kind == "waiting":  # the session printed the line: the board shows the state
                if self._status.get(event.node) == "running":
                    self._status[event.node] = "no answer"
                    self._activity[event.node] = neutralise(event.detail)
                return
            took = time.monotonic() - self._started.get(event.node, time.monotonic())
            status = "ok" if event.kind == "done" else "failed"
            self._status[event.node] = status
            self._activity[event.node] = neutralise(event.detail.splitlines()[0]) if event.detail else ""
            self._detail[event.node] = ""
            self._took[event.node] = took
        if not self.ui.live and not self.ui.json_mode:
            mark = "ok" if status == "ok" else "FAILED"
            self.ui.err.print(Text(f"{event.node}: {event.step} {mark} ({took:.2f}s)"), highlight=False)

    def update(self, node: str, activity: str, detail: str = "") -> None:
        """What ``node`` is doing now (node text: neutralised before it is shown)."""
        with self._lock:
            if self._status.get(node) in ("ok", "failed"):
                return
            self._activity[node] = neutralise(activity)
            self._detail[node] = neutralise(detail)

    # -- output ---------------------------------------------------------------------------------

    def line(self, node: str, now: float | None = None) -> str:
        """``[node] activity (detail, 45 s)``: one running node, as a piped line shows it."""
        with self._lock:
            elapsed = (now or time.monotonic()) - self._started.get(node, now or time.monotonic())
            activity, detail = self._activity.get(node) or self.step, self._detail.get(node, "")
        return f"[{node}] {activity} ({detail + ', ' if detail else ''}{elapsed:.0f} s)"

    def due(self, now: float) -> list[str]:
        """Running nodes whose next piped line is due: working for ``interval`` seconds or more, and
        ``interval`` seconds after their last line (quick work prints nothing but its end)."""
        out = []
        with self._lock:
            for node in self.nodes:
                if self._status[node] not in ("running", "no answer"):
                    continue
                last = self._printed.get(node, self._started.get(node, now))
                if now - last >= self.interval:
                    self._printed[node] = now
                    out.append(node)
        return out

    def tick_until_closed(self) -> None:
        while not self._closed.wait(min(1.0, self.interval / 2)):
            now = time.monotonic()
            for node in self.due(now):
                self.ui.err.print(Text(self.line(node, now)), highlight=False)

    def close(self) -> None:
        self._closed.set()

    def render(self) -> Table:
        table = Table(box=None, show_header=False, pad_edge=False)
        table.add_column("node", style="bold")
        table.add_column("state")
        table.add_column("time", justify="right", style="dim")
        table.add_column("detail", overflow="ellipsis", no_wrap=True)
        now = time.monotonic()
        with self._lock:
            for name in self.nodes:
                status = self._status[name]
                style = _STATE_STYLES.get(status, "dim")
                done = status in ("ok", "failed")
                shown = self._took.get(name, 0.0) if done else now - self._started.get(name, now)
                detail = self._activity[name] + (f" ({self._detail[name]})" if self._detail[name] else "")
                table.add_row(Text(name), Text(status, style=style), f"{shown:.1f}s", Text(detail))
        return table


class LinePrinter:
    """Writes ``[node] line`` for every node's output line, as it arrives, from any thread.

    Every write method takes the node's own text and neutralises it (neutralise.py) before the
    prefixes are added: there is no way to print node text through it raw. SGR colour in that text
    is kept when the printer colours (a terminal, colours allowed), else removed. Prefixes start
    with a reset, so no attribute a node left on can dress up the next line's label.
    """

    def __init__(self, nodes: Sequence[str], stream: IO[str], *, color: bool) -> None:
        width = max((len(n) for n in nodes), default=0)
        self.stream = stream
        self.color = color
        self._lock = threading.Lock()
        self.prefixes: dict[str, str] = {}
        self._colours: dict[str, str] = {}
        for i, name in enumerate(nodes):
            label = f"[{name}]".ljust(width + 2)
            if color:
                self._colours[name] = _PALETTE[i % len(_PALETTE)]
                label = f"\x1b[0;{self._colours[name]}m{label}\x1b[0m"
            self.prefixes[name] = label + " "
        self.err_mark = "\x1b[31m!\x1b[0m " if color else ""
        self._heads: dict[tuple[str, int | None], str] = {}

    def head(self, node: str, rank: int | None) -> str:
        """``[node:rank] `` in the node's colour (``[node] `` for the launcher's own lines)."""
        head = self._heads.get((node, rank))
        if head is None:  # built once per node and rank
            label = f"[{node}:{rank}]" if rank is not None else f"[{node}]"
            colour = self._colours.get(node)
            head = f"\x1b[0;{colour}m{label}\x1b[0m " if colour else label + " "
            self._heads[(node, rank)] = head
        return head

    def visible(self, text: str) -> str:
        """Node text as this printer shows it (neutralised; colour kept when the printer colours)."""
        return neutralise(text, keep_colour=self.color)

    def write_rank(self, node: str, rank: int | None, line: str) -> None:
        """``[node:rank] line`` in the node's colour (``[node]`` for the launcher's own lines)."""
        self._emit(self.head(node, rank) + self.visible(line) + "\n")

    def write(self, node: str, line: str, *, stderr: bool = False) -> None:
        self._emit(self.prefixes[node] + (self.err_mark if stderr else "") + self.visible(line) + "\n")

    def write_lines(self, head: str, text: str, rewrite: Callable[[str], str] | None = None) -> None:
        """A node's complete lines (``text`` ends with a newline), each shown as ``head line``, in
        one write; ``rewrite`` gets the prefixed block before it is written (rank labels)."""
        text = self.visible(text)
        out = head + text[:-1].replace("\n", "\n" + head) + "\n"
        self._emit(rewrite(out) if rewrite is not None else out)

    def _emit(self, text: str) -> None:
        """Already neutralised, already prefixed lines, written whole (lines of two nodes never
        interleave)."""
        with self._lock:
            self.stream.write(text)
            self.stream.flush()


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
        printer: LinePrinter | None,
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

    def block(self, stream: str, text: str) -> None:
        if self.log is not None:
            self.log.write_block(self.node, text)  # the log keeps what the node sent
        if self.on_block is not None:
            self.on_block(self.node, text)
        if self.printer is None:
            return
        if self._long is not None:  # the block starts with the end of a line shown in pieces
            end, text = text.split("\n", 1)
            self.printer.write_lines(self._long, end + "\n")
            self._long = None
        if records.mentions(text, self._samples):
            text = records.plain(text, self._samples)
        if text:
            self.printer.write_lines(self._head, text, self._ranks if "[default" in text else None)

    def piece(self, stream: str, text: str) -> None:
        """A part of a very long line: logged as it came, otherwise a line like any other."""
        if self.log is not None:
            self.log.write_block(self.node, text)
        if self.on_block is not None:
            self.on_block(self.node, text + "\n")
        if self.printer is not None and self._long is not None:
            self.printer.write_lines(self._long, text + "\n")
        elif self.printer is not None:
            tag = _RANK_TAG.match(text)
            self._long = self.printer.head(self.node, self.first_rank + int(tag[1])) if tag else self._head
            self.printer.write_lines(self._long, text[tag.end() if tag else 0 :] + "\n")

    def _ranks(self, out: str) -> str:
        for tag, rank_head in self._tags:
            out = out.replace(tag, rank_head)
        if "[default" in out:  # a rank beyond nproc, or the tag inside a line: the slow way
            out = self._other.sub(self._rank_head, out)
        return out

    def _rank_head(self, match: re.Match[str]) -> str:
        assert self.printer is not None
        return self.printer.head(self.node, self.first_rank + int(match.group(1)))


def ranked_outputs(
    labels: Mapping[str, tuple[int, int]],
    log: RunLog | None,
    printer: LinePrinter | None,
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

    def __init__(self, node: str, log: RunLog | None, printer: LinePrinter | None) -> None:
        self.node = node
        self.log = log
        self.printer = printer

    def block(self, stream: str, text: str) -> None:
        if self.log is not None:
            self.log.write_block(self.node, text)  # the log keeps what the node sent
        if self.printer is None:
            return
        head = self.printer.prefixes[self.node] + (self.printer.err_mark if stream == "stderr" else "")
        self.printer.write_lines(head, text)

    def piece(self, stream: str, text: str) -> None:
        """A part of a very long line: shown as a line with its label, logged as it came."""
        if self.log is not None:
            self.log.write_block(self.node, text)
        if self.printer is not None:
            head = self.printer.prefixes[self.node] + (self.printer.err_mark if stream == "stderr" else "")
            self.printer.write_lines(head, text + "\n")
