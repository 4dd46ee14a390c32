"""Run directories are private on every platform: the launch script written there may hold
``train.env`` secrets. ``mkdir(private=True)`` must mean something on each platform (one of them
once ignored the flag), and both launch paths create the run directory through one function.

What the PowerShell statement does is asserted on its parse tree in test_platform_powershell.py,
and through the WinRM test server in tests/integration/test_launch_windows.py."""

from __future__ import annotations

import stat
import subprocess
from pathlib import Path

import pytest

import orchestrator.platforms
from orchestrator.platforms import UNSAFE_DIR_EXIT, Platform, PosixShell, PowerShell, WslShell
from orchestrator.steps.launch import prepare_script

PLATFORMS: list[Platform] = [PosixShell(), WslShell("Ubuntu"), PowerShell()]


def _subclasses(cls: type) -> set[type]:
    found: set[type] = set()
    sub: type
    for sub in cls.__subclasses__():
        found |= {sub, *_subclasses(sub)}
    return found


def test_every_platform_of_the_product_is_held_to_the_contract() -> None:
    ours = {c for c in _subclasses(Platform) if c.__module__.startswith(orchestrator.platforms.__name__)}
    assert ours == {type(p) for p in PLATFORMS}, "add the new platform to PLATFORMS"


@pytest.mark.parametrize("platform", PLATFORMS, ids=lambda p: type(p).__name__)
def test_a_private_directory_is_not_a_plain_one(platform: Platform) -> None:
    mkdir = platform.mkdir  # type: ignore[attr-defined]
    plain, private = (
        mkdir("~/cluster-bootstrap/runs/r1/n1"),
        mkdir("~/cluster-bootstrap/runs/r1/n1", private=True),
    )
    assert private != plain


@pytest.mark.parametrize("platform", PLATFORMS, ids=lambda p: type(p).__name__)
def test_the_run_directory_is_always_created_new_and_private(platform: PosixShell | PowerShell) -> None:
    script = prepare_script(platform, "~/cluster-bootstrap/runs/r1/n1", "~/cluster-bootstrap/code")
    assert platform.new_private_dir("~/cluster-bootstrap/runs/r1/n1") in script
    assert platform.mkdir("~/cluster-bootstrap/code") in script
    # a run directory someone else made is refused before its node.log is even looked at
    assert script.index(platform.check_own_dir("~/cluster-bootstrap/runs/r1/n1")) < script.index("node.log")


def _sh(script: str, umask: int = 0o022) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["/bin/sh", "-c", f"umask {umask:03o}\n{script}"], capture_output=True, text=True, timeout=30
    )


def test_posix_run_directories_are_created_0700_with_parents_no_one_else_can_write(tmp_path: Path) -> None:
    run_dir, code = tmp_path / "w" / "runs" / "r1" / "n1", tmp_path / "code"
    done = _sh(prepare_script(PosixShell(), str(run_dir), str(code)), umask=0)
    assert done.returncode == 0, done.stderr
    assert stat.S_IMODE(run_dir.stat().st_mode) == 0o700
    # a umask of 0 would have made them 0777: another user could swap the run directory
    for parent in (tmp_path / "w", tmp_path / "w" / "runs", run_dir.parent):
        assert stat.S_IMODE(parent.stat().st_mode) & 0o022 == 0, parent
    # nor the code directory, which the training script runs from (and imports beside it from)
    assert code.is_dir() and stat.S_IMODE(code.stat().st_mode) & 0o022 == 0


def test_a_code_directory_others_can_write_to_is_refused_before_the_run_directory_is_made(
    tmp_path: Path,
) -> None:
    run_dir, code = tmp_path / "w" / "runs" / "r1" / "n1", tmp_path / "code"
    code.mkdir()
    code.chmod(0o777)
    done = _sh(prepare_script(PosixShell(), str(run_dir), str(code)))
    assert done.returncode == UNSAFE_DIR_EXIT, done
    assert done.stderr.startswith(f"refusing {code}: other users can write to it"), done.stderr
    assert not (tmp_path / "w").exists()


def _refusal(done: subprocess.CompletedProcess[str], path: Path, *words: str) -> str:
    assert done.returncode == UNSAFE_DIR_EXIT, (done.returncode, done.stderr)
    (line,) = done.stderr.splitlines()
    assert line.startswith(f"refusing {path}: "), line
    for word in words:
        assert word in line, line
    return line


def test_posix_a_run_directory_that_exists_is_refused(tmp_path: Path) -> None:
    """An earlier, failed prepare, or a directory another user made for us to use: never taken."""
    run_dir, code = tmp_path / "runs" / "r1" / "n1", tmp_path / "code"
    run_dir.mkdir(parents=True)
    run_dir.chmod(0o755)
    done = _sh(prepare_script(PosixShell(), str(run_dir), str(code)))
    _refusal(done, run_dir, "exists already", "mode 0755", "--run-id")
    assert stat.S_IMODE(run_dir.stat().st_mode) == 0o755  # left as it was: nothing chmod-ed
    assert not code.exists()


@pytest.mark.parametrize("mode", [0o777, 0o775, 0o757])
def test_posix_a_parent_others_can_write_without_the_sticky_bit_is_refused(tmp_path: Path, mode: int) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(mode)
    run_dir = shared / "w" / "runs" / "r1" / "n1"
    done = _sh(PosixShell().new_private_dir(str(run_dir)))
    _refusal(done, shared, f"mode 0{mode:o}", "sticky", "chmod go-w")
    assert not (shared / "w").exists()


def test_posix_a_sticky_directory_all_can_write_is_a_fine_parent(tmp_path: Path) -> None:
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    scratch.chmod(0o1777)  # /tmp: others cannot rename or remove what is ours in it
    run_dir = scratch / "w" / "runs" / "r1" / "n1"
    done = _sh(PosixShell().new_private_dir(str(run_dir)))
    assert done.returncode == 0, done.stderr
    assert stat.S_IMODE(run_dir.stat().st_mode) == 0o700


def test_posix_a_symbolic_link_on_the_path_is_followed_and_what_it_names_checked(tmp_path: Path) -> None:
    wide = tmp_path / "wide"
    wide.mkdir()
    wide.chmod(0o777)
    (tmp_path / "to-wide").symlink_to(wide)
    done = _sh(PosixShell().new_private_dir(str(tmp_path / "to-wide" / "runs" / "r1" / "n1")))
    _refusal(done, wide, "mode 0777")
    (tmp_path / "dangling").symlink_to(tmp_path / "nowhere")
    done = _sh(PosixShell().new_private_dir(str(tmp_path / "dangling" / "runs" / "r1" / "n1")))
    _refusal(done, tmp_path / "dangling", "does not exist")
    good = tmp_path / "good"
    good.mkdir()
    (tmp_path / "to-good").symlink_to(good)
    done = _sh(PosixShell().new_private_dir(str(tmp_path / "to-good" / "runs" / "r1" / "n1")))
    assert done.returncode == 0, done.stderr
    assert (good / "runs" / "r1" / "n1").is_dir()


@pytest.mark.parametrize("mode", [0o777, 0o770, 0o1777])
def test_posix_files_in_a_run_directory_others_can_write_are_not_trusted(tmp_path: Path, mode: int) -> None:
    run_dir = tmp_path / "runs" / "r1" / "n1"
    run_dir.mkdir(parents=True)
    run_dir.chmod(mode)
    done = _sh(PosixShell().check_own_dir(str(run_dir)) + "\necho read-the-pid")
    _refusal(done, run_dir, f"mode {mode:04o}")
    assert "read-the-pid" not in done.stdout
    run_dir.chmod(0o700)
    assert _sh(PosixShell().check_own_dir(str(run_dir))).returncode == 0
    # nothing there: nothing to trust, nothing refused (status says "no run")
    assert _sh(PosixShell().check_own_dir(str(tmp_path / "runs" / "r2" / "n1"))).returncode == 0
