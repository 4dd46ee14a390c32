"""Slurm's commands on the login host (sbatch, squeue, scontrol, scancel) and what they answer.

Every value reaches the command line quoted by the login host's platform. Slurm's own error message
is kept: it is the line a Slurm user knows ("Invalid partition name specified").
"""

from __future__ import annotations

import logging
import re
from collections.abc import Sequence
from dataclasses import dataclass

from orchestrator import records
from orchestrator.errors import BootstrapError, CommandFailedError, UsageError
from orchestrator.platforms import PosixShell
from orchestrator.transports import Transport

log = logging.getLogger(__name__)

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
    }
)
#: pending reasons that say the account (or its QOS, its limits) cannot run this job: a matter of
#: cluster.slurm.account, which waiting does not change either
ACCOUNT_REFUSED = frozenset(
    {
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
#: squeue shows a reason's description instead of its name when slurmctld wrote one: the names of
#: the descriptions it writes for reasons that waiting does not change
_DESCRIBED = (
    ("Nodes required for job are DOWN", NODES_UNAVAILABLE),
    ("Job's account not known", "InvalidAccount"),  # a partition's AllowAccounts, no association
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
    def reason_code(self) -> str:
        """Slurm's name of the pending reason (``ReqNodeNotAvail``, not its description)."""
        for prefix, code in _DESCRIBED:
            if self.reason.startswith(prefix):
                return code
        return self.reason.split(",")[0]

    @property
    def hopeless(self) -> bool:
        """Pending for a reason that waiting alone does not change."""
        code = self.reason_code
        return self.state == "PENDING" and (
            code in TOO_LARGE or code in ACCOUNT_REFUSED or code == NODES_UNAVAILABLE
        )

    def cannot_start(self, login: str) -> BootstrapError:
        """The error for a job :attr:`hopeless` pending (after it was cancelled): the reason as Slurm
        says it and what to change. Nodes down or drained: exit 1 (the cluster's state, not the
        request); the request or the account: exit 2."""
        code = self.reason_code
        said = self.reason if self.reason.startswith(code) else f"{code} ({self.reason})"
        if code == NODES_UNAVAILABLE:
            return SlurmError(
                f"job {self.job_id} cannot start: {said}; cancelled",
                node=login,
                hint="nodes of the partition are down, drained or reserved (`sinfo -R` on the login host "
                "says why); launch --detach waits in the queue instead",
            )
        if code in ACCOUNT_REFUSED:
            hint = (
                "the account may not run this job in this partition: check cluster.slurm.account and "
                "cluster.slurm.partition (`sacctmgr show assoc user=$USER` on the login host lists yours)"
            )
        else:
            hint = (
                "the request is larger than the partition allows (`sinfo -s`, `scontrol show partition` "
                "on the login host): ask for fewer nodes (cluster.slurm.nodes), a shorter time, or "
                "another partition"
            )
        return UsageError(
            f"job {self.job_id} cannot start: pending with reason {said}; cancelled", node=login, hint=hint
        )


def seconds(duration: str) -> int | None:
    """A duration as squeue writes it (``M:SS``, ``H:MM:SS``, ``D-HH:MM:SS``) in seconds; None for
    ``UNLIMITED``, ``NOT_SET`` and anything else."""
    days, _, clock = duration.rpartition("-")
    parts = clock.split(":")
    if not all(p.isdigit() for p in parts) or not 1 <= len(parts) <= 3 or (days and not days.isdigit()):
        return None
    total = 0
    for part in parts:
        total = total * 60 + int(part)
    return total + int(days or 0) * 86400


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
    directory = batch_file.rsplit("/", 1)[0] or "/"
    return sbatch(transport, login, ["--parsable", batch_file], cwd=directory)


def sbatch(transport: Transport, login: str, args: Sequence[str], *, cwd: str | None = None) -> str:
    """``sbatch ARGS`` (``--parsable`` among them) on the login host, from ``cwd``; the job id.

    No sbatch on the login host's PATH: a UsageError saying so (exit 2), not the shell's "not found".
    A refusal: a UsageError with Slurm's own first line and the ``cluster.slurm`` field it names."""
    platform = _posix(transport, login)
    command = "if ! command -v sbatch >/dev/null 2>&1; then exit 127; fi\n"
    if cwd is not None:
        command += f"cd {platform.path_word(cwd)} && "
    answer = ask(transport, login, command + _command(platform, ["sbatch", *args]), timeout=120)
    if answer.exit_code == 127:
        raise UsageError(
            "no sbatch on the login host: Slurm's commands are not installed or not on its PATH",
            node=login,
            hint="cluster.slurm.login must name a node where `sbatch` works in an SSH session "
            "(`ssh LOGIN command -v sbatch`: a non-interactive session's PATH)",
        )
    job = answer.lines[-1].split(";", 1)[0] if answer.lines else ""
    if not answer.ok or not job.isdigit():
        text = answer.message()
        raise UsageError(f"sbatch refused the job: {text}", node=login, hint=refusal_hint(text))
    return job


def refusal_hint(message: str) -> str:
    """What to change for sbatch's refusal ``message``: the cluster.slurm field it names. The account
    comes first: Slurm's "Invalid account or account/partition combination" names both."""
    lowered = message.lower()
    field = next((f for f in ("account", "partition", "time", "node") if f in lowered), None)
    what = {"node": "nodes"}.get(field or "", field)
    if what is None:
        return "the batch script's #SBATCH lines come from cluster.slurm (render --for slurm shows them)"
    return f"check cluster.slurm.{what}; `sinfo -s` on the login host lists the partitions" + (
        ", `sacctmgr show assoc user=$USER` your accounts" if what == "account" else ""
    )


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
    return host_names(answer.lines)


#: a node name as Slurm's node lists hold them (a host name): it names files and directories here
_HOST = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,252}")


def host_names(lines: list[str]) -> list[str]:
    """The lines that are host names (each becomes runs/<run-id>/<node>... here); any other line
    (``../x``, ``/etc``: a forged list on the shared file system) is left out, and logged."""
    names = [line.strip() for line in lines if _HOST.fullmatch(line.strip()) and ".." not in line]
    if len(names) != len([line for line in lines if line.strip()]):
        log.warning(
            "left out node names that are not host names: %r", [n for n in lines if n.strip() not in names]
        )
    return names


def cancel(transport: Transport, login: str, job_id: str) -> None:
    """``scancel JOB``: Slurm signals every process of the job on every node."""
    platform = _posix(transport, login)
    answer = ask(transport, login, _command(platform, ["scancel", job_id]))
    if not answer.ok:
        raise SlurmError(f"scancel failed: {answer.message()}", node=login)


def cancel_steps(transport: Transport, login: str, job_id: str, name: str) -> None:
    """``scancel`` every step of job ``job_id`` named ``name`` (srun --job-name) that still runs."""
    platform = _posix(transport, login)
    argv = ["squeue", "-h", "--steps", "-j", job_id, "-o", "%i|%j"]
    answer = ask(transport, login, _command(platform, argv))
    steps = [f[0] for f in (line.split("|", 1) for line in answer.lines) if len(f) == 2 and f[1] == name]
    if answer.ok and steps:
        ask(transport, login, _command(platform, ["scancel", *steps]))


def _posix(transport: Transport, login: str) -> PosixShell:
    platform = transport.platform.as_posix()
    if platform is None:
        raise UsageError("the Slurm login host must be a Linux node", node=login)
    return platform


__all__ = [
    "Answer",
    "BootstrapError",
    "JobState",
    "SlurmError",
    "ask",
    "cancel",
    "cancel_steps",
    "hostnames",
    "sbatch",
    "seconds",
    "state",
    "submit",
]
