"""A key in `logs --follow` that switches between the streamed lines and the live table of
`status --watch` (for users on SSH without a browser), and back.

:class:`LinesOrTable` is the switch itself: the stream the line printer writes to, which passes
lines through while they are shown and only counts them while the table is (every line still
reaches runs/<run-id>/ and the page). :func:`table_key` reads the key from a terminal (cbreak mode,
restored at the end) on a thread of its own and shows the table in place (rich Live) while asked.
"""

from __future__ import annotations

import contextlib
import os
import select
import threading
from collections.abc import Callable, Iterator
from typing import IO, TYPE_CHECKING

from rich.console import Console, RenderableType
from rich.live import Live

if TYPE_CHECKING:
    from orchestrator.dashboard.model import LiveRun

#: the key that switches the view
KEY = "t"


class LinesOrTable:
    """The lines' stream while the lines are shown; while the table is, lines are counted and
    dropped. Thread-safe: the printer writes from the node threads, the key comes from another."""

    def __init__(self, out: IO[str]) -> None:
        self.out = out
        self.table = False
        self.hidden = 0  # lines not shown since the table came up
        self._lock = threading.Lock()

    def key(self, char: str) -> bool | None:
        """The view ``char`` asks for: True (the table), False (the lines), None (not our key)."""
        return None if char.lower() != KEY else not self.table

    def show_table(self) -> None:
        """From now on lines are counted, not written."""
        with self._lock:
            self.table, self.hidden = True, 0

    def show_lines(self, where: str = ")") -> None:
        """Lines are written again, after a note of how many were not (``where``: its end)."""
        with self._lock:
            self.table = False
            self.out.write(f"({self.hidden} line(s) not shown while the table was up{where}\n")
            self.out.flush()

    def write(self, text: str) -> int:
        with self._lock:
            if self.table:
                self.hidden += text.count("\n")
            else:
                self.out.write(text)
        return len(text)

    def flush(self) -> None:
        with self._lock:
            if not self.table:
                self.out.flush()


@contextlib.contextmanager
def table_key(
    live: LiveRun,
    table: Callable[[LiveRun], RenderableType],
    out: IO[str],
    console: Console,
    stdin: IO[str],
    *,
    where: str,
) -> Iterator[LinesOrTable]:
    """While the body runs, :data:`KEY` on ``stdin`` (a terminal) shows ``table(live)`` in place on
    ``console`` instead of the lines (written to the yielded stream, passed on to ``out``), and again
    brings the lines back, saying how many were not shown (they are in ``where``)."""
    import termios
    import tty

    view = LinesOrTable(out)
    fd = stdin.fileno()
    saved = termios.tcgetattr(fd)
    stop = threading.Event()
    shown: list[Live] = []

    def switch(to_table: bool) -> None:
        if to_table:
            view.show_table()
            # no redirection of sys.stdout/stderr: the console itself may write to sys.stderr
            shown.append(
                Live(
                    console=console,
                    refresh_per_second=2,
                    get_renderable=lambda: table(live),
                    redirect_stdout=False,
                    redirect_stderr=False,
                )
            )
            shown[-1].start()
        else:
            while shown:  # the table goes first: no line is written into it
                shown.pop().stop()
            view.show_lines(f": {where})")

    def read_keys() -> None:
        while not stop.is_set():
            ready, _, _ = select.select([fd], [], [], 0.2)
            if not ready:
                continue
            data = os.read(fd, 64)
            if not data:
                return  # the terminal went away
            for char in data.decode("utf-8", "replace"):
                to_table = view.key(char)
                if to_table is not None:
                    switch(to_table)

    tty.setcbreak(fd)  # keys without Enter, not echoed; Ctrl-C still interrupts
    reader = threading.Thread(target=read_keys, name="table-key", daemon=True)
    reader.start()
    try:
        yield view
    finally:
        stop.set()
        reader.join(1)
        while shown:
            shown.pop().stop()
        termios.tcsetattr(fd, termios.TCSADRAIN, saved)
