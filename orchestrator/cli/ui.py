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
import re
import sys
import threading
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
from orchestrator.progress import NodeProgress, progress_interval

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
        #: every `` `bootstrap CMD` `` a message (or bootstrap's own line on a node's stream)
        #: suggests, given the options this command had (``-i``...): pasted, it acts on the same
        #: cluster, not on the embedded local inventory (runs/next_command.with_user_options)
        self.commands: Callable[[str], str] = lambda text: text

    # -- messages (stderr) ----------------------------------------------------------------------

    # messages may quote node text (an error's output, the last lines of a failed node): neutralised
    # before rich sees it (rich's Text silently drops \r and \b, which should show)

    def note(self, message: str) -> None:
        self.err.print(Text(neutralise(self.commands(message)), style="dim"))

    def warn(self, message: str) -> None:
        self.err.print(Text("warning: ", style="yellow bold") + Text(neutralise(self.commands(message))))

    def error(self, message: str) -> None:
        self.err.print(Text("error: ", style="red bold") + Text(neutralise(self.commands(message))))

    def info(self, message: str) -> None:
        self.err.print(Text(neutralise(self.commands(message))))

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
        "1.1 GiB downloaded"). On a terminal, a live table (state, elapsed time, activity); piped, a
        plain line per node every ``interval`` seconds while it works
        (``[node2] installing torch (1.1 GiB downloaded, 45 s)``; default: $BOOTSTRAP_PROGRESS_INTERVAL,
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
        with board.ticking(lambda line: self.err.print(Text(line), highlight=False)):
            yield board

    # -- streaming ------------------------------------------------------------------------------

    def line_printer(self, nodes: Sequence[str], stream: IO[str] | None = None) -> LinePrinter:
        return LinePrinter(nodes, stream or sys.stdout, color=self.color_out, commands=self.commands)


_STATE_STYLES = {"running": "cyan", "no answer": "yellow", "ok": "green", "failed": "red"}


class Board(NodeProgress):
    """Each node's progress in one step (orchestrator/progress.py), shown: a live table on terminals,
    periodic lines when piped."""

    def __init__(self, ui: UI, nodes: Sequence[str], step: str, interval: float) -> None:
        super().__init__(nodes, step, interval)
        self.ui = ui

    def on_event(self, event: NodeEvent) -> None:
        ended = super().on_event(event)
        if ended is not None and not self.ui.live and not self.ui.json_mode:
            self.ui.err.print(Text(ended), highlight=False)

    def render(self) -> Table:
        table = Table(box=None, show_header=False, pad_edge=False)
        table.add_column("node", style="bold")
        table.add_column("state")
        table.add_column("time", justify="right", style="dim")
        table.add_column("detail", overflow="ellipsis", no_wrap=True)
        for name, status, shown, detail in self.rows():
            style = _STATE_STYLES.get(status, "dim")
            table.add_row(Text(name), Text(status, style=style), f"{shown:.1f}s", Text(detail))
        return table


#: a line of bootstrap's own on a node's stream (the launch's notices: ``bootstrap: ...``)
_OWN_LINE = re.compile(r"^bootstrap: [^\n]*", re.M)


class LinePrinter:
    """Writes ``[node] line`` for every node's output line, as it arrives, from any thread.

    Every write method takes the node's own text and neutralises it (orchestrator/neutralise.py) before the
    prefixes are added: there is no way to print node text through it raw. SGR colour in that text
    is kept when the printer colours (a terminal, colours allowed), else removed. Prefixes start
    with a reset, so no attribute a node left on can dress up the next line's label.
    """

    def __init__(
        self,
        nodes: Sequence[str],
        stream: IO[str],
        *,
        color: bool,
        commands: Callable[[str], str] | None = None,
    ) -> None:
        width = max((len(n) for n in nodes), default=0)
        self.stream = stream
        self.color = color
        self.commands = commands  # the UI's: for bootstrap's own lines on a node's stream
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
        commands = self.commands
        if commands is not None and "`bootstrap " in text:  # bootstrap's own notice on the node
            text = _OWN_LINE.sub(lambda line: commands(line.group(0)), text)
        out = head + text[:-1].replace("\n", "\n" + head) + "\n"
        self._emit(rewrite(out) if rewrite is not None else out)

    def _emit(self, text: str) -> None:
        """Already neutralised, already prefixed lines, written whole (lines of two nodes never
        interleave)."""
        with self._lock:
            self.stream.write(text)
            self.stream.flush()
