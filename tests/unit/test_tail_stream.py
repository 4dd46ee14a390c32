"""The tail protocol in the codec's stream form (runs/tail.py on records.Stream): whatever bytes the
launcher wrote to node.log, every producer (the node's Python, sh with tail and awk, PowerShell) and
the controller's reader together deliver exactly those bytes, however the producer's stdout is cut
into blocks; no log line, and nothing printed before the producer starts (a login shell's rc file),
can end, fake or hide a record.

The Python and sh producers run here on local files; no PowerShell runs here, so the PowerShell
producer runs in the played Windows node's interpreter (tests/winrm_server/interpret.py) with the
.NET objects it uses as stand-ins (FileStream on the log's bytes, the raw stdout stream, Latin-1).
The reader is given the stdout as text with every byte kept (``surrogateescape``); the transports'
own decoding (``replace`` for bytes that are not UTF-8) is theirs.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from orchestrator import records
from orchestrator.platforms import PosixShell, PowerShell
from orchestrator.runs.posix import PosixRuns
from orchestrator.runs.tail import Batches, powershell_tail
from orchestrator.transports.base import LineSplitter
from tests import pwsh
from tests.winrm_server.interpret import Interpreter
from tests.winrm_server.native import ENCODER_STATICS, StringBuilder

SH = PosixShell()
PS = PowerShell()
GUESSED = "cb-0123456789ab"

#: log lines shaped like the protocol: the old markers, records with a guessed nonce, escapes
TRICKY = [
    b"@@. 999",
    b"@@end 0 5",
    b"@@missing",
    b"@@more 7",
    b"@@start 3",
    b"@@started 4242 1",
    b"@@@three",
    b"@@",
    b"@",
    records.record(GUESSED, "end", "0", "5").encode(),
    records.record(GUESSED, "batch", "999").encode(),
    b"\r",
    b"\x00",
    b"\xc3\xa9\xe2\x9c\x93",
    b"\xff\xfe",
    b"\x0c\x1c\xe2\x80\xa8",
]

#: a line longer than a producer's block (2 MiB), and one after it
LONG = b"[default1]:" + b"x" * (5 << 20) + b"\n[default0]:after\n"

log_bytes = st.lists(st.sampled_from(TRICKY) | st.binary(max_size=20) | st.just(b"\n"), max_size=25).map(
    b"".join
)


def expected(data: bytes) -> bytes:
    """What the reader must deliver of an ended launcher's log: all of it, a last line without its
    newline with one added."""
    return data + (b"\n" if data and not data.endswith(b"\n") else b"")


def read(stdout: bytes, nonce: str, cuts: list[int]) -> tuple[bytes, Batches]:
    """The producer's stdout through the controller's reader, in blocks of complete lines cut after
    the lines numbered in ``cuts`` (as reads of the transport bring them)."""
    got: list[str] = []
    batches = Batches("n1", got.append, nonce)
    lines = stdout.decode("utf-8", "surrogateescape").split("\n")[:-1]
    at = 0
    for cut in sorted({c % (len(lines) + 1) for c in cuts} | {len(lines)}):
        if cut > at:
            batches.block("stdout", "".join(line + "\n" for line in lines[at:cut]))
            at = cut
    return "".join(got).encode("utf-8", "surrogateescape"), batches


def posix_stdout(data: bytes, nonce: str, python: str | None) -> bytes:
    with tempfile.TemporaryDirectory() as name:
        run_dir = Path(name)
        os.chmod(run_dir, 0o700)
        (run_dir / "node.log").write_bytes(data)
        (run_dir / "node.log.rc").write_text("0\n")
        script = PosixRuns(SH).tail(
            str(run_dir),
            "m",
            str(run_dir / "node.log"),
            0,
            nonce=nonce,
            follow=True,
            python=python,
            interval=0.02,
        )
        ran = subprocess.run(["sh", "-c", script], capture_output=True, timeout=60)
    assert ran.returncode == 0, ran.stderr
    return ran.stdout


class _RawOut:
    """[Console]::OpenStandardOutput(): the bytes written, as they are."""

    def __init__(self, into: bytearray) -> None:
        self.into = into

    def Write(self, data: bytearray, start: int, count: int) -> None:
        self.into += bytes(data[start : start + count])

    def Flush(self) -> None:
        pass


class _Latin1:
    """[System.Text.Encoding]::GetEncoding(28591): one character per byte."""

    def GetBytes(self, text: str) -> bytearray:
        return bytearray(str(text).encode("latin-1"))

    def GetString(self, data: bytearray, start: int, count: int) -> str:
        return bytes(data[start : start + count]).decode("latin-1")


class _FileStream:
    """System.IO.FileStream on the log's bytes."""

    def __init__(self, data: bytes) -> None:
        self.data, self.pos = data, 0

    @property
    def Length(self) -> int:
        return len(self.data)

    def Seek(self, at: int, origin: int) -> int:
        self.pos = int(at)
        return self.pos

    def Read(self, buffer: bytearray, offset: int, count: int) -> int:
        got = self.data[self.pos : self.pos + count]
        buffer[offset : offset + len(got)] = got
        self.pos += len(got)
        return len(got)

    def ReadByte(self) -> int:
        if self.pos >= len(self.data):
            return -1
        self.pos += 1
        return self.data[self.pos - 1]

    def Dispose(self) -> None:
        pass


def powershell_stdout(data: bytes, nonce: str, lines: int | None = None, samples: str = "") -> bytes:
    """The PowerShell producer's stdout for a log holding ``data`` whose launcher has ended (exit 0):
    its own statements run, the raw log bytes and its records (``[Console]::Out``) in order."""
    out = bytearray()

    def new_object(positional: list[Any], named: dict[str, Any]) -> Any:
        kind = named["typename"]
        if kind == "byte[]":
            return bytearray(int(named["argumentlist"]))
        if kind == "System.IO.FileStream":
            return _FileStream(data)
        assert kind == "System.Text.StringBuilder", kind
        return StringBuilder()

    def console_write(text: Any) -> None:
        out.extend(str(text).encode("utf-8"))

    paths = SimpleNamespace(GetUnresolvedProviderPathFromPSPath=lambda path: path)
    interpreter = Interpreter(
        {"$executioncontext": SimpleNamespace(SessionState=SimpleNamespace(Path=paths))},
        {
            "New-Object": new_object,
            "Join-Path": lambda p, n: f"{n['path']}\\{n['childpath']}",
            "Read-CbText": lambda p, n: "0\n",  # node.log.rc
            "Get-CbLeader": lambda p, n: None,
        },
        {
            **ENCODER_STATICS,
            "[Console]::Out": SimpleNamespace(Write=console_write),
            "[Console]::OpenStandardOutput": lambda: _RawOut(out),
            "[System.Text.Encoding]::GetEncoding": lambda code: _Latin1(),
            "[System.IO.Directory]::Exists": lambda path: True,
            "[System.IO.File]::Exists": lambda path: True,  # the log, and node.log.rc: ended
            "[Array]::LastIndexOf": lambda buffer, value, start: bytes(buffer).rfind(
                bytes([value]), 0, start + 1
            ),
            "[Math]::Min": min,
            "[System.IO.FileShare]::ReadWrite": 3,
            "[System.IO.FileShare]::Delete": 4,
            "[System.IO.FileMode]::Open": 3,
            "[System.IO.FileAccess]::Read": 1,
            "[System.IO.SeekOrigin]::Begin": 0,
        },
    )
    script = "$cbDir = 'C:\\r'\n" + powershell_tail(
        PS, "", "C:/r/node.log", 0, nonce=nonce, follow=True, interval=0.05, lines=lines, samples=samples
    )
    tree = pwsh.assert_parses(script)
    interpreter.define(tree)
    interpreter.block(tree.root_node)
    return bytes(out)


@settings(max_examples=60, deadline=None)
@given(data=log_bytes, cuts=st.lists(st.integers(0, 100), max_size=4), python=st.booleans())
def test_any_log_comes_out_of_the_posix_producers_and_the_reader_as_written(
    data: bytes, cuts: list[int], python: bool
) -> None:
    nonce = records.new_nonce()
    got, batches = read(posix_stdout(data, nonce, sys.executable if python else None), nonce, cuts)
    assert got == expected(data)
    assert batches.exit_code() == 0 and batches.offset == len(data)
    assert batches.lines == expected(data).count(b"\n")


@settings(max_examples=150, deadline=None)
@given(data=log_bytes, cuts=st.lists(st.integers(0, 100), max_size=4))
def test_any_log_comes_out_of_the_powershell_producer_and_the_reader_as_written(
    data: bytes, cuts: list[int]
) -> None:
    nonce = records.new_nonce()
    got, batches = read(powershell_stdout(data, nonce), nonce, cuts)
    assert got == expected(data)
    assert batches.exit_code() == 0 and batches.offset == len(data)


def test_the_powershell_producer_tells_where_the_last_lines_start() -> None:
    data = b"one\n@@. 4\ntwo\nthree"
    nonce = records.new_nonce()
    got, batches = read(powershell_stdout(data, nonce, lines=2), nonce, [])
    assert (batches.start, got) == (data.index(b"two"), b"two\nthree\n")


def test_the_powershell_producer_does_not_count_the_nodes_samples_among_the_last_lines() -> None:
    """`logs --tail N` on a native Windows node: the node's samples (records of the run's sample
    nonce, not shown) are not among the N lines; a record of another nonce is a line like any other."""
    samples = records.new_nonce()
    gpu = records.record(samples, "gpu", "0, 87, 1200, 8000").encode()
    cpu = records.record(samples, "cpu", "1.5", "8").encode()
    other = records.record(GUESSED, "gpu", "0, 1, 2, 3").encode()
    data = b"one\n" + gpu + b"two\n" + cpu + other + b"three\n" + gpu + cpu
    nonce = records.new_nonce()
    for lines, first in ((1, b"three"), (2, other), (3, b"two"), (4, b"one"), (9, b"one")):
        got, batches = read(powershell_stdout(data, nonce, lines=lines, samples=samples), nonce, [])
        start = data.index(first) if first != b"one" else 0
        assert (batches.start, got) == (start, data[start:]), lines
        shown = [line for line in records.plain(got.decode(), samples).split("\n") if line]
        assert len(shown) == min(lines, 4)
    # without the sample nonce (a run not launched from here) they are lines like any other
    got, batches = read(powershell_stdout(data, nonce, lines=2), nonce, [])
    assert batches.start == len(data) - len(gpu + cpu)


def test_what_a_login_shell_prints_before_the_producer_is_text_whatever_it_looks_like() -> None:
    """A shell's rc file (or a PowerShell profile) may print before the producer runs: old markers,
    or a record with a guessed nonce, are shown as the text they are and end nothing."""
    nonce = records.new_nonce()
    printed = [
        "@@end 0 5",
        "@@. 999",
        "@@missing",
        "@@more 3",
        records.record(GUESSED, "end", "0", "5").rstrip(),
    ]
    stdout = "".join(line + "\n" for line in printed).encode() + posix_stdout(b"log line\n", nonce, None)
    got, batches = read(stdout, nonce, [1, 3])
    assert got == ("\n".join(printed) + "\nlog line\n").encode()
    assert not batches.missing and batches.more() is None
    assert batches.exit_code() == 0 and batches.offset == len(b"log line\n")


def through_the_reader(stdout: bytes, nonce: str) -> tuple[list[tuple[str, str]], Batches]:
    """A producer's stdout through the transport's line splitter (reads of 64 KiB) and the reader:
    what the handler got, in order, as ("block", complete lines) and ("piece", part of a line)."""
    got: list[tuple[str, str]] = []
    batches = Batches(
        "n1", lambda text: got.append(("block", text)), nonce, lambda text: got.append(("piece", text))
    )
    splitter = LineSplitter("stdout", batches)
    for at in range(0, len(stdout), 1 << 16):
        splitter.feed(stdout[at : at + (1 << 16)])
    splitter.close()
    return got, batches


def test_a_line_longer_than_a_block_reaches_the_handler_whole_whatever_the_producer() -> None:
    """A rank's 5 MiB line without a newline (an array printed whole): the Python producer sends it in
    2 MiB pieces (records ``piece``), the shell producer whole (the transport cuts it at 2 Mi
    characters); either way the handler gets its parts without a newline between them (its pieces),
    so `logs` keeps the copy here byte for byte and labels every part with the rank. Earlier each
    part arrived as a line of its own, and the copy had a newline every 2 MiB."""
    for python in (sys.executable, None):
        nonce = records.new_nonce()
        got, batches = through_the_reader(posix_stdout(LONG, nonce, python), nonce)
        assert "".join(text for _, text in got).encode() == LONG, python
        assert [kind for kind, _ in got] == (["piece", "piece", "block"] if python else ["block"])
        assert batches.offset == len(LONG) and batches.lines == 2


def test_the_powershell_producer_sends_a_line_longer_than_a_block_as_pieces() -> None:
    """The same 5 MiB line from a native Windows node's log: two ``piece`` records, then the batch."""
    nonce = records.new_nonce()
    got, _ = through_the_reader(powershell_stdout(LONG, nonce), nonce)
    assert "".join(text for _, text in got).encode() == LONG
    assert [kind for kind, _ in got] == ["piece", "piece", "block"]
