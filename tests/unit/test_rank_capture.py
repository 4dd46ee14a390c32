"""The node's rank capture (steps/probes/rank_capture.py) on its own: how a rank file's bytes become
labelled lines. End to end (torchrun, ranks at full speed): tests/e2e/test_rank_lines.py."""

from __future__ import annotations

import ast
import importlib.util
import inspect
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from orchestrator import records
from orchestrator.resources import package_file


def _capture() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "rank_capture", package_file("steps/probes/rank_capture.py")
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_line_longer_than_the_limit_becomes_labelled_lines_of_the_limit(tmp_path: Path) -> None:
    """A rank printing 2.5 MiB without a newline (a progress bar drawn with \\r forever, a dump):
    memory stays bounded and every piece keeps its rank's label, so `logs` and the terminal never
    show a piece as another rank's or as nobody's."""
    rc = _capture()
    path = tmp_path / "rank-1-attempt-0.out"
    limit = rc.MAX_PARTIAL
    path.write_bytes(b"before\n" + b"x" * (2 * limit + limit // 2))
    f = rc.RankFile(str(path), "1", 0)
    lines = f.read().split(b"\n")
    assert lines[0] == b"[default1]:before"
    assert lines[1:3] == [b"[default1]:" + b"x" * limit] * 2 and lines[3] == b""
    with path.open("ab") as handle:
        handle.write(b"tail\nafter\n")
    assert f.read() == b"[default1]:" + b"x" * (limit // 2) + b"tail\n[default1]:after\n"
    assert f.finish() == b""


def test_a_bar_redrawn_with_carriage_returns_is_sent_as_its_newest_state_while_it_is_drawn(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """tqdm draws its bar with "\r" and no newline for a whole epoch: nothing showed until the epoch
    ended. The bar's newest state goes out at once, then every PROGRESS_EVERY seconds while it is
    redrawn, as a ``progress`` record (not a line: node.log keeps the rank's lines as they were);
    the line itself goes out once complete, every byte of it."""
    rc = _capture()
    monkeypatch.setattr(rc, "PROGRESS", [NONCE])  # mux sets it: a launch's sample nonce
    path = tmp_path / "rank-0-attempt-0.out"
    path.write_bytes(b"epoch 1\n\r 10%|#   |\r 20%|##  |")
    f = rc.RankFile(str(path), "0", 0)
    first = f.read()
    assert first.startswith(b"[default0]:epoch 1\n")
    assert records.decode(first.decode(), NONCE) == [records.Record("progress", (b"0", b" 20%|##  |"))]
    with path.open("ab") as handle:
        handle.write(b"\r 30%|### |\r100%|####|\n")  # within PROGRESS_EVERY: no state, the line
    assert f.read() == b"[default0]:\r 10%|#   |\r 20%|##  |\r 30%|### |\r100%|####|\n"
    with path.open("ab") as handle:
        handle.write(b"\rA\rB")
    monkeypatch.setattr(rc, "PROGRESS", [""])  # without a nonce (validate's workers): lines only
    f.drawn_at = 0.0
    assert f.read() == b""
    assert f.finish() == b"[default0]:\rA\rB\n"


FAKE_SMI = Path(__file__).resolve().parents[1] / "data" / "nvidia_smi"
NONCE = "cb-0123456789ab"


def test_the_node_side_record_encoder_is_the_codecs() -> None:
    """rank_capture.py is uploaded alone (standard library only): its copy of the encoder must
    write exactly what orchestrator/records.py decodes."""
    mine = ast.parse(inspect.getsource(_capture().record))
    theirs = ast.parse(records.PYTHON_ENCODER)
    assert ast.dump(mine) == ast.dump(theirs)


def test_a_sample_is_the_gpus_nvidia_smi_reports_else_the_cpu_load(monkeypatch: pytest.MonkeyPatch) -> None:
    rc = _capture()
    monkeypatch.setenv("PATH", f"{FAKE_SMI}:/usr/bin:/bin")
    gpu = records.decode(rc.sample(NONCE), NONCE)
    assert gpu == [records.Record("gpu", (b"0, 87, 20513, 24576", b"1, 3, 1024, 24576"))]
    monkeypatch.setenv("CB_FAKE_GPU_NODE", "no-such-host")  # nvidia-smi fails: a broken driver
    (cpu,) = records.decode(rc.sample(NONCE), NONCE)
    assert cpu.kind == "cpu" and float(cpu.text(0)) >= 0 and int(cpu.text(1)) == os.cpu_count()
    monkeypatch.setenv("PATH", "/usr/bin:/bin")  # no nvidia-smi at all
    assert records.decode(rc.sample(NONCE), NONCE)[0].kind == "cpu"


def test_mux_writes_the_samples_between_whole_lines(tmp_path: Path) -> None:
    """With CB_SAMPLE_NONCE, the samples reach the stream as records while the command runs (the
    first at once), never inside a line; without it, none."""
    go_on = tmp_path / "go-on"
    command = [
        sys.executable,
        "-c",
        f"import os, time\nwhile not os.path.exists({str(go_on)!r}): time.sleep(0.01)",
    ]
    env = {**os.environ, "PATH": f"{FAKE_SMI}:/usr/bin:/bin", "CB_SAMPLE_NONCE": NONCE}
    script = str(package_file("steps/probes/rank_capture.py"))
    with subprocess.Popen(
        [sys.executable, script, "mux", str(tmp_path / "ranks"), *command], stdout=subprocess.PIPE, env=env
    ) as mux:
        assert mux.stdout is not None
        first = mux.stdout.readline().decode()  # the first sample, before the command ends
        go_on.touch()
        rest = mux.stdout.read().decode()
    assert mux.returncode == 0
    assert records.decode(first, NONCE) == [
        records.Record("gpu", (b"0, 87, 20513, 24576", b"1, 3, 1024, 24576"))
    ]
    assert records.plain(rest, NONCE).strip() == ""
    del env["CB_SAMPLE_NONCE"]
    quiet = subprocess.run(
        [sys.executable, script, "mux", str(tmp_path / "ranks2"), sys.executable, "-c", "print('hi')"],
        capture_output=True,
        env=env,
        check=True,
    )
    assert quiet.stdout == b"hi\n"


CAPTURE = str(package_file("steps/probes/rank_capture.py"))


def _await(condition: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)


def _gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            return fh.read().rsplit(b")", 1)[1].split()[0] == b"Z"
    except FileNotFoundError:
        return True


def _reader_of(pipe: str) -> int:
    """The process whose stdin is ``pipe`` (``pipe:[inode]``): the rank's drainer."""
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and os.readlink(entry / "fd" / "0") == pipe:
                return int(entry.name)
        except OSError:
            continue
    raise AssertionError(f"nothing reads {pipe}")


def test_a_killed_rank_group_still_leaves_every_byte_in_the_rank_file(tmp_path: Path) -> None:
    """The rank prints into a pipe (a write there costs it less than a file append), yet what it
    printed before its whole process group was SIGKILLed (torchrun's last resort, a stop's KILL) is
    all in its file, even what the drainer had not read yet: the drainer appending the pipe is in
    no group or run a stop signals. The rank is still the worker's own process (exec: torchrun's
    signals reach the training process)."""
    lines = 5_000  # under a default pipe's 64 KiB: the rank never waits for the stopped drainer
    go, pid_file = tmp_path / "go", tmp_path / "pid"
    script = (
        "import os, stat, sys, time\n"
        "print('started')\n"
        f"while not os.path.exists({str(go)!r}): time.sleep(0.01)\n"
        f"for i in range({lines}): print('line %d' % i)\n"
        "fifo = stat.S_ISFIFO(os.fstat(1).st_mode)\n"
        f"open({str(pid_file)!r} + '.part', 'w').write('%d %d' % (os.getpid(), fifo))\n"
        f"os.rename({str(pid_file)!r} + '.part', {str(pid_file)!r})\n"
        "time.sleep(600)\n"
    )
    ranks = tmp_path / "ranks"
    ranks.mkdir()
    path = ranks / "rank-3-attempt-0.out"
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "LOCAL_RANK": "3"}
    rank = subprocess.Popen(  # a group of its own, as torchrun starts each rank
        [sys.executable, CAPTURE, "worker", str(ranks), sys.executable, "-c", script],
        env=env,
        start_new_session=True,
    )
    drainer = None
    try:
        _await(lambda: path.exists() and path.read_text() == "started\n", 60, "the rank's first line")
        drainer = _reader_of(os.readlink(f"/proc/{rank.pid}/fd/1"))
        # `stop --run` signals every process carrying the run's marker in its environment
        assert Path(f"/proc/{drainer}/environ").read_bytes() == b""
        os.kill(drainer, signal.SIGSTOP)  # the rank's next lines stay in the pipe
        go.touch()
        _await(lambda: pid_file.exists() or rank.poll() is not None, 60, "the rank's lines")
        pid, fifo = map(int, pid_file.read_text().split())
        os.killpg(rank.pid, signal.SIGKILL)
        rank.wait()
    finally:
        if drainer is not None:
            os.kill(drainer, signal.SIGCONT)
        rank.kill()
        rank.wait()
    assert pid == rank.pid and fifo == 1
    expected = "started\n" + "".join(f"line {i}\n" for i in range(lines))
    _await(lambda: len(path.read_text()) >= len(expected), 10, "the drainer to append every line")
    assert path.read_text() == expected


def test_an_earlier_attempt_first_seen_beside_its_restart_waits_for_its_drainer(tmp_path: Path) -> None:
    """Both attempts' files appear between two scans (a quick restart, a busy machine): the earlier
    attempt, never read yet, is not called complete while its drainer still holds its lock (a
    child the attempt left still prints into it); its later lines are forwarded, not lost."""
    import fcntl

    rc = _capture()
    first = tmp_path / "rank-0-attempt-0.out"
    first.write_bytes(b"first\n")
    (tmp_path / "rank-0-attempt-1.out").write_bytes(b"again\n")
    drainer = os.open(first, os.O_WRONLY | os.O_APPEND)  # as the drainer: its lock until it ends
    fcntl.flock(drainer, fcntl.LOCK_EX)
    files: dict[str, Any] = {}
    try:
        rc.scan(str(tmp_path), files)
        out = rc.drain(files, final=False)
        os.write(drainer, b"late 0\n")
    finally:
        os.close(drainer)  # the drainer has appended its last byte and ended
    out += rc.drain(files, final=False) + rc.drain(files, final=True)
    assert sorted(out.decode().splitlines()) == ["[default0]:again", "[default0]:first", "[default0]:late 0"]


def test_output_a_rank_left_to_its_children_reaches_the_stream(tmp_path: Path) -> None:
    """A process the rank started inherits its output and may print after the rank (and torchrun)
    ended: the mux waits for that output's end (up to DRAIN_WAIT) and forwards it, then ends; a
    restarted rank's earlier attempt likewise."""
    go = tmp_path / "go"
    pids = tmp_path / "pids"
    late = (
        f"echo $$ >> {pids}; echo first; "
        f"(while [ ! -e {go} ]; do sleep 0.01; done; echo late $TORCHELASTIC_RESTART_COUNT) &"
    )
    worker = f"{sys.executable} {CAPTURE} worker {tmp_path / 'ranks'} /bin/sh -c '{late}'"
    # attempt 0 ends at once, attempt 1 a moment later: both leave a child printing after them
    torchrun = f"TORCHELASTIC_RESTART_COUNT=0 {worker}; TORCHELASTIC_RESTART_COUNT=1 {worker}"
    env = {**os.environ, "LOCAL_RANK": "0"}
    with subprocess.Popen(
        [sys.executable, CAPTURE, "mux", str(tmp_path / "ranks"), "/bin/sh", "-c", torchrun],
        stdout=subprocess.PIPE,
        env=env,
    ) as mux:
        _await(lambda: pids.exists() and len(pids.read_text().split()) == 2, 30, "both attempts")
        _await(lambda: all(_gone(int(p)) for p in pids.read_text().split()), 30, "both attempts to end")
        go.touch()
        assert mux.stdout is not None
        out = mux.stdout.read().decode()
    assert mux.returncode == 0
    assert sorted(out.splitlines()) == [
        "[default0]:first",
        "[default0]:first",
        "[default0]:late 0",
        "[default0]:late 1",
    ], out
    assert (tmp_path / "ranks" / "rank-0-attempt-0.out").read_text() == "first\nlate 0\n"
