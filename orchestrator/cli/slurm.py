"""What `launch`, `logs`, `status` and `stop` print for a run on Slurm (orchestrator/slurm/ decides and
acts): the job's state while it waits, every rank's lines as `[node:rank]`, the failed node first."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from orchestrator.cli.common import Settings, interrupted, open_session
from orchestrator.cli.front import reach_for
from orchestrator.cli.report import tell
from orchestrator.errors import ExitCode
from orchestrator.inventory import Inventory
from orchestrator.runs.next_command import again
from orchestrator.slurm.run import end_said
from orchestrator.view import Said

if TYPE_CHECKING:
    from orchestrator.slurm.run import JobEnd, NodeEnd, SlurmLaunch, SlurmLogin, SlurmRun


def launch_on_slurm(
    settings: Settings, inventory: Inventory, *, run_id: str | None, templates_dir: Path | None, detach: bool
) -> ExitCode:
    """`launch` on an inventory with cluster.slurm (``slurm.run.launch_job``): submit, then follow (or,
    --detach, only submit), shown."""
    from orchestrator.slurm.run import launch_job

    reach = reach_for(settings, inventory, lines="ranks")
    return show_slurm_launch(
        settings, launch_job(reach, inventory, run_id=run_id, templates_dir=templates_dir, detach=detach)
    )


def show_slurm_launch(settings: Settings, launched: SlurmLaunch) -> ExitCode:
    """A Slurm launch: the detached submission, the interrupt, or how the job ended; its exit code."""
    ui, run = settings.ui, launched.run
    if launched.end is None and launched.interrupted is None:  # --detach: submitted, not followed
        if settings.json_mode:
            ui.print_json({"command": "launch", "run_id": run.run_id, "job_id": run.job_id, "detached": True})
        else:
            ui.info(f"follow it: {again(settings, 'logs', run.run_id)} --follow")
        return ExitCode.OK
    if launched.interrupted is not None:
        if launched.cancelled is not None:
            detail = f"Slurm job {run.job_id} cancelled ({launched.cancelled})"
        else:
            detail = f"Slurm job {run.job_id} may still run: `{again(settings, 'stop', run.run_id)}`"
        interrupted(ui, detail, stop=launched.interrupted)
    assert launched.end is not None and launched.log_dir is not None
    return _summary(settings, run, launched.end, launched.log_dir)


def _summary(settings: Settings, run: SlurmRun, end: JobEnd, log_dir: Path) -> ExitCode:
    ui = settings.ui
    code = ExitCode.OK if end.ok else ExitCode.NODES_FAILED
    if settings.json_mode:  # each node's entry: the common one (not timed here), its exit code
        from orchestrator.cli.report import json_doc
        from orchestrator.executor import Outcome

        nodes: list[Outcome[NodeEnd]] = [Outcome(n.node, n, n.error, 0.0) for n in end.nodes]
        return json_doc(
            ui,
            "launch",
            nodes,
            code,
            lambda o: {"exit_code": o.value.exit_code if o.value else None},
            lambda o: o.ok and o.value is not None and o.value.exit_code == 0,
            run_id=run.run_id,
            job_id=end.job_id,
            state=end.state,
            failed_first=end.failed_first,
            time_limit_reached=bool(end.time_limit),
            log_dir=str(log_dir),
        )
    logs = Said("note", f"logs: {log_dir}/ (and {run.job_dir}/<node>/node.log on the shared file system)")
    tell(ui, [*end_said(end), logs])
    return code


@contextlib.contextmanager
def _login(settings: Settings, inventory: Inventory) -> Iterator[SlurmLogin]:
    from orchestrator.slurm.job import login_node
    from orchestrator.slurm.run import SlurmLogin

    with open_session(settings, inventory, [login_node(inventory)]) as session:
        yield SlurmLogin(session, inventory)


def logs_on_slurm(settings: Settings, inventory: Inventory, run_id: str, *, follow: bool) -> ExitCode:
    """`logs --run ID [--follow]` of a Slurm run: every node's log from its start, as `[node:rank]`."""
    from orchestrator.slurm.run import job_logs

    try:
        end = job_logs(reach_for(settings, inventory, lines="ranks"), inventory, run_id, follow=follow)
    except KeyboardInterrupt:
        interrupted(settings.ui, "stopped following (the job goes on)")
    if not follow:
        return ExitCode.OK
    tell(settings.ui, end_said(end))  # followed to its end: say how, as launch does
    return ExitCode.OK if end.ok else ExitCode.NODES_FAILED


def status_on_slurm(settings: Settings, inventory: Inventory, run_id: str) -> ExitCode:
    """`status --run ID`: the job's id, state, nodes, runtime, and each node's last line."""
    from orchestrator.slurm.job import slurm_settings

    ui = settings.ui
    with _login(settings, inventory) as login:
        status = login.status(login.find(run_id))
    if settings.json_mode:
        ui.print_json({"command": "status", **status.__dict__})
        return ExitCode.OK
    why = f" ({status.reason})" if status.state == "PENDING" and status.reason else ""
    ui.print_text(f"run {status.run_id}: Slurm job {status.job_id} {status.state}{why}")
    if status.runtime:
        ui.print_text(f"runtime {status.runtime} on {', '.join(status.nodes) or 'no node yet'}")
    for line in status.labelled_last_lines(slurm_settings(inventory).ranks_per_node):
        ui.print_text(f"  {line}")
    return ExitCode.OK


def stop_on_slurm(settings: Settings, inventory: Inventory, run_id: str) -> ExitCode:
    """`stop --run ID`: scancel the job and await its end."""
    ui = settings.ui
    with _login(settings, inventory) as login:
        state = login.stop(run := login.find(run_id))
    ui.info(f"run {run_id}: Slurm job {run.job_id} cancelled ({state})")
    return ExitCode.OK
