"""The played Windows node decides from what the product sends: break the product's script the way
issue 32's audit did, and the integration test that backs the behaviour in docs/windows.md fails.

Each test patches the text of one script the product emits (the function that builds it), then runs
the backing integration test itself and expects it to fail. Were the test server doing the
product's work (comparing the hashes itself, creating the launcher outside the job whatever the
script says, hard-coding the watchdog's rules, choosing the processes to stop), these would pass
the broken product and so fail here.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from orchestrator.platforms import transfer
from orchestrator.runs.windows import WindowsRuns
from orchestrator.runs.windows_follow import ForegroundScripts
from tests.integration import test_launch_windows as launch
from tests.integration import test_winrm_windows_defaults as defaults
from tests.integration.test_launch_windows import training_script  # noqa: F401 - autouse: train.py
from tests.integration.test_winrm_transport import Emulator
from tests.winrm_server import WinRMServer
from tests.winrm_server.native import native_node


def broken(monkeypatch: pytest.MonkeyPatch, owner: Any, name: str, good: str, bad: str) -> Callable[..., str]:
    """Patch ``owner.name`` (a method building a script) so that its text has ``bad`` for ``good``."""
    original = getattr(owner, name)

    def patched(*args: Any, **kwargs: Any) -> str:
        text = original(*args, **kwargs)
        assert good in text, f"{name} no longer has {good!r}: update this experiment"
        return text.replace(good, bad)

    monkeypatch.setattr(owner, name, patched)
    return patched


@pytest.fixture
def server() -> Iterator[WinRMServer]:
    srv = WinRMServer(auth="ntlm", username="bob", password="pw")
    srv.on_powershell = Emulator(srv.files)
    with srv:
        yield srv


def test_a_put_that_skips_its_hash_check_fails_the_corrupted_put_test(
    server: WinRMServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    good = "if ($actual -ne $expected) {{"
    assert good in transfer._PUT_SCRIPT
    monkeypatch.setattr(transfer, "_PUT_SCRIPT", transfer._PUT_SCRIPT.replace(good, "if ($false) {{"))
    # the corrupted bytes are renamed into place (the controller, seeing the node's hash, still says
    # "nothing was replaced")
    with pytest.raises(AssertionError, match="old contents"):
        defaults.test_a_put_corrupted_on_the_way_fails_the_check_and_replaces_nothing(
            server, "native", tmp_path
        )
    assert server.files["C:\\data\\model.bin"] != b"old contents"


def test_a_launcher_started_with_start_process_fails_the_quota_test(monkeypatch: pytest.MonkeyPatch) -> None:
    broken(
        monkeypatch,
        WindowsRuns,
        "start_launcher",
        "$cbResult = Invoke-CimMethod -ClassName Win32_Process -MethodName Create -Arguments $cbCreate\n",
        "$cbResult = Start-Process -FilePath $cbExe -ArgumentList ('-File \"' + $cbScript) -PassThru\n",
    )
    # the launcher is the follower's child, in the shell's job: its ranks hit MaxProcessesPerShell
    with pytest.raises(AssertionError, match="training exited with code 1"):
        launch.test_more_ranks_than_max_processes_per_shell_start_outside_the_job(monkeypatch)


def test_a_watchdog_without_its_follower_rule_fails_the_cancel_test(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    broken(monkeypatch, ForegroundScripts, "watchdog_script", "if ($cbLine.Trim() -and", "if ($false -and")
    with WinRMServer(auth="ntlm", username="bob", password="pw") as srv, native_node(srv) as node:
        # the run outlives the cancel (only the 12 s heartbeat rule is left): "still running after"
        with pytest.raises(AssertionError, match="still running after"):
            launch.test_a_cancelled_foreground_run_is_stopped_on_the_node_by_its_watchdog(
                srv, node, monkeypatch
            )
        assert node.errors == []


def test_a_stop_that_ignores_creation_times_fails_the_reused_pid_test(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    broken(
        monkeypatch,
        WindowsRuns,
        "functions",
        "    if ([string]$cbProc.StartTime.ToFileTimeUtc() -ne $cbWords[1]) { return $null }\n",
        "",
    )
    with WinRMServer(auth="ntlm", username="bob", password="pw") as srv, native_node(srv) as node:
        # the program that now has the old rank's id is stopped too
        with pytest.raises(AssertionError, match=r"\('stopped', 4\) == \('stopped', 3\)"):
            launch.test_stop_takes_the_runs_processes_by_identity_never_a_reused_pid(srv, node, monkeypatch)
        assert node.errors == []
