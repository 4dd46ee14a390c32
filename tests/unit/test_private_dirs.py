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
from orchestrator.platforms import Platform, PosixShell, PowerShell, WslShell
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
def test_the_run_directory_is_always_created_private(platform: PosixShell | PowerShell) -> None:
    script = prepare_script(platform, "~/cluster-bootstrap/runs/r1/n1", "~/cluster-bootstrap/code")
    assert platform.mkdir("~/cluster-bootstrap/runs/r1/n1", private=True) in script
    assert platform.mkdir("~/cluster-bootstrap/code") in script


def test_posix_run_directories_are_0700_even_where_they_existed(tmp_path: Path) -> None:
    run_dir, code = tmp_path / "runs" / "r1" / "n1", tmp_path / "code"
    run_dir.mkdir(parents=True, mode=0o755)
    run_dir.chmod(0o755)  # an earlier, failed prepare under a permissive umask
    script = prepare_script(PosixShell(), str(run_dir), str(code))
    done = subprocess.run(["/bin/sh", "-c", script], capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    assert stat.S_IMODE(run_dir.stat().st_mode) == 0o700
    assert code.is_dir()
