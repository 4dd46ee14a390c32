"""The files of one Slurm run: the batch script, the node part every srun task runs, the rank capture.

Nothing runs here. Everything is rendered by the launch's :class:`Renderer` (the same quoting, the same
user template directory first), from the inventory's ``cluster.slurm`` and ``cluster.train``.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from orchestrator.errors import UsageError
from orchestrator.inventory import Inventory, Node
from orchestrator.inventory.model import MASK, FromEnv
from orchestrator.inventory.slurm import SlurmSettings
from orchestrator.platforms import PosixShell
from orchestrator.render import Renderer, SecretMode

BATCH_TEMPLATE = "slurm.sbatch.j2"
NODE_TEMPLATE = "slurm_node.sh.j2"
#: file names in the job directory (``<slurm.dir>/runs/<run-id>``)
BATCH_FILE = "job.sbatch"
NODE_FILE = "node.sh"
#: seconds between the time limit's SIGTERM and its SIGKILL (sbatch --signal=TERM@N)
STOP_GRACE = 60


def slurm_settings(inventory: Inventory) -> SlurmSettings:
    """The inventory's ``cluster.slurm``; a UsageError (exit 2) when it has none."""
    slurm = inventory.cluster.slurm
    if slurm is None:
        raise UsageError(
            f"{inventory.source} has no cluster.slurm section",
            hint="add cluster.slurm (login, dir, nodes, ...: docs/slurm.md) to run on Slurm",
        )
    return slurm


def login_node(inventory: Inventory) -> Node:
    """The node that is Slurm's login host: ``cluster.slurm.login``, else the master."""
    slurm = slurm_settings(inventory)
    return inventory.node(slurm.login or inventory.cluster.master)


def on_shared_dir(inventory: Inventory) -> Inventory:
    """The inventory as the login host works for the job: its workdir is ``cluster.slurm.dir``, so the
    environment and the code `sync` makes there (``<dir>/env...``, ``<dir>/code``) are on the shared
    file system every compute node runs from."""
    slurm = slurm_settings(inventory)
    login = login_node(inventory).name
    nodes = [n.model_copy(update={"workdir": slurm.dir}) if n.name == login else n for n in inventory.nodes]
    return dataclasses.replace(inventory, nodes=nodes)


def sync_target(inventory: Inventory) -> tuple[Inventory, list[Node]]:
    """What `sync` works on for a Slurm cluster: :func:`on_shared_dir`'s inventory and its login host
    alone (once, for every compute node)."""
    shared = on_shared_dir(inventory)
    return shared, [login_node(shared)]


def shared_sync(inventory: Inventory, code: bool) -> tuple[str, str | None] | None:
    """What `bootstrap` syncs into the shared directory (``code``: the inventory wants the code
    synced): what to call it and `sync`'s ``only``; None for nothing."""
    env = inventory.cluster.env.declared
    if env and code:
        return "environment and code", None
    return ("environment", "env") if env else ("code", "code") if code else None


def job_python(inventory: Inventory) -> str:
    """The compute nodes' interpreter: ``cluster.slurm.python``, else the environment `sync` built in
    the shared directory (cluster.env), else ``python3``."""
    from orchestrator.steps.envsync import venv_python

    slurm = slurm_settings(inventory)
    if slurm.python:
        return slurm.python
    if inventory.cluster.env.declared:
        shared = on_shared_dir(inventory)
        return venv_python(login_node(shared), shared)
    return "python3"


def job_dir(slurm: SlurmSettings, run_id: str) -> str:
    """Where a run lives on the shared file system: its scripts, and one directory per node."""
    return f"{slurm.dir}/runs/{run_id}"


def code_dir(inventory: Inventory) -> str:
    slurm = slurm_settings(inventory)
    return inventory.cluster.train.code_dir or f"{slurm.dir}/code"


def backend_for(inventory: Inventory) -> str:
    """``auto`` is nccl for a request with GPUs, else gloo (the nodes are not known before the job)."""
    backend: str = inventory.cluster.backend
    if backend == "auto":
        return "nccl" if slurm_settings(inventory).gpus else "gloo"
    return backend


@dataclass(frozen=True)
class JobFiles:
    """The rendered batch script and node part, and the directory they name."""

    job_dir: str
    batch: str
    node: str


def render_job(
    renderer: Renderer, inventory: Inventory, run_id: str, *, secrets: SecretMode = "value"
) -> JobFiles:
    """Both scripts of ``run_id``. ``secrets`` as for every launch script (render.py): "value" for a
    submission, "reference" for files written for a user, "mask" for showing."""
    slurm = slurm_settings(inventory)
    train = inventory.cluster.train
    platform = PosixShell()
    env = renderer.environment(platform)
    directory = job_dir(slurm, run_id)
    pairs: list[tuple[str, str]] = []
    required: list[str] = []
    for name, value in train.env_dict.items():
        if isinstance(value, FromEnv):
            if secrets == "reference":
                required.append(name)
            elif secrets == "mask":
                pairs.append((name, MASK))
            else:
                secret = renderer.environ.get(value.from_env)
                if not secret:
                    raise UsageError(
                        f"train.env.{name}: environment variable {value.from_env} is not set",
                        hint=f"export {value.from_env}=... on this machine before launching",
                    )
                pairs.append((name, secret))
        else:
            pairs.append((name, value))
    common = {
        "run_id": run_id,
        "job_dir": directory,
        "nodes": slurm.nodes,
        "nproc": slurm.ranks_per_node,
        "backend": backend_for(inventory),
    }
    try:
        batch = env.get_template(BATCH_TEMPLATE).render(
            **common,
            job_name=run_id,
            gpus=slurm.gpus,
            partition=slurm.partition,
            account=slurm.account,
            time_limit=slurm.time,
            stop_grace=STOP_GRACE,
            extra=slurm.sbatch,
        )
        node = env.get_template(NODE_TEMPLATE).render(
            **common,
            code_dir=code_dir(inventory),
            python=job_python(inventory),
            script=train.script,
            args=train.args,
            master_port=inventory.cluster.port,
            env=pairs,
            env_required=required,
        )
    except Exception as exc:  # a user's template (train.templates): name it
        raise UsageError(f"Slurm template: {exc}") from None
    return JobFiles(directory, batch, node)


def refuse_dry_run(command: str, dry_run: bool) -> None:
    """A UsageError (exit 2) for ``command`` --dry-run where it needs an allocation: a dry run
    allocates nothing, and which nodes run it is Slurm's choice when the job starts."""
    if dry_run:
        raise UsageError(
            f"`{command} --dry-run` on Slurm: it runs on the nodes Slurm allocates, and a dry run "
            "allocates none",
            hint="`bootstrap render --for slurm` shows the job's scripts without submitting anything",
        )
