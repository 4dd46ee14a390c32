"""The main job on a Slurm cluster (``bootstrap`` with ``cluster.slurm``): the same phases, Slurm's way.

Sync (cluster.env / cluster.code) runs once, into the shared directory, through the login host. The
firewall and time sync are skipped: the cluster's admins own the compute nodes' network and clocks.
`check`, then `validate` (unless skipped), run in ONE allocation (a job holding the request's nodes,
orchestrator/slurm/relay.py); a failure stops there, unless forced. Then the job itself (`launch`).
Like orchestrator/pipeline.py, this module decides and knows nothing of terminals: the front end
(:class:`~orchestrator.pipeline.Front`) reaches the nodes and shows each phase's report.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import TYPE_CHECKING

from orchestrator.errors import ExitCode
from orchestrator.pipeline import PipelineOptions, PipelineReport, until_done

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

    from orchestrator.inventory import Inventory
    from orchestrator.runner import Reach
    from orchestrator.session import Session

#: what the pipeline says of the phases Slurm's admins own
SKIPPED = {
    "firewall": "the cluster's admins own the compute nodes' network",
    "ntp": "the cluster's admins keep the compute nodes' clocks",
}


@contextmanager
def allocation(
    reach: Reach, inventory: Inventory, what: str, *, dry_run: bool
) -> Iterator[tuple[Inventory, Session]]:
    """`check` and `validate` on Slurm (the commands and the pipeline): a job (``cb-<what>``) holds
    the request's nodes, given as an inventory and a session whose scripts run on them as job steps;
    cancelled on the way out. Refused under a dry run (exit 2): a dry run allocates nothing, and the
    nodes are Slurm's choice."""
    from orchestrator.slurm.job import login_node, refuse_dry_run
    from orchestrator.slurm.relay import on_allocation

    refuse_dry_run(what, dry_run)
    note: Callable[[str], None] = lambda text: reach.say("note", text)  # noqa: E731
    with (
        reach.connect([login_node(inventory)]) as session,
        on_allocation(session, inventory, note, what) as on,
    ):
        yield on


def run_slurm_pipeline(inventory: Inventory, options: PipelineOptions, front: Front) -> PipelineReport:
    """The whole job on a Slurm cluster; each phase reaches its nodes with ``front.reach(None, phase,
    inventory)`` (a session of its own) and is shown by ``front.show``."""
    from orchestrator.slurm.job import shared_sync, slurm_settings, sync_target
    from orchestrator.slurm.run import launch_job
    from orchestrator.steps.preflight import preflight_report
    from orchestrator.steps.sync import SyncOptions, sync_report
    from orchestrator.steps.validate import validation_phase

    report = PipelineReport()

    def stop(why: str, code: ExitCode) -> PipelineReport:
        report.stopped, report.exit_code = why, code
        front.say("error", why)
        return report

    shared, (login,) = sync_target(inventory)
    sync = shared_sync(inventory, inventory.cluster.code_declared)
    if sync is None:
        report.skipped["sync"] = "the inventory declares no cluster.env or cluster.code"
    else:
        where = slurm_settings(inventory).dir
        front.say(
            "note",
            f"sync: the {sync[0]} to {where} through {login.name}, once for every node (shared file system)",
        )
        front.begin("sync")
        chosen = SyncOptions(only=sync[1], dry_run=options.dry_run is not None)
        synced = report.codes["sync"] = front.show(
            "sync", sync_report(front.reach(None, "sync", shared), shared, [login], chosen), [login]
        )
        if synced != ExitCode.OK:
            report.skipped.update(dict.fromkeys(("check", "validate", "launch"), "sync failed"))
            return stop(
                "not going on: sync failed (see above); `bootstrap sync` repeats just that step", synced
            )
    for phase, why in SKIPPED.items():
        front.say("note", f"{phase}: skipped on Slurm ({why})")
        report.skipped[phase] = f"Slurm: {why}"
    if any(until_done(options, phase, report) for phase in ("sync", "firewall", "ntp")):
        return report
    reach = front.reach(None, "check", inventory)
    with allocation(reach, inventory, "check", dry_run=options.dry_run is not None) as (nodes, on):
        front.begin("check")
        everyone = list(nodes.nodes)
        checks = preflight_report(front.reach(on, "check", nodes), nodes, everyone)
        code = report.codes["check"] = front.show("check", checks, everyone, nodes)
        if options.skip_validate:
            report.skipped["validate"] = "--skip-validate"
        elif code != ExitCode.OK and not options.force:
            report.skipped["validate"] = "a check failed"
        elif not until_done(options, "check", report):
            front.begin("validate")
            validated = validation_phase(front.reach(on, "validate", nodes), nodes)
            report.codes["validate"] = front.show("validate", validated, everyone, nodes)
            code = report.codes["validate"] or code
    report.exit_code = code
    if code != ExitCode.OK and not options.force:
        report.skipped["launch"] = "check or validate failed"
        return stop(
            "not launching: check or validate failed on an allocated node (see above); --force goes on", code
        )
    if until_done(options, "check", report) or until_done(options, "validate", report):
        return report
    front.begin("launch")
    launched = launch_job(
        front.reach(None, "launch", inventory),
        inventory,
        run_id=None,
        templates_dir=None,
        detach=options.detach,
    )
    report.exit_code = report.codes["launch"] = front.show("launch", launched, list(inventory.nodes))
    return report


if TYPE_CHECKING:
    from orchestrator.pipeline import Front
