"""Slurm's commands on the login host (sbatch, squeue, scontrol, scancel) and what they answer.

Every value reaches the command line quoted by the login host's platform. Slurm's own error message
is kept: it is the line a Slurm user knows ("Invalid partition name specified").
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from orchestrator import records
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
TOO_LARGE = frozenset(
    {
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
#: the nodes the job needs are down, drained or reserved: an administrator's matter, not the request's
#: (squeue writes this reason as its description, "Nodes required for job are DOWN, DRAINED ...")
NODES_UNAVAILABLE = "ReqNodeNotAvail"
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
    def reason_code(self) -> str:
        """Slurm's name of the pending reason (``ReqNodeNotAvail``, not its description)."""
        if self.reason.startswith(("ReqNodeNotAvail", "Nodes required for job are DOWN")):
            return NODES_UNAVAILABLE
        return self.reason.split(",")[0]

    @property
    def hopeless(self) -> bool:
        """Pending for a reason that waiting alone does not change."""
        return self.state == "PENDING" and (
            self.reason_code in TOO_LARGE or self.reason_code == NODES_UNAVAILABLE
        )


def _command(platform: PosixShell, argv: Sequence[str]) -> str:
    return " ".join(platform.quote(a) for a in argv)


@dataclass(frozen=True)
class Answer:
    """A Slurm command's exit code and its output (stdout and stderr together), as one record."""

    exit_code: int | None
    text: str

    @property
    def ok(self) -> bool:
        return self.exit_code == 0

    @property
    def lines(self) -> list[str]:
        return [line.strip() for line in self.text.split("\n") if line.strip()]

    def message(self) -> str:
        """Slurm's own line without its ``sbatch: error:`` prefix (the first such line)."""
        for line in self.lines:
            text = re.sub(r"^\w+: error: ", "", line)
            if text:
                return text
        return f"exit {self.exit_code}, no message"


def ask(transport: Transport, login: str, command: str, *, timeout: float = 60) -> Answer:
    """Run ``command`` (shell text whose values the platform quoted) on the login host; its output
    comes back in one framed record (orchestrator/records.py), whatever bytes it holds."""
    platform = _posix(transport, login)
    nonce = records.new_nonce()
    script = (
        platform.record_functions(nonce)
        + f'\n_cb_o=$( {{ {command}\n}} 2>&1 </dev/null )\n_cb_x=$?\n_cb_rec answer "$_cb_x" "$_cb_o"'
    )
    result = transport.run(script, timeout=timeout)
    found = records.find(result.stdout, nonce, "answer")
    if found is None:
        raise CommandFailedError(
            f"no answer from the login host (exit {result.exit_code}): {' | '.join(result.tail(3))}",
            node=login,
        )
    code = found.text(0)
    return Answer(int(code) if code.isdigit() else None, found.text(1))


def submit(transport: Transport, login: str, batch_file: str) -> str:
    """``sbatch --parsable FILE`` from the file's directory; the job id. Refusals (no sbatch, an
    unknown partition or account, a request larger than the partition) raise with Slurm's line."""
    platform = _posix(transport, login)
    directory = batch_file.rsplit("/", 1)[0] or "/"
    command = (
        "if ! command -v sbatch >/dev/null 2>&1; then exit 127; fi\n"
        f"cd {platform.path_word(directory)} && " + _command(platform, ["sbatch", "--parsable", batch_file])
    )
    answer = ask(transport, login, command, timeout=120)
    if answer.exit_code == 127:
        raise UsageError(
            "no sbatch on the login host: Slurm's commands are not installed or not on its PATH",
            node=login,
            hint="cluster.slurm.login must name a node where `sbatch` works in an SSH session",
        )
    job = answer.lines[-1].split(";", 1)[0] if answer.lines else ""
    if not answer.ok or not job.isdigit():
        text = answer.message()
        field = next((f for f in ("partition", "account", "time", "node") if f in text.lower()), None)
        what = {"node": "nodes", "time": "time"}.get(field or "", field)
        raise UsageError(
            f"sbatch refused the job: {text}",
            node=login,
            hint=f"check cluster.slurm.{what}; `sinfo -s` on the login host lists the partitions"
            if what
            else "the batch script's #SBATCH lines come from cluster.slurm (render --for slurm shows them)",
        )
    return job


def state(transport: Transport, login: str, job_id: str) -> JobState | None:
    """The job as squeue sees it (ended jobs too, while Slurm keeps them); None once it is gone."""
    platform = _posix(transport, login)
    argv = ["squeue", "-h", "-t", "all", "-j", job_id, "-o", _FIELDS]
    answer = ask(transport, login, _command(platform, argv))
    if not answer.ok:
        if "Invalid job id" in answer.text:
            return None
        raise SlurmError(f"squeue failed: {answer.message()}", node=login)
    for line in answer.lines:
        fields = line.split("|")
        if len(fields) == 6 and fields[0] == job_id:
            return JobState(*fields)
    return None


def hostnames(transport: Transport, login: str, nodelist: str) -> list[str]:
    """``node[2-4]`` as Slurm expands it, in the job's order (SLURM_NODEID 0, 1, ...)."""
    platform = _posix(transport, login)
    answer = ask(transport, login, _command(platform, ["scontrol", "show", "hostnames", nodelist]))
    if not answer.ok:
        raise SlurmError(f"scontrol failed: {answer.message()}", node=login)
    return answer.lines


def cancel(transport: Transport, login: str, job_id: str) -> None:
    """``scancel JOB``: Slurm signals every process of the job on every node."""
    platform = _posix(transport, login)
    answer = ask(transport, login, _command(platform, ["scancel", job_id]))
    if not answer.ok:
        raise SlurmError(f"scancel failed: {answer.message()}", node=login)


def _posix(transport: Transport, login: str) -> PosixShell:
    platform = transport.platform
    if not isinstance(platform, PosixShell):
        raise UsageError("the Slurm login host must be a Linux node", node=login)
    return platform


__all__ = [
    "Answer",
    "BootstrapError",
    "JobState",
    "SlurmError",
    "ask",
    "cancel",
    "hostnames",
    "state",
    "submit",
]
