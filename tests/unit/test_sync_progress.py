"""What a long sync shows while it runs: the activity read from the installer's lines, the bytes it
reports, and the progress lines piped output gets (pure parts; the live runs are in
tests/integration/test_env_sync_shared.py and tests/e2e/test_newcomer.py)."""

from __future__ import annotations

import io
from typing import Any

import pytest

from orchestrator.cli.ui import UI, Board
from orchestrator.executor import NodeEvent
from orchestrator.steps.envsync.progress import InstallProgress


def _after(lines: list[str]) -> tuple[str, str]:
    progress = InstallProgress()
    for line in lines:
        progress.feed(line)
    snap = progress.snapshot()
    return snap.activity, snap.detail()


def test_pip_without_byte_counts_shows_the_package_and_the_size_it_announced() -> None:
    lines = [
        "Looking in links: /srv/wheels",
        "Collecting torch==2.13.0+cpu (from -r req.txt (line 4))",
        "  Downloading https://download.pytorch.org/whl/cpu/torch-2.13.0%2Bcpu-cp311-cp311-linux_x86_64.whl "
        "(191.8 MB)",
    ]
    assert _after(lines) == ("downloading torch, 182.9 MiB", "")
    # the next line means that download ended: its bytes count
    lines.append("Collecting numpy==2.4.6 (from -r req.txt (line 2))")
    assert _after(lines) == ("collecting numpy", "182.9 MiB downloaded")
    lines += [
        "  Downloading numpy-2.4.6-cp311-cp311-manylinux_2_28_x86_64.whl (16.9 MB)",
        "Installing collected packages: numpy, filelock, torch",
    ]
    assert _after(lines) == ("installing torch and 2 more", "199 MiB downloaded")


def test_pip_raw_progress_counts_bytes_while_a_file_downloads() -> None:
    lines = [
        "Collecting torch==2.13.0+cpu",
        "  Downloading torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl (191.8 MB)",
        "Progress 0 of 191800000",
        "Progress 120000000 of 191800000",
    ]
    assert _after(lines) == ("downloading torch", "114.4 MiB downloaded")


def test_local_wheels_and_uv_lines() -> None:
    assert _after(["Processing /opt/wheels/torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl"]) == (
        "unpacking torch",
        "",
    )
    uv = ["Resolved 11 packages in 20ms", "Downloading torch (183.0MiB)"]
    activity, _ = _after(uv)
    assert activity.startswith("downloading torch") and "183 MiB" in activity
    assert _after([*uv, " Downloaded torch", "Prepared 11 packages in 30s"]) == (
        "installing",
        "183 MiB downloaded",
    )


class _Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def piped(monkeypatch: pytest.MonkeyPatch) -> tuple[UI, io.StringIO, _Clock]:
    err = io.StringIO()
    monkeypatch.setattr("sys.stderr", err)
    clock = _Clock()
    monkeypatch.setattr("orchestrator.progress.time.monotonic", clock)
    ui = UI(color=False)
    assert not ui.live  # a StringIO is no terminal
    return ui, err, clock


def test_piped_progress_lines_come_every_interval_only_while_a_node_works(piped: Any) -> None:
    ui, _err, clock = piped
    board = Board(ui, ["node1", "node2"], "env", interval=10)
    for node in ("node1", "node2"):
        board.on_event(NodeEvent(node, "start", "env build"))
    board.update("node2", "installing torch", "1.2 GB downloaded")
    clock.now += 5
    assert board.due(clock.now) == []  # quick work prints nothing but its end
    clock.now += 40
    assert board.due(clock.now) == ["node1", "node2"]
    assert board.line("node2", clock.now) == "[node2] installing torch (1.2 GB downloaded, 45 s)"
    assert board.line("node1", clock.now) == "[node1] env build (45 s)"
    clock.now += 3
    assert board.due(clock.now) == []  # 10 s between two lines of one node
    board.on_event(NodeEvent("node1", "done", "env build"))
    clock.now += 10
    assert board.due(clock.now) == ["node2"]


def test_a_nodes_second_phase_waits_a_whole_interval_for_its_first_line(piped: Any) -> None:
    """sync's env step is two fan-outs (check, then build): the build's first line comes an interval
    after the build started, never "(0 s)" because the check's last line was long ago."""
    ui, _err, clock = piped
    board = Board(ui, ["node1"], "env", interval=2)
    board.on_event(NodeEvent("node1", "start", "env check"))
    clock.now += 3
    assert board.due(clock.now) == ["node1"]
    assert board.line("node1", clock.now) == "[node1] env check (3 s)"
    board.on_event(NodeEvent("node1", "done", "env check"))
    clock.now += 5
    board.on_event(NodeEvent("node1", "start", "env build"))
    clock.now += 0.5
    assert board.due(clock.now) == []
    clock.now += 1.5
    assert board.due(clock.now) == ["node1"]
    assert board.line("node1", clock.now) == "[node1] env build (2 s)"


def test_a_finished_node_ignores_late_progress(piped: Any) -> None:
    ui, err, _clock = piped
    board = Board(ui, ["node1"], "code", interval=10)
    board.on_event(NodeEvent("node1", "start", "code sync"))
    board.on_event(NodeEvent("node1", "failed", "code sync", "refused"))
    board.update("node1", "sending 3 files (12.0 kB)")
    assert "node1: code sync FAILED" in err.getvalue()
    assert board.due(10**6) == []


def test_node_text_in_progress_is_neutralised(piped: Any) -> None:
    ui, _err, _clock = piped
    board = Board(ui, ["node1"], "env", interval=10)
    board.on_event(NodeEvent("node1", "start", "env build"))
    board.update("node1", "collecting \x1b[2Jevil")
    assert "\x1b" not in board.line("node1")


def test_the_same_failure_of_a_node_in_one_step_is_one_line() -> None:
    """A node whose host key is unknown fails each of check's fan-outs the same way: one line."""
    from orchestrator.progress import NodeProgress

    board = NodeProgress(["node1", "node2"], "check", 1.0)
    lines = []
    for _ in range(3):
        board.on_event(NodeEvent("node1", "start", "check"))
        lines.append(board.on_event(NodeEvent("node1", "failed", "check", "host key unknown")))
    board.on_event(NodeEvent("node1", "start", "check"))
    other = board.on_event(NodeEvent("node1", "failed", "check", "connection refused"))
    assert [line for line in lines if line] == [lines[0]] and lines[0] and "check FAILED" in lines[0]
    assert other is not None and "check FAILED" in other  # another failure is said
