"""What Slurm's answers mean to the user: sbatch's refusals and the pending reasons that never change."""

from __future__ import annotations

import pytest

from orchestrator.errors import ExitCode
from orchestrator.slurm.queue import JobState, refusal_hint


@pytest.mark.parametrize(
    ("message", "field"),
    [
        # with accounting (slurmdbd), Slurm's line for an unknown account names the partition too
        (
            "Batch job submission failed: Invalid account or account/partition combination specified",
            "account",
        ),
        ("Batch job submission failed: invalid partition specified: gpu-nope", "partition"),
        (
            "Batch job submission failed: Requested time limit is invalid (missing or exceeds some limit)",
            "time",
        ),
        ("Batch job submission failed: Node count specification invalid", "nodes"),
    ],
)
def test_sbatchs_refusal_points_to_the_field_it_is_about(message: str, field: str) -> None:
    assert refusal_hint(message).startswith(f"check cluster.slurm.{field};")


def _pending(reason: str) -> JobState:
    return JobState("12", "PENDING", reason, "", "0:00", "1:00:00")


def test_a_described_account_refusal_is_hopeless_and_names_the_account() -> None:
    job = _pending("Job's account not known, so it can't use this partition (proj allows proj42)")
    assert job.hopeless
    error = job.cannot_start("login")
    assert error.exit_code == ExitCode.USAGE
    assert error.message.startswith("job 12 cannot start: pending with reason InvalidAccount (Job's account")
    assert "cluster.slurm.account" in (error.hint or "")


@pytest.mark.parametrize("reason", ["Priority", "Resources", "None", "BeginTime"])
def test_reasons_that_waiting_changes_are_waited_for(reason: str) -> None:
    assert not _pending(reason).hopeless
