"""What another user may plant in a POSIX run directory is neither written through nor believed: the
run scripts (runs/posix.py) run here with /bin/sh. The same attacks by a real second user on a node
are tests/e2e/test_hostile_local_user.py."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from orchestrator import records
from orchestrator.platforms import UNSAFE_DIR_EXIT, PosixShell
from orchestrator.runs.posix import PosixRuns
from tests.noderecords import NONCE

ops = PosixRuns(PosixShell())


def _sh(script: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["/bin/sh", "-c", script], capture_output=True, text=True, timeout=60)


@pytest.fixture
def bystander() -> Iterator[subprocess.Popen[bytes]]:
    """A process that belongs to no run."""
    proc = subprocess.Popen(["sleep", "300"])
    yield proc
    proc.kill()
    proc.wait()


def _pid_line(pid: int) -> str:
    stat = Path(f"/proc/{pid}/stat").read_text()
    fields = stat.rsplit(") ", 1)[1].split()
    return f"{pid} {fields[3]} {fields[19]}\n"  # PID SESSION STARTTIME, as run_identity writes it


@pytest.mark.parametrize("mode", [0o777, 0o1777, 0o770])
def test_stop_signals_nothing_a_pid_file_names_in_a_directory_others_can_write(
    tmp_path: Path, bystander: subprocess.Popen[bytes], mode: int
) -> None:
    run_dir = tmp_path / "runs" / "x" / "n1"
    run_dir.mkdir(parents=True)
    run_dir.chmod(mode)
    (run_dir / "pid").write_text(_pid_line(bystander.pid))
    done = _sh(ops.stop(str(run_dir), "x/n1", 0.5, NONCE))
    assert done.returncode == UNSAFE_DIR_EXIT, done
    assert list(records.decode(done.stdout, NONCE)) == []
    assert done.stderr.startswith(f"refusing {run_dir}: ")
    assert bystander.poll() is None  # still running
    status = _sh(ops.status(str(run_dir), "x/n1", f"{run_dir}/node.log", NONCE))
    assert status.returncode == UNSAFE_DIR_EXIT
    assert list(records.decode(status.stdout, NONCE)) == []


def test_the_launcher_identity_is_not_written_through_a_planted_link(tmp_path: Path) -> None:
    run_dir = tmp_path / "n1"
    run_dir.mkdir(mode=0o700)
    victim = tmp_path / "victim"
    victim.write_text("root's own\n")
    os.symlink(victim, run_dir / "pid.part")
    done = _sh(ops.run_identity(str(run_dir), "x/n1") + "\necho after")
    assert "after" in done.stdout
    assert victim.read_text() == "root's own\n"
    assert not (run_dir / "pid").exists()


def test_the_exit_code_is_not_written_through_a_planted_link(tmp_path: Path) -> None:
    run_dir = tmp_path / "n1"
    run_dir.mkdir(mode=0o700)
    victim = tmp_path / "victim"
    victim.write_text("root's own\n")
    os.symlink(victim, run_dir / "node.log.rc.part")
    _sh(ops.logged("echo hello", str(run_dir / "node.log")))
    assert victim.read_text() == "root's own\n"
    assert (run_dir / "node.log").read_text() == "hello\n"


@pytest.mark.parametrize("python", [None, sys.executable], ids=["sh", "python"])
def test_logs_read_nothing_from_a_run_directory_others_can_write(tmp_path: Path, python: str | None) -> None:
    run_dir = tmp_path / "runs" / "x" / "n1"
    run_dir.mkdir(parents=True)
    run_dir.chmod(0o777)
    (run_dir / "node.log").write_text("planted line\n")
    script = ops.tail(
        str(run_dir),
        "x/n1",
        str(run_dir / "node.log"),
        0,
        nonce=records.new_nonce(),
        follow=False,
        python=python,
        interval=None,
    )
    done = _sh(script)
    assert done.returncode == UNSAFE_DIR_EXIT, done
    assert "planted line" not in done.stdout


def test_a_run_that_removed_its_own_directory_keeps_its_exit_code(tmp_path: Path) -> None:
    """A training script that deletes its run directory: the launcher still exits with the script's
    own code (it left the pipeline through a pipe, not the exit-code file), and one line says why
    the file could not be written; no shell error in its place."""
    run_dir = tmp_path / "runs" / "x" / "n1"
    run_dir.mkdir(parents=True)
    script = f"sh -c 'rm -rf {run_dir}; echo still here; exit 7'"  # one command, as the launcher is
    done = _sh(ops.logged(script, str(run_dir / "node.log")))
    assert done.returncode == 7, done
    assert "still here" in done.stdout
    assert "exit code 7 not recorded" in done.stderr and "the run directory is gone" in done.stderr, done
    assert "Illegal number" not in done.stderr + done.stdout, done


def test_an_exit_code_that_could_not_be_written_is_said_why_and_status_says_no_exit_code(
    tmp_path: Path,
) -> None:
    """A full disk (here: a directory in the way of the exit-code file) kept the launcher from
    recording the run's exit code: it said "the run directory is gone" (it was not), and `status`
    called the node "stopped", exit 0, as if someone had stopped it. Now the launcher says what it
    can tell (the space left there), and status says "no exit code", a failure."""
    from orchestrator.runs.control import parse_status

    run_dir = tmp_path / "runs" / "r1" / "n1"
    run_dir.mkdir(parents=True)
    log = run_dir / "node.log"
    (run_dir / "node.log.rc.part").mkdir()  # what cannot be written, as on a full disk
    ran = _sh(ops.logged("sh -c 'echo trained; exit 3'", str(log)))
    assert ran.returncode == 3 and ran.stdout == "trained\n", ran
    said_why = f"bootstrap: exit code 3 not recorded in {log}.rc: writing there failed (a full disk? "
    assert ran.stderr.startswith(said_why), ran
    assert "KiB free there" in ran.stderr and "gone" not in ran.stderr, ran
    (run_dir / "pid").write_text("999999999 1 1\n")  # a launcher that is gone
    said = _sh(ops.status(str(run_dir), "r1/n1", str(log), NONCE))
    status = parse_status(said.stdout, NONCE)
    assert status.state == "no exit code" and status.failed and status.label == "no exit code", status
