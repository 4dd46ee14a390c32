"""Streaming node output a block of lines at a time: the same lines as line by line, and the same
``[node:rank]`` terminal text and controller log as the per-line path printed."""

from __future__ import annotations

import io
import itertools
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from orchestrator.cli.ui import LinePrinter
from orchestrator.logs import PrefixedOutput, RankedOutput, RunLog
from orchestrator.transports.base import BlockHandler, LineSplitter


class Blocks(BlockHandler):
    def __init__(self) -> None:
        self.blocks: list[str] = []

    def block(self, stream: str, text: str) -> None:
        self.blocks.append(text)


def _per_line(data: bytes, cuts: list[int]) -> list[str]:
    lines: list[str] = []
    splitter = LineSplitter("stdout", lambda _s, line: lines.append(line))
    for piece in _pieces(data, cuts):
        splitter.feed(piece)
    splitter.close()
    return lines


def _pieces(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({c % (len(data) + 1) for c in cuts})
    edges = [0, *points, len(data)]
    return [data[a:b] for a, b in itertools.pairwise(edges)]


@given(
    st.lists(st.text(alphabet="ab\u00e9\u4e2d\r [default0]:", max_size=12), max_size=12),
    st.booleans(),
    st.lists(st.integers(min_value=0, max_value=400), max_size=8),
)
def test_blocks_carry_exactly_the_lines_the_per_line_path_delivers(
    lines: list[str], final_newline: bool, cuts: list[int]
) -> None:
    text = "\r\n".join(lines) + ("\n" if final_newline and lines else "")
    data = text.encode()
    handler = Blocks()
    splitter = LineSplitter("stdout", handler)
    for piece in _pieces(data, cuts):  # reads cut anywhere: inside a character, between \r and \n
        splitter.feed(piece)
    splitter.close()
    assert all(block.endswith("\n") for block in handler.blocks)
    assert "".join(handler.blocks).split("\n")[:-1] == _per_line(data, cuts)


def test_a_read_of_many_lines_is_one_block_and_a_partial_line_waits_for_its_end() -> None:
    handler = Blocks()
    splitter = LineSplitter("stdout", handler)
    splitter.feed(b"one\ntwo\nthr")
    splitter.feed(b"ee")
    assert handler.blocks == ["one\ntwo\n"]
    splitter.feed(b"\nfour")
    splitter.close()  # the command ended: its last line without a newline is delivered whole
    assert handler.blocks == ["one\ntwo\n", "three\n", "four\n"]


def test_the_kept_tail_is_the_last_lines_whatever_the_reads() -> None:
    splitter = LineSplitter("stdout", Blocks(), keep=3)
    for i in range(1000):
        splitter.feed(f"line {i}\n".encode())
    assert splitter.text == "line 997\nline 998\nline 999\n"


def _ranked(color: bool, tmp_path: Path, nproc: int = 2) -> tuple[RankedOutput, io.StringIO, RunLog]:
    out = io.StringIO()
    printer = LinePrinter(["n1", "node-two"], out, color=color)
    log = RunLog(tmp_path / "runs" / "r1")
    return RankedOutput("node-two", log, printer, first_rank=4, nproc=nproc), out, log


def test_ranked_output_prints_global_ranks_and_logs_what_the_node_sent(tmp_path: Path) -> None:
    output, out, log = _ranked(False, tmp_path)
    sent = (
        "[default0]:loss 1.0\n"
        "[default1]:loss 2.0\n"
        "torchrun: starting\n"
        "[default7]:a rank beyond nproc still gets its number\n"
        "text with [default0]: inside stays\n"
        "\n"
    )
    output.block("stdout", sent)
    log.close()
    assert out.getvalue().splitlines() == [
        "[node-two:4] loss 1.0",
        "[node-two:5] loss 2.0",
        "[node-two] torchrun: starting",
        "[node-two:11] a rank beyond nproc still gets its number",
        "[node-two] text with [default0]: inside stays",
        "[node-two] ",
    ]
    assert (tmp_path / "runs" / "r1" / "node-two.log").read_text() == sent


def test_ranked_output_matches_the_per_line_printer_with_colours(tmp_path: Path) -> None:
    output, out, _ = _ranked(True, tmp_path)
    output.block("stdout", "[default1]:x\nplain\n")
    expected = io.StringIO()
    printer = LinePrinter(["n1", "node-two"], expected, color=True)
    printer.write_rank("node-two", 5, "x")
    printer.write_rank("node-two", None, "plain")
    assert out.getvalue() == expected.getvalue()
    assert "\x1b[" in out.getvalue()


def test_without_a_terminal_printer_output_is_still_logged(tmp_path: Path) -> None:
    log = RunLog(tmp_path / "runs" / "r2")
    seen: list[tuple[str, str]] = []
    output = RankedOutput("n1", log, None, on_block=lambda node, text: seen.append((node, text)))
    output("stdout", "[default0]:one line")  # called line by line, as a plain on_line handler
    log.close()
    assert (tmp_path / "runs" / "r2" / "n1.log").read_text() == "[default0]:one line\n"
    assert seen == [("n1", "[default0]:one line\n")]


def test_command_output_is_prefixed_per_line_with_stderr_marked(tmp_path: Path) -> None:
    out = io.StringIO()
    printer = LinePrinter(["n1", "node-two"], out, color=False)
    log = RunLog(tmp_path / "runs" / "r3")
    output = PrefixedOutput("n1", log, printer)
    output.block("stdout", "a\nb\n")
    output.block("stderr", "oops\n")
    log.close()
    assert out.getvalue().splitlines() == ["[n1]       a", "[n1]       b", "[n1]       oops"]
    assert (tmp_path / "runs" / "r3" / "n1.log").read_text() == "a\nb\noops\n"
    colored = io.StringIO()
    PrefixedOutput("n1", None, LinePrinter(["n1"], colored, color=True)).block("stderr", "x\ny\n")
    assert colored.getvalue().count("\x1b[31m!") == 2  # every stderr line carries the mark


def test_every_piece_of_a_ranks_very_long_line_carries_the_ranks_label(tmp_path: Path) -> None:
    """A rank printing a line longer than the splitter's limit is shown in pieces: each piece and the
    line's end are labelled with that rank (earlier only the first: the rest read as torchrun's)."""
    output, out, _ = _ranked(False, tmp_path)
    splitter = LineSplitter("stdout", output, max_line=20)
    splitter.feed(b"[default1]:" + b"x" * 40 + b"\n[default0]:after\nplain\n")
    splitter.feed(b"[default0]:" + b"y" * 19)
    splitter.feed(b"z" * 8 + b"\n")
    assert out.getvalue().splitlines() == [
        "[node-two:5] " + "x" * 9,
        "[node-two:5] " + "x" * 20,
        "[node-two:5] " + "x" * 11,
        "[node-two:4] after",
        "[node-two] plain",
        "[node-two:4] " + "y" * 9,
        "[node-two:4] " + "y" * 10 + "z" * 8,
    ]


def test_a_run_log_close_cut_short_by_a_second_ctrl_c_closes_each_file_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A Ctrl-C while the first one's clean-up closed the run's logs left closed descriptors in the
    table; closing again (the command's end) closed them twice: EBADF and a traceback for the user,
    or worse, a descriptor opened meanwhile closed under someone else."""
    import os

    log = RunLog(tmp_path)
    for node in ("n1", "n2", "n3"):
        log.write(node, f"{node} line")
    real_close, closed = os.close, []

    def close(fd: int) -> None:
        closed.append(fd)
        real_close(fd)
        if len(closed) == 1:
            raise KeyboardInterrupt  # the second Ctrl-C, right after the first file

    monkeypatch.setattr(os, "close", close)
    with pytest.raises(KeyboardInterrupt):
        log.close()
    log.close()  # the command's own close at its end: the other two, and no error
    assert len(closed) == len(set(closed)) == 3
    assert all((tmp_path / f"{n}.log").read_text() == f"{n} line\n" for n in ("n1", "n2", "n3"))
