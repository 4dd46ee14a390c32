"""The key in `logs --follow` that switches to the `status --watch` table and back (issue 31)."""

from __future__ import annotations

import io
import os
import termios
import time
from collections.abc import Callable

from rich.console import Console
from rich.table import Table

from orchestrator.dashboard.model import LiveRun
from orchestrator.dashboard.terminal import LinesOrTable, table_key


def _until(check: Callable[[], bool], what: str, seconds: float = 10.0) -> None:
    end = time.monotonic() + seconds
    while not check():
        assert time.monotonic() < end, what
        time.sleep(0.01)


def test_lines_pass_until_the_table_is_asked_for_then_are_counted_until_it_goes() -> None:
    out = io.StringIO()
    view = LinesOrTable(out)
    assert [view.key(c) for c in "xtT"] == [None, True, True]
    view.write("[n1:0] a\n")
    view.show_table()
    assert view.key("t") is False
    view.write("[n1:0] b\n[n1:1] c\n")
    view.flush()
    assert out.getvalue() == "[n1:0] a\n"
    view.show_lines(": runs/r/)")
    view.write("[n1:0] d\n")
    assert out.getvalue() == "[n1:0] a\n(2 line(s) not shown while the table was up: runs/r/)\n[n1:0] d\n"


def test_the_key_on_a_terminal_shows_the_table_in_place_and_back_and_the_terminal_is_restored() -> None:
    master, slave = os.openpty()
    stdin = os.fdopen(slave, "r")
    before = termios.tcgetattr(slave)
    out, screen = io.StringIO(), io.StringIO()
    console = Console(file=screen, force_terminal=True, width=80)
    live = LiveRun(["n1"], run_id="r1", labels={"n1": (0, 1)})
    live.block("n1", '[default0]:CB_METRIC {"step": 7, "loss": 0.5}\n')

    def table(run: LiveRun) -> Table:
        run.flush_pending()
        shown = Table("rank", "step")
        for rank in run.ranks.values():
            shown.add_row(str(rank.rank), str(rank.step))
        return shown

    try:
        with table_key(live, table, out, console, stdin, where="runs/r1/") as view:
            assert not termios.tcgetattr(slave)[3] & termios.ECHO  # the key is not echoed
            view.write("[n1:0] first\n")
            os.write(master, b"t")
            _until(lambda: view.table and "step" in screen.getvalue(), "the table on the screen")
            view.write("[n1:0] hidden\n")
            os.write(master, b"t")
            _until(lambda: not view.table, "the lines again")
            view.write("[n1:0] after\n")
        assert out.getvalue() == (
            "[n1:0] first\n(1 line(s) not shown while the table was up: runs/r1/)\n[n1:0] after\n"
        )
        assert "7" in screen.getvalue()  # rank 0's step
        assert termios.tcgetattr(slave) == before
    finally:
        stdin.close()
        os.close(master)
