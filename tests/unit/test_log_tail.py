"""Where `logs --tail N` starts, as both POSIX node readers find it: the Python reader
(runs/tail.py FOLLOW_PROGRAM) and the shell one (dd + awk), run here on local files against a reference.

The start must be the N-th last complete line (a last line without newline is complete once the
launcher has ended), found by reading back from the end: logs much larger than the readers' blocks
and windows (64 KiB), lines longer than them, no newline at all, an empty log, no log yet. Over SSH
and with the whole protocol: tests/integration/test_runs.py.
"""

from __future__ import annotations

import random
import subprocess
import sys
import time
from pathlib import Path

import pytest

from orchestrator.platforms import PosixShell
from orchestrator.records import new_nonce, plain, record
from orchestrator.runs.posix import PosixRuns
from orchestrator.runs.tail import Batches, posix_tail_python

sh = PosixShell()


def reference(data: bytes, n: int, ended: bool) -> int:
    """The N-th last complete line's start, the slow way."""
    end = len(data) if ended else data.rfind(b"\n") + 1
    starts = [0] + [i + 1 for i in range(end - 1) if data[i] == 10]
    if end == 0 or n == 0:
        return end
    return starts[-n] if n <= len(starts) else 0


def start_of(reader: str, run_dir: Path, n: int, samples: str = "") -> tuple[int, bytes]:
    """Where the reader says the last ``n`` lines start, and the log it sent from there (as the
    controller's reader delivers it)."""
    log, nonce = str(run_dir / "node.log"), new_nonce()
    if reader == "python":
        script = posix_tail_python(
            sh,
            sys.executable,
            str(run_dir),
            log,
            0,
            nonce=nonce,
            follow=False,
            interval=0.02,
            lines=n,
            samples=samples,
        )
    else:
        script = PosixRuns(sh).tail(
            str(run_dir),
            "m",
            log,
            0,
            nonce=nonce,
            follow=False,
            python=None,
            interval=None,
            lines=n,
            samples=samples,
        )
    ran = subprocess.run(["sh", "-c", script], capture_output=True, timeout=60)
    assert ran.returncode == 0, ran.stderr
    got: list[str] = []
    batches = Batches("n1", got.append, nonce)
    batches.block("stdout", ran.stdout.decode("utf-8", "surrogateescape"))
    assert batches.start is not None and batches.end() is not None, ran.stdout[:200]
    return batches.start, "".join(got).encode("utf-8", "surrogateescape")


def _logs() -> list[tuple[str, bytes]]:
    rnd = random.Random(7)
    short = b"".join(b"%05d \xc3\xa9 %s\n" % (i, b"x" * rnd.randint(0, 120)) for i in range(3000))
    return [
        ("empty", b""),
        ("one line, no newline", b"only \xe2\x9c\x93"),
        ("one line", b"only\n"),
        ("blank lines", b"\n\n\n"),
        ("many short lines", short),
        ("many, the last without newline", short + b"last"),
        ("lines longer than a block", b"a" * 70_000 + b"\n" + b"b" * 140_000 + b"\n" + b"c" * 5 + b"\n"),
        ("a newline on a block boundary", b"x" * 65_535 + b"\n" + b"y" * 65_535 + b"\n" + b"z"),
        ("no newline in 200 KB", b"q" * 200_000),
        ("protocol-looking lines", b"@@start 9\n@@. 3\n@@end 0 1\n@@@x\n"),
    ]


@pytest.mark.parametrize("reader", ["python", "shell"])
@pytest.mark.parametrize(("name", "data"), _logs(), ids=[name for name, _ in _logs()])
def test_the_tail_starts_at_the_nth_last_complete_line(
    tmp_path: Path, reader: str, name: str, data: bytes
) -> None:
    (tmp_path / "node.log").write_bytes(data)
    for ended in (False, True):
        if ended:
            (tmp_path / "node.log.rc").write_text("0\n")
        for n in (0, 1, 2, 2999, 3001, 10**6):
            start, rest = start_of(reader, tmp_path, n)
            assert start == reference(data, n, ended), (name, n, ended)
            # and the reader then sends the log from there (complete lines; all once it ended)
            end = len(data) if ended else data.rfind(b"\n") + 1
            body = data[start:end] + (b"" if data[start:end].endswith(b"\n") or start == end else b"\n")
            assert rest == body, (name, n, ended)


@pytest.mark.parametrize("reader", ["python", "shell"])
def test_no_log_yet_starts_at_zero(tmp_path: Path, reader: str) -> None:
    assert start_of(reader, tmp_path, 5) == (0, b"")


def shown_tail(data: bytes, n: int, ended: bool, samples: str) -> tuple[int, list[bytes]]:
    """Where the last ``n`` lines `logs` shows start (its samples not shown, not counted), and those
    lines, the slow way."""
    end = len(data) if ended else data.rfind(b"\n") + 1
    lines, at = [], 0
    while at < end:
        cut = data.find(b"\n", at, end)
        stop = end if cut < 0 else cut + 1
        lines.append((at, data[at:stop].rstrip(b"\n")))
        at = stop
    shown = [(at, line) for at, line in lines if plain(line.decode(), samples) == line.decode()]
    if n == 0:
        return end, []
    if n > len(shown):
        return 0, [line for _, line in shown]
    return shown[-n][0], [line for _, line in shown[-n:]]


def _sampled_log(samples: str, other: str) -> bytes:
    """Lines a run printed, with the node's samples between them (and after the last), one record of
    another nonce (a line like any other: shown), and a last line still being written."""
    out = []
    for i in range(4000):  # past the shell reader's first window (64 KiB)
        out.append(b"[default0]:step %d\n" % i)
        if i % 3 == 0:
            out.append(record(samples, "gpu", "0, 87, 1200, 8000").encode())
        if i % 5 == 0:
            out.append(record(samples, "cpu", "1.5", "8").encode())
    out.append(record(other, "gpu", "0, 1, 2, 3").encode())
    out.append(record(samples, "gpu", "0, 90, 1300, 8000").encode())
    out.append(record(samples, "cpu", "2.0", "8").encode())
    return b"".join(out) + b"[default0]:partial"


@pytest.mark.parametrize("reader", ["python", "shell"])
def test_the_nodes_samples_are_not_among_the_n_lines(tmp_path: Path, reader: str) -> None:
    """`logs --tail N` shows N lines: the node's samples (records of the run's sample nonce in its
    log, which `logs` does not show) are not counted; a record of another nonce is a line shown."""
    samples, other = new_nonce(), new_nonce()
    data = _sampled_log(samples, other)
    (tmp_path / "node.log").write_bytes(data)
    for ended in (False, True):
        if ended:
            (tmp_path / "node.log.rc").write_text("0\n")
        for n in (0, 1, 2, 3, 50, 3999, 10**4):
            start, rest = start_of(reader, tmp_path, n, samples)
            want, lines = shown_tail(data, n, ended, samples)
            assert start == want, (n, ended)
            text = plain(rest.decode(), samples)
            assert [line.encode() for line in text.split("\n") if line] == lines, (n, ended)
            if n <= 3:  # as many lines as asked, however many samples came after them
                assert len(lines) == n


def test_a_follow_waiting_for_a_node_to_answer_again_says_so_from_time_to_time(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`logs -f` reconnects to a node that went away for up to 300 s: a note now and then says it
    still tries (it was silent, and looked hung)."""
    from orchestrator.errors import UnreachableError
    from orchestrator.inventory import Node
    from orchestrator.runs import control

    monkeypatch.setattr(control, "RECONNECT_NOTE_EVERY", 0.0)
    monkeypatch.setattr(control.time, "sleep", lambda _seconds: None)
    answers = [UnreachableError("cannot connect to 10.0.0.3:22: No route to host")] * 3

    class Gone:
        def connect(self) -> None:
            if answers:
                raise answers.pop()

    notes: list[str] = []
    node = Node(name="node3", host="10.0.0.3")
    control._reconnect(Gone(), node, time.monotonic() + 300, notes.append)  # type: ignore[arg-type]
    assert len(notes) == 3 and not answers
    said = "still reconnecting after 0 s (cannot connect to 10.0.0.3:22: No route to host)"
    assert notes[0].startswith(said)
    assert notes[0].endswith("gives up after 300 s")
