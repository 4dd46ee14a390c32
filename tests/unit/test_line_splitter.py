"""Node output into lines: the same lines however the reads fall, long lines cut at the same places,
and a bounded tail. That the work is linear in the input is benchmarks/hostile_output.py's table."""

from __future__ import annotations

import itertools

from hypothesis import given
from hypothesis import strategies as st

from orchestrator.transports import base
from orchestrator.transports.base import BlockHandler, LineSplitter


class Shown(BlockHandler):
    """What a terminal handler gets: ("line", text) per complete line, ("piece", text) per piece."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, str]] = []
        self.raw: list[str] = []

    def block(self, stream: str, text: str) -> None:
        assert text.endswith("\n")
        self.seen += [("line", line) for line in text[:-1].split("\n")]

    def piece(self, stream: str, text: str) -> None:
        assert "\n" not in text
        self.seen.append(("piece", text))


def _pieces(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({c % (len(data) + 1) for c in cuts})
    edges = [0, *points, len(data)]
    return [data[a:b] for a, b in itertools.pairwise(edges)]


def _units(text: str, limit: int) -> list[tuple[str, str, str]]:
    """The model: (kind, as shown, as kept) for every line and every piece of a long line."""
    units: list[tuple[str, str, str]] = []
    *complete, last = text.split("\n")
    for content, end in [*((c, "\n") for c in complete), *([(last, "")] if last else [])]:
        while len(content) > limit:
            units.append(("piece", content[:limit], content[:limit]))
            content = content[limit:]
        units.append(("line", content.removesuffix("\r"), content + end))
    return units


TEXT = st.text(alphabet="ab\r\n\u00e9\u4e2d", max_size=60)
CUTS = st.lists(st.integers(min_value=0, max_value=200), max_size=12)


@given(TEXT, CUTS, st.integers(min_value=1, max_value=7))
def test_any_chunking_gives_the_same_lines_and_pieces(text: str, cuts: list[int], limit: int) -> None:
    data = text.encode()
    expected = [(kind, shown) for kind, shown, _ in _units(text, limit)]
    handler = Shown()
    splitter = LineSplitter("stdout", handler, max_line=limit)
    per_line: list[str] = []
    plain = LineSplitter("stdout", lambda _s, line: per_line.append(line), max_line=limit)
    for piece in _pieces(data, cuts):  # reads cut anywhere: inside a character, between \r and \n
        splitter.feed(piece)
        plain.feed(piece)
    splitter.close()
    plain.close()
    assert handler.seen == expected
    assert per_line == [shown for _, shown in expected]  # a plain on_line gets pieces as lines


@given(TEXT, CUTS, st.integers(min_value=1, max_value=7), st.integers(min_value=0, max_value=6))
def test_the_kept_tail_is_the_last_lines_as_shown(text: str, cuts: list[int], limit: int, keep: int) -> None:
    splitter = LineSplitter("stdout", Shown(), keep=keep, max_line=limit)
    without_handler = LineSplitter("stdout", None, keep=keep, max_line=limit)
    for piece in _pieces(text.encode(), cuts):
        splitter.feed(piece)
        without_handler.feed(piece)
    splitter.close()
    without_handler.close()
    units = _units(text, limit)
    expected = "".join(kept for _, _, kept in units[max(0, len(units) - keep) :]) if keep else ""
    assert splitter.text == expected
    assert without_handler.text == expected


def test_without_keep_the_result_holds_every_byte() -> None:
    splitter = LineSplitter("stdout", Shown(), max_line=4)
    splitter.feed(b"abcdefghij\r\nkl")
    splitter.close()
    assert splitter.text == "abcdefghij\r\nkl"


def test_a_long_line_is_shown_in_pieces_and_its_end_as_a_line() -> None:
    handler = Shown()
    splitter = LineSplitter("stdout", handler, max_line=4)
    for ch in b"0123456789\n":
        splitter.feed(bytes([ch]))
    splitter.close()
    assert handler.seen == [("piece", "0123"), ("piece", "4567"), ("line", "89")]


def test_the_tail_stays_bounded_however_much_a_node_prints() -> None:
    splitter = LineSplitter("stdout", Shown(), keep=3)
    chunk = b"x" * 65536
    for _ in range(200):  # 13 MB without a newline
        splitter.feed(chunk)
    kept = sum(len(t) for t, _ in splitter._tail) + splitter._partial_chars
    assert kept <= base.MAX_TAIL_CHARS + 2 * base.MAX_LINE_CHARS
    assert len(splitter.text) <= base.MAX_TAIL_CHARS
