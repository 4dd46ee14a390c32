"""Everything a human sees: progress while nodes work, streamed lines, summary tables, messages.

Colours and live displays only on terminals (rich detects pipes and honours NO_COLOR); ``--json``
prints a single JSON document on stdout and nothing else there.

Node text never reaches the operator's terminal raw (orchestrator/neutralise.py): every way out of this module
neutralises it, terminal or pipe. ``LinePrinter``'s write methods take the node's text and
neutralise it before adding prefixes (keeping SGR colour when the printer colours); the consoles
(``UI.out``, ``UI.err``) neutralise the text of everything they render (messages, tables, the
progress display), rich's own styling and cursor control aside. ``--json`` escapes control
characters itself (``\u001b``).
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from typing import IO, Any

from rich.console import Console
from rich.live import Live
from rich.segment import Segment
from rich.table import Table
from rich.text import Text

from orchestrator.executor import NodeEvent
from orchestrator.neutralise import neutralise

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

    Every write method takes the node's own text and neutralises it (orchestrator/neutralise.py) before the
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

    def label(self, node: str, *, stderr: bool = False) -> str:
        """``[node] `` padded to the longest name, stderr lines marked (``!`` in red)."""
        return self.prefixes[node] + (self.err_mark if stderr else "")

    def write(self, node: str, line: str, *, stderr: bool = False) -> None:
        self._emit(self.label(node, stderr=stderr) + self.visible(line) + "\n")

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
