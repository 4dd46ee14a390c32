"""The local transport: streaming, exit codes, timeouts, cancellation, files."""

from __future__ import annotations

import subprocess
import threading
import time
from pathlib import Path

from orchestrator.platforms import PosixShell
from orchestrator.transports import LocalTransport


def test_lines_stream_while_the_command_runs() -> None:
    transport = LocalTransport("n", PosixShell())
    seen: list[tuple[str, str, float]] = []
    gate = Path("/tmp") / f"cb-gate-{time.monotonic_ns()}"

    def on_line(stream: str, line: str) -> None:
        seen.append((stream, line, time.monotonic()))
        if line == "first":
            gate.touch()  # the command waits for this: proves "first" arrived before it ended

    cmd = f"echo first; while [ ! -e {gate} ]; do sleep 0.01; done; echo second; echo oops >&2; exit 3"
    result = transport.run(cmd, on_line=on_line, timeout=20)
    gate.unlink()
    assert [(s, line) for s, line, _ in seen] == [
        ("stdout", "first"),
        ("stdout", "second"),
        ("stderr", "oops"),
    ]
    assert result.exit_code == 3 and not result.ok
    assert result.stdout == "first\nsecond\n" and result.stderr == "oops\n"
    assert result.tail(2) == ["second", "oops"]


def test_partial_last_line_and_split_utf8_are_delivered() -> None:
    lines: list[str] = []
    result = LocalTransport("n", PosixShell()).run(
        "printf '\\303'; printf '\\251t\\303\\251\\nno newline'", on_line=lambda s, line: lines.append(line)
    )
    assert lines == ["été", "no newline"]
    assert result.stdout == "été\nno newline"


def test_timeout_kills_the_whole_process_group() -> None:
    transport = LocalTransport("n", PosixShell())
    marker = f"cb-timeout-{time.monotonic_ns()}"
    result = transport.run(f"sleep 30 & echo $! > /tmp/{marker}; wait", timeout=0.5)
    assert result.timed_out and result.exit_code is None
    pid = int(Path(f"/tmp/{marker}").read_text())
    Path(f"/tmp/{marker}").unlink()
    deadline = time.monotonic() + 5
    while Path(f"/proc/{pid}").exists() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not Path(f"/proc/{pid}").exists() or "Z" in Path(f"/proc/{pid}/stat").read_text().split()[2]


def test_close_from_another_thread_stops_a_running_command() -> None:
    transport = LocalTransport("n", PosixShell())
    started = threading.Event()
    threading.Thread(target=lambda: (started.wait(10), transport.close()), daemon=True).start()
    begin = time.monotonic()
    result = transport.run("echo go; sleep 30", on_line=lambda s, line: started.set())
    assert time.monotonic() - begin < 10
    assert result.exit_code is None


def test_put_and_get_round_trip(tmp_path: Path) -> None:
    transport = LocalTransport("n", PosixShell())
    src = tmp_path / "a.bin"
    src.write_bytes(bytes(range(256)) * 10)
    transport.put(src, str(tmp_path / "deep" / "b.bin"), mode=0o600)
    assert (tmp_path / "deep" / "b.bin").stat().st_mode & 0o777 == 0o600
    transport.get(str(tmp_path / "deep" / "b.bin"), tmp_path / "c.bin")
    assert (tmp_path / "c.bin").read_bytes() == src.read_bytes()


def test_background_children_do_not_hold_a_local_command_open() -> None:
    marker = f"cbt-local-bg-{time.monotonic_ns()}"
    begin = time.monotonic()
    result = LocalTransport("n", PosixShell()).run(f"sh -c 'sleep 300; : {marker}' & echo left a child")
    assert result.ok and result.stdout == "left a child\n"
    assert time.monotonic() - begin < 10
    deadline = time.monotonic() + 10
    while marker in subprocess.run(["pgrep", "-af", marker], capture_output=True, text=True).stdout:
        assert time.monotonic() < deadline, "the left-behind child still runs"
        time.sleep(0.05)
