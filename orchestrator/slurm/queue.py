"""Slurm's commands on the login host (sbatch, squeue, scontrol, scancel) and what they answer.

Every value reaches the command line quoted by the login host's platform. Slurm's own error message
is kept: it is the line a Slurm user knows ("Invalid partition name specified").
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from orchestrator.errors import BootstrapError, CommandFailedError, UsageError
from orchestrator.platforms import PosixShell
from orchestrator.transports import Transport

#: states after which a job runs no more (squeue -t all keeps them for MinJobAge seconds)
ENDED = frozenset(
    {
        "BOOT_FAIL",
        "CANCELLED",
        "COMPLETED",
        "DEADLINE",
        "FAILED",
        "NODE_FAIL",
        "OUT_OF_MEMORY",
        "PREEMPTED",
        "TIMEOUT",
        "REVOKED",
    }
)
#: pending reasons that say the request can never be met as it is: waiting would be forever
HOPELESS = frozenset(
    {
        "ReqNodeNotAvail",
        "PartitionNodeLimit",
        "PartitionTimeLimit",
        "PartitionConfig",
        "BadConstraints",
        "InvalidAccount",
        "InvalidQOS",
        "AssocMaxNodesPerJobLimit",
        "AssocMaxWallDurationPerJobLimit",
        "QOSMaxNodePerJobLimit",
        "QOSMaxWallDurationPerJobLimit",
    }
)
_FIELDS = "%i|%T|%r|%N|%M|%l"


class SlurmError(CommandFailedError):
    """A Slurm command refused or failed; the message is Slurm's own line."""


@dataclass(frozen=True)
class JobState:
    """One line of ``squeue`` for a job."""

    job_id: str
    state: str  # PENDING, RUNNING, COMPLETING, COMPLETED, CANCELLED, TIMEOUT, ...
    reason: str  # why it waits (Priority, Resources, ...) or None
    nodelist: str  # Slurm's compressed form (node[2-4]); empty while pending
    runtime: str
    time_limit: str

    @property
    def ended(self) -> bool:
        return self.state in ENDED

    @property
    def hopeless(self) -> bool:
        return self.state == "PENDING" and self.reason.split(",")[0] in HOPELESS


def _command(platform: PosixShell, argv: Sequence[str]) -> str:
    return " ".join(platform.quote(a) for a in argv)


def _slurm_line(result_stderr: str, result_stdout: str) -> str:
    """Slurm's message without its ``sbatch: error:`` prefix (the first such line)."""
    for line in (result_stderr + "\n" + result_stdout).splitlines():
        text = re.sub(r"^\w+: error: ", "", line.strip())
        if text:
            return text
    return "no message"


def submit(transport: Transport, login: str, batch_file: str) -> str:
    """``sbatch --parsable FILE`` from the file's directory; the job id. Refusals (no sbatch, an
    unknown partition or account, a request larger than the partition) raise with Slurm's line."""
    platform = _posix(transport, login)
    directory = batch_file.rsplit("/", 1)[0] or "/"
    script = (
        "if ! command -v sbatch >/dev/null 2>&1; then echo 'sbatch: error: no sbatch' >&2; exit 127; fi\n"
        f"cd {platform.path_word(directory)} && " + _command(platform, ["sbatch", "--parsable", batch_file])
    )
    result = transport.run(script, timeout=120)
    if result.exit_code == 127:
        raise UsageError(
            "no sbatch on the login host: Slurm's commands are not installed or not on its PATH",
            node=login,
            hint="cluster.slurm.login must name a node where `sbatch` works in an SSH session",
        )
    job = result.stdout.strip().split(";", 1)[0]
    if not result.ok or not job.isdigit():
        raise SlurmError(f"sbatch refused the job: {_slurm_line(result.stderr, result.stdout)}", node=login)
    return job


def state(transport: Transport, login: str, job_id: str) -> JobState | None:
    """The job as squeue sees it (ended jobs too, while Slurm keeps them); None once it is gone."""
    platform = _posix(transport, login)
    argv = ["squeue", "-h", "-t", "all", "-j", job_id, "-o", _FIELDS]
    result = transport.run(_command(platform, argv), timeout=60)
    if not result.ok:
        if "Invalid job id" in result.stderr:
            return None
        raise SlurmError(f"squeue failed: {_slurm_line(result.stderr, result.stdout)}", node=login)
    for line in result.stdout.splitlines():
        fields = line.strip().split("|")
        if len(fields) == 6 and fields[0] == job_id:
            return JobState(*fields)
    return None


def hostnames(transport: Transport, login: str, nodelist: str) -> list[str]:
    """``node[2-4]`` as Slurm expands it, in the job's order (SLURM_NODEID 0, 1, ...)."""
    platform = _posix(transport, login)
    result = transport.run(_command(platform, ["scontrol", "show", "hostnames", nodelist]), timeout=60)
    if not result.ok:
        raise SlurmError(f"scontrol failed: {_slurm_line(result.stderr, result.stdout)}", node=login)
    return [line.strip() for line in result.stdout.splitlines() if line.strip()]


def cancel(transport: Transport, login: str, job_id: str) -> None:
    """``scancel JOB``: Slurm signals every process of the job on every node."""
    platform = _posix(transport, login)
    result = transport.run(_command(platform, ["scancel", job_id]), timeout=60)
    if not result.ok:
        raise SlurmError(f"scancel failed: {_slurm_line(result.stderr, result.stdout)}", node=login)


def _posix(transport: Transport, login: str) -> PosixShell:
    platform = transport.platform
    if not isinstance(platform, PosixShell):
        raise UsageError("the Slurm login host must be a Linux node", node=login)
    return platform


__all__ = ["BootstrapError", "JobState", "SlurmError", "cancel", "hostnames", "state", "submit"]
