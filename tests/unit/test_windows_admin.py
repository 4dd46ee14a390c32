"""The one verdict on a PowerShell script a step runs elevated on a Windows host: every step that
needs an administrator (firewall rules, w32time, its restore) says the same things the same way."""

from __future__ import annotations

import pytest

from orchestrator.errors import CommandFailedError
from orchestrator.inventory import load_inventory_text
from orchestrator.platforms.powershell import NOT_ELEVATED_EXIT
from orchestrator.platforms.windows_admin import check_elevated_run
from orchestrator.runner import converge
from orchestrator.steps.firewall import Firewall, FirewallContext
from orchestrator.steps.timesync import NodeTime, RestoreTime
from orchestrator.steps.timesync.steps import w32time_plan
from orchestrator.transports import Result

INVENTORY = (
    "cluster: {name: lab, master: c}\nnodes:\n  - {name: c, host: 10.0.0.1}\n"
    "  - {name: w, host: 10.0.0.2, os: windows, user: bob, windows: {mode: native}}\n"
)


def _ran(exit_code: int, stdout: str = "", stderr: str = "") -> Result:
    return Result("w", "script", exit_code, stdout, stderr, 0.1)


def test_a_failed_script_names_the_work_its_last_lines_and_the_fix() -> None:
    check_elevated_run("w", "bob", "configuring w32time", _ran(0, "configured\n"))  # no error
    with pytest.raises(CommandFailedError) as failed:
        check_elevated_run(
            "w", "bob", "configuring w32time", _ran(1, "", "Access is denied.\n"), then="rerun"
        )
    assert failed.value.message == "configuring w32time failed: Access is denied."
    assert failed.value.hint == "it needs an elevated session (a member of Administrators over WinRM); rerun"
    with pytest.raises(CommandFailedError) as refused:
        check_elevated_run("w", "bob", "configuring w32time", _ran(NOT_ELEVATED_EXIT))
    assert refused.value.message.startswith("configuring w32time needs an elevated (administrator) session")


class _Host:
    """A transport of a Windows host whose elevated scripts all fail with ``exit_code``."""

    def __init__(self, exit_code: int) -> None:
        self.exit_code = exit_code

    def run_windows(self, script: str, **_: object) -> Result:
        return _ran(self.exit_code, "", "Access is denied.\n")


@pytest.mark.parametrize("exit_code", [1, NOT_ELEVATED_EXIT])
def test_firewall_w32time_and_its_restore_give_the_same_verdict(exit_code: int) -> None:
    inv = load_inventory_text(INVENTORY, "hosts.yaml")
    node, host = inv.node("w"), _Host(exit_code)
    firewall, context = Firewall(inv), FirewallContext({}, {"w": "10.0.0.2", "c": "10.0.0.1"})
    restore = RestoreTime()
    w32time = w32time_plan(node, NodeTime("w", sources=["10.0.0.1"]))
    errors = []
    for run in (
        lambda: converge(firewall, node, host, firewall.plan(node, {}, context), context),  # type: ignore[arg-type]
        lambda: w32time.runs[0].check(host.run_windows(w32time.runs[0].script)),  # type: ignore[misc]
        lambda: converge(restore, node, host, restore.plan(node, {}, None), None),  # type: ignore[arg-type]
    ):
        with pytest.raises(CommandFailedError) as caught:
            run()
        errors.append(caught.value)
    works = ["setting the firewall rules", "configuring w32time", "restoring w32time"]
    said = "needs an elevated (administrator) session" if exit_code == NOT_ELEVATED_EXIT else "failed:"
    for error, work in zip(errors, works, strict=True):
        assert error.node == "w" and error.message.startswith(f"{work} {said}"), error.message
        assert "Administrators" in (error.hint or "")
