"""The test server's model of Windows processes (tests/winrm_server/processes.py), which the native run
tests rely on: a child is in its parent's job, a job holds at most MaxProcessesPerShell live
processes, closing a job ends exactly its processes (real ones too), a process made by
``Win32_Process`` Create is in no job, and identities ("PID TICKS") name one process only."""

from __future__ import annotations

import sys

import pytest

from tests.winrm_server.processes import QUOTA_MESSAGE, ProcessTable, QuotaExceeded


def test_children_are_in_their_parents_job_and_the_quota_counts_live_ones() -> None:
    table = ProcessTable(max_processes_per_shell=3)
    shell = table.create("powershell.exe", parent=None, job="SHELL-1")
    first = table.create("python.exe", parent=shell)
    second = table.create("python.exe", parent=first)
    assert {p.job for p in (shell, first, second)} == {"SHELL-1"}
    with pytest.raises(QuotaExceeded, match=QUOTA_MESSAGE):
        table.create("python.exe", parent=shell)
    assert table.refused == ["SHELL-1: python.exe"]
    table.exited(second, 0)  # a process that ended no longer counts
    table.create("python.exe", parent=shell)
    # outside every job (Win32_Process Create): no quota, and its children are outside too
    outside = table.create("powershell.exe", parent=None, job=None)
    ranks = [table.create("python.exe", parent=outside) for _ in range(5)]
    assert {p.job for p in ranks} == {None}


def test_closing_a_job_ends_its_processes_and_no_other() -> None:
    table = ProcessTable()
    shell = table.create("powershell.exe", parent=None, job="SHELL-1")
    real = table.create(
        "python.exe", parent=shell, argv=[sys.executable, "-c", "import time; time.sleep(60)"]
    )
    outside = table.create("powershell.exe", parent=None, job=None)
    ended = table.terminate_job("SHELL-1")
    assert set(ended) == {shell, real} and outside.alive
    assert real.linux is not None and real.linux.poll() is not None  # the real process is gone
    assert real.terminated and real.exit_code == 1
    assert table.live() == [outside]


def test_identities_name_one_process_and_descendants_are_created_after_their_parent() -> None:
    table = ProcessTable()
    launcher = table.create("powershell.exe", parent=None, job=None)
    rank = table.create("python.exe", parent=launcher)
    worker = table.create("python.exe", parent=rank)
    assert table.by_identity(launcher.identity) is launcher
    assert table.by_identity(f"{launcher.pid} {launcher.ticks + 1}") is None  # a recycled id: not it
    assert table.descendants(launcher) == [rank, worker]
    assert table.terminate_tree(launcher) == [launcher, rank, worker]
    assert table.by_identity(launcher.identity) is None
