"""Node output cannot drive the operator's terminal: every control sequence but colour is shown
visibly (``^[``, ``^M``, ``<U+009B>``), wherever node text is shown (streamed lines, messages,
tables, JSON), while the controller's log keeps what the node sent.

The real CLI on a terminal (a pty) is in tests/integration/test_terminal_safety.py."""

from __future__ import annotations

import io
import json
import logging
import re
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from rich.table import Table
from rich.text import Text

from orchestrator.cli.ui import UI, LinePrinter, NeutralConsole
from orchestrator.logs import PrefixedOutput, RankedOutput, RunLog
from orchestrator.neutralise import neutralise

#: what a terminal acts on: any C0 control but tab and newline, DEL, any C1 control, and the invisible
#: format characters that reorder text (bidi), hide it (zero-width) or end a line (U+2028/U+2029)
CONTROL = re.compile(
    r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200b-\u200f\u2028-\u202e\u2060\u2066-\u2069\ufeff]"
)
#: an ESC that does not start a colour (SGR) sequence
NOT_SGR = re.compile(r"\x1b(?!\[[0-9;:]*m)")

HOSTILE = [
    # (what the node printed, what the operator sees)
    ("clip \x1b]52;c;SGVsbG8=\x07 done", "clip ^[]52;c;SGVsbG8=^G done"),  # OSC 52: write the clipboard
    ("\x1b]0;owned\x07title", "^[]0;owned^Gtitle"),  # OSC 0: the window title (BEL-terminated)
    ("\x1b]2;owned\x1b\\title", "^[]2;owned^[\\title"),  # the same, ST-terminated
    ("\x1b]8;;http://evil/\x1b\\link\x1b]8;;\x1b\\", "^[]8;;http://evil/^[\\link^[]8;;^[\\"),  # hyperlink
    ("before\x1b[2Jafter", "before^[[2Jafter"),  # CSI 2J: clear the screen
    ("\x1b[Hhome \x1b[5;1Hmoved", "^[[Hhome ^[[5;1Hmoved"),  # CSI H: move the cursor
    ("loss 0.1\r[other-node:3] fake", "loss 0.1^M[other-node:3] fake"),  # \r: overwrite the line
    ("ab\x08\x08XY", "ab^H^HXY"),  # backspaces overwrite too
    ("\x9b2J\x9d0;t\x9c", "<U+009B>2J<U+009D>0;t<U+009C>"),  # 8-bit C1 CSI, OSC, ST
    ("\x0eshift\x0f\x7f\x00", "^Nshift^O^?^@"),  # SO/SI (character sets), DEL, NUL
    # bidi overrides and isolates: "[w1] ok \u202eliaf" would read "[w1] ok fail" (Trojan Source)
    ("ok \u202eliaf\u202c", "ok <U+202E>liaf<U+202C>"),
    ("\u2066\u2067\u2068x\u2069", "<U+2066><U+2067><U+2068>x<U+2069>"),
    ("\u202a\u202b\u202d", "<U+202A><U+202B><U+202D>"),
    ("\u200e\u200f\u061c", "<U+200E><U+200F><U+061C>"),  # direction marks
    # zero-width: hidden text, or two different words that look equal
    ("ad\u200bmin\u200c\u200d\u2060\ufeff", "ad<U+200B>min<U+200C><U+200D><U+2060><U+FEFF>"),
    # line and paragraph separators end a line in some terminals: a line without its node's label
    ("loss 0.1\u2028[other-node:3] fake\u2029", "loss 0.1<U+2028>[other-node:3] fake<U+2029>"),
]


@pytest.mark.parametrize("keep_colour", [False, True])
@pytest.mark.parametrize(("sent", "shown"), HOSTILE, ids=[s for s, _ in HOSTILE])
def test_control_sequences_are_shown_not_obeyed(sent: str, shown: str, keep_colour: bool) -> None:
    assert neutralise(sent + "\n", keep_colour=keep_colour) == shown + "\n"


def test_colour_is_kept_only_when_the_output_is_coloured() -> None:
    sent = "\x1b[31mred\x1b[0m \x1b[1;38;5;208mbold orange\x1b[m\n"
    coloured = neutralise(sent, keep_colour=True)
    assert coloured.startswith("\x1b[31mred\x1b[0m \x1b[1;38;5;208mbold orange\x1b[m")
    assert neutralise(sent) == "red bold orange\n"  # piped / --no-color: colour removed, text intact


def test_a_colour_ends_with_its_line() -> None:
    """An SGR left on (conceal, a background) cannot reach the next node's label."""
    shown = neutralise("\x1b[8mhidden\nnext\n", keep_colour=True)
    assert shown == "\x1b[8mhidden\x1b[0m\nnext\x1b[0m\n"


def test_tabs_newlines_and_unicode_text_pass_unchanged() -> None:
    text = "col1\tcol2\théllo 中文 🙂 ±½ \u00a0nbsp\n\n"
    assert neutralise(text) == text and neutralise(text, keep_colour=True) == text


@given(st.text(), st.booleans())
def test_nothing_a_terminal_acts_on_survives(text: str, keep_colour: bool) -> None:
    shown = neutralise(text, keep_colour=keep_colour)
    without_sgr = re.sub(r"\x1b\[[0-9;:]*m", "", shown) if keep_colour else shown
    assert not CONTROL.search(without_sgr)
    assert shown.count("\n") == text.count("\n")  # lines stay lines: each gets its node's label
    if not CONTROL.search(text):
        assert shown == text


# -- streamed lines ------------------------------------------------------------------------------


def test_run_output_is_neutralised_on_screen_and_exact_in_the_log(tmp_path: Path) -> None:
    sent = ["".join(s + "\n" for s, _ in HOSTILE), "\x1b[32mgreen\x1b[0m\n", "err \x1b]52;c;eA==\x07\n"]
    screen = io.StringIO()
    log = RunLog(tmp_path / "runs" / "r1")
    output = PrefixedOutput("n1", log, LinePrinter(["n1", "n2"], screen, color=True))
    output.block("stdout", sent[0])
    output.block("stdout", sent[1])
    output.block("stderr", sent[2])
    log.close()
    assert (tmp_path / "runs" / "r1" / "n1.log").read_bytes() == "".join(sent).encode()
    out = screen.getvalue()
    assert not NOT_SGR.search(out) and not CONTROL.search(out.replace("\x1b", ""))
    lines = out.splitlines()
    for line, (_, shown) in zip(lines, HOSTILE, strict=False):
        assert line == "\x1b[0;36m[n1]\x1b[0m " + shown
    assert lines[len(HOSTILE)] == "\x1b[0;36m[n1]\x1b[0m \x1b[32mgreen\x1b[0m\x1b[0m"  # colour kept
    assert lines[-1] == "\x1b[0;36m[n1]\x1b[0m \x1b[31m!\x1b[0m err ^[]52;c;eA==^G"


def test_ranked_lines_are_neutralised_and_keep_their_rank(tmp_path: Path) -> None:
    screen = io.StringIO()
    log = RunLog(tmp_path / "runs" / "r2")
    output = RankedOutput("n1", log, LinePrinter(["n1"], screen, color=False), first_rank=2, nproc=2)
    sent = "[default1]:step\r[n9:0] fake\n[default0]:\x1b[2J\x1b[31mred\n\x9b6n\n"
    output.block("stdout", sent)
    log.close()
    assert screen.getvalue().splitlines() == [
        "[n1:3] [n9:0] fake",  # a line redrawn with \r: its last state, after the rank's own label
        "[n1:2] ^[[2Jred",  # piped: colour removed, the erase shown
        "[n1] <U+009B>6n",
    ]
    assert (tmp_path / "runs" / "r2" / "n1.log").read_bytes() == sent.encode()


def test_single_lines_are_neutralised_too() -> None:
    screen = io.StringIO()
    printer = LinePrinter(["n1"], screen, color=False)
    printer.write("n1", "a\x1b]0;t\x07b", stderr=True)
    printer.write_rank("n1", 0, "c\rd")
    assert screen.getvalue() == "[n1] a^[]0;t^Gb\n[n1:0] c^Md\n"


# -- messages, tables, JSON ----------------------------------------------------------------------


def test_tables_built_from_raw_node_text_are_neutralised_by_the_console() -> None:
    """Whoever forgets to neutralise a table cell: the console does it, rich's own styling and
    cursor control untouched."""
    screen = io.StringIO()
    console = NeutralConsole(file=screen, force_terminal=True, color_system="standard", width=120)
    table = Table("node", "last line")
    table.add_row(Text("n1", style="bold"), Text("x \x1b]52;c;SGVsbG8=\x1b\\ \x1b[2J \x9b1;1H"))
    console.print(table)
    console.show_cursor(False)  # a control segment (what the live display moves the cursor with)
    out = screen.getvalue()
    assert "x ^[]52;c;SGVsbG8=^[\\ ^[[2J <U+009B>1;1H" in out
    assert "\x1b[1mn1" in out  # rich's own bold
    assert out.endswith("\x1b[?25l")  # control segments pass
    assert not NOT_SGR.search(out.removesuffix("\x1b[?25l"))


def test_messages_show_node_text_visibly(capsys: pytest.CaptureFixture[str]) -> None:
    """The fail-fast summary's last lines and error messages go through these."""
    ui = UI()
    ui.info("  n1 | [default0]:loss\r[n2:0] ok \x1b]52;c;SGVsbG8=\x07")
    ui.error("node 'n1': \x1b[2Jboom")
    ui.note("n1: \x9b0m")
    ui.warn("\x1b]0;t\x07")
    err = capsys.readouterr().err
    assert err.splitlines() == [
        "  n1 | [default0]:loss^M[n2:0] ok ^[]52;c;SGVsbG8=^G",
        "error: node 'n1': ^[[2Jboom",
        "n1: <U+009B>0m",
        "warning: ^[]0;t^G",
    ]


def test_json_carries_node_text_exactly_and_no_raw_control(capsys: pytest.CaptureFixture[str]) -> None:
    text = "".join(s + "\n" for s, _ in HOSTILE)
    UI(json_mode=True).print_json({"stdout": text})
    out = capsys.readouterr().out
    assert not CONTROL.search(out.replace("\n", "")) and "\x1b" not in out
    assert json.loads(out)["stdout"] == text


def test_log_lines_quoting_a_node_are_neutralised() -> None:
    """-v / -vv: a WinRM fault's text or an SSH server's banner reaches the log lines."""
    from orchestrator.neutralise import NeutralFormatter

    record = logging.LogRecord(
        "orchestrator", logging.INFO, __file__, 1, "n1: %s", ("\x1b]52;c;eA==\x07",), None
    )
    assert NeutralFormatter("%(levelname)s %(message)s").format(record) == "INFO n1: ^[]52;c;eA==^G"
