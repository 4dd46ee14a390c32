"""``cluster.slurm``: where Slurm is and what a run asks it for (docs/slurm.md).

The login host is a node of the inventory (reached over SSH like any other: host keys, keys,
ProxyJump); the compute nodes are Slurm's, allocated per job, never listed.
"""

from __future__ import annotations

import posixpath
import re
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, field_validator

from orchestrator.inventory.model import MAX_RANKS_PER_NODE, Line, _no_bool

__all__ = ["SlurmSettings"]

#: partition and account names as Slurm writes them (no space, quote or shell character)
SlurmName = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9_][A-Za-z0-9_.+-]*$", max_length=128)]
#: Slurm's time formats: minutes, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS, or UNLIMITED
_TIME_RE = re.compile(r"\d+|\d+:\d{1,2}|\d+:\d{1,2}:\d{1,2}|\d+-\d+(:\d{1,2}){0,2}|UNLIMITED|INFINITE")


class SlurmSettings(BaseModel):
    """The request of every run (``sbatch`` options) and where runs live on the shared file system."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    login: Line | None = None  # the inventory node that is the login host (default: the master)
    dir: Line  # shared by the login host and every compute node: code, runs
    nodes: int = Field(ge=1, le=100_000)
    gpus: int = Field(default=0, ge=0, le=MAX_RANKS_PER_NODE)  # per node (--gpus-per-node)
    nproc: int | None = Field(
        default=None, ge=1, le=MAX_RANKS_PER_NODE
    )  # ranks per node (default gpus, or 1)
    partition: SlurmName | None = None
    account: SlurmName | None = None
    time: str | None = None  # the job's time limit (--time)
    sbatch: tuple[Line, ...] = ()  # extra #SBATCH lines, e.g. "--exclusive", "--mem=0"
    python: Line | None = None  # the compute nodes' interpreter (default: cluster.env's, else python3)

    @field_validator("nodes", "gpus", "nproc", mode="before")
    @classmethod
    def _integers_are_not_booleans(cls, value: Any) -> Any:
        return _no_bool(value)

    @field_validator("dir")
    @classmethod
    def _absolute(cls, value: str) -> str:
        if not value.startswith("/"):
            raise ValueError("must be an absolute path on the shared file system (e.g. /shared/$USER/cb)")
        # it is written into #SBATCH lines, which sbatch splits at spaces and never unquotes
        if not re.fullmatch(r"[A-Za-z0-9_./+@,~-]+", value):
            raise ValueError("must be a path of letters, digits and _ . / + @ , ~ - (no spaces or quotes)")
        return posixpath.normpath(value)

    @field_validator("time", mode="before")
    @classmethod
    def _slurm_time(cls, value: Any) -> Any:
        if isinstance(value, int) and not isinstance(value, bool):
            value = str(value)  # minutes
        if isinstance(value, str) and not _TIME_RE.fullmatch(value):
            raise ValueError(f"{value!r} is not a Slurm time limit (minutes, HH:MM:SS or D-HH:MM:SS)")
        return value

    @field_validator("sbatch", mode="before")
    @classmethod
    def _sbatch_lines(cls, value: Any) -> Any:
        if isinstance(value, str):
            value = [value]
        if isinstance(value, (list, tuple)):
            for item in value:
                if not isinstance(item, str) or not item.startswith("-"):
                    raise ValueError(f"{item!r}: each entry is an sbatch option such as --exclusive")
            return tuple(value)
        return value

    @property
    def ranks_per_node(self) -> int:
        return self.nproc or self.gpus or 1
