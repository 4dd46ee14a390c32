"""What a launch ships for ``cluster.train.shares``: the helper, ``cb_shares.json``, two variables.

The launch (``cli/launch.py``, also the main pipeline's launch phase) calls :func:`attach_shares`
once ``steps.launch.plan`` made the specs: equal or fixed shares are written as they are; ``measured``
runs the probe first (:mod:`.probe`) on the same plan, under a run id of its own (a run directory
belongs to one run). Every spec then carries the file's text (``LaunchSpec.shares_json``, uploaded by
``steps.launch.prepare_plan`` beside the rank capture) and the ranks' environment names the files
(``CB_SHARES_HELPER``, ``CB_SHARES_FILE``; a ``train.env`` value of the same name wins). `render`
and the dry runs, which connect to nothing, show the same through :func:`planned_shares` (a
``measured`` file there is marked as not measured yet); `validate` and `bench` run without it. This
module sits above ``steps``: it uses the launch machinery, which never imports it.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from orchestrator.bench.shares import SharesDoc, SharesError, doc_for_setting, rank_layout, shares_env
from orchestrator.errors import CommandFailedError, UsageError

if TYPE_CHECKING:
    from orchestrator.inventory import Inventory
    from orchestrator.render import LaunchSpec
    from orchestrator.session import Session
    from orchestrator.steps.launch import LaunchPlan


def probe_run_id(run_id: str) -> str:
    """The run id the probe of a launch runs under (its own run directories on the nodes)."""
    return f"{run_id[:120]}-probe"


def with_shares(specs: list[LaunchSpec], doc: SharesDoc) -> list[LaunchSpec]:
    """The specs with the shares file's text and the variables naming it and the helper."""
    from orchestrator.runs.layout import run_dir_for

    text = doc.to_json()
    out = []
    for spec in specs:
        env = {**shares_env(run_dir_for(spec.node, spec.run_id)), **spec.env}  # the user's values win
        out.append(dataclasses.replace(spec, env=env, shares_json=text))
    return out


def planned_shares(inventory: Inventory, specs: list[LaunchSpec]) -> tuple[list[LaunchSpec], str | None]:
    """The specs as a launch ships them, measuring nothing (`render`, `launch --dry-run`): equal or
    fixed shares as they are; ``measured`` with a file that says it is not measured yet, and a note
    for the user (the probe runs when the launch does)."""
    setting = inventory.cluster.train.shares
    nodes = [(s.node.name, s.nproc) for s in specs]
    try:
        doc = doc_for_setting(setting, nodes, inventory.names)
    except SharesError:
        return specs, None  # the inventory's checks refuse such a setting first
    if doc is not None:
        return with_shares(specs, doc), None
    world = sum(n for _name, n in nodes)
    unmeasured = SharesDoc("measured", [1.0] * world, ranks=rank_layout(nodes))
    note = (
        "train.shares: measured: the launch first runs the throughput probe on every rank "
        "(`bootstrap bench` shows it); cb_shares.json then holds the measured shares (shown here "
        "without them: measured_at null)"
    )
    return with_shares(specs, unmeasured), note


def decide_shares(
    session: Session, inventory: Inventory, launch_plan: LaunchPlan, *, run_id: str
) -> SharesDoc:
    """The shares ``cluster.train.shares`` asks for; ``measured`` probes every rank first.

    Raises :class:`UsageError` for a setting that does not fit the nodes (the inventory's checks
    catch it first) and :class:`CommandFailedError` when the probe cannot measure every rank.
    """
    from orchestrator.bench.probe import probe_problems, run_probe
    from orchestrator.render import Renderer, templates_dir_for

    setting = inventory.cluster.train.shares
    nodes = [(s.node.name, s.nproc) for s in launch_plan.specs]
    try:
        doc = doc_for_setting(setting, nodes, inventory.names)
    except SharesError as exc:
        raise UsageError(f"train.shares: {exc}", hint=f"inventory {inventory.source}") from None
    if doc is not None:
        return doc
    probe_id = probe_run_id(run_id)
    probing = dataclasses.replace(
        launch_plan, specs=[dataclasses.replace(s, run_id=probe_id) for s in launch_plan.specs]
    )
    renderer = Renderer(templates_dir_for(inventory))  # a ranks.sh.j2 of the user's is used, as by validate
    probe = run_probe(session, inventory, probe_id, launch_plan=probing, renderer=renderer)
    problems = probe_problems(probe)
    if problems:
        raise CommandFailedError(
            "shares: measured: the throughput probe failed: " + "; ".join(problems),
            hint="`bootstrap bench` shows every rank; or set cluster.train.shares: equal",
        )
    return probe.report.shares()


def attach_shares(
    session: Session, inventory: Inventory, launch_plan: LaunchPlan, run_id: str
) -> SharesDoc | None:
    """Decide the shares and put them into every spec of ``launch_plan`` (see the module docstring).
    Nothing when a node could not be reached (the launch names it and stops)."""
    if any(not o.ok for o in launch_plan.inspected):
        return None
    doc = decide_shares(session, inventory, launch_plan, run_id=run_id)
    launch_plan.specs = with_shares(launch_plan.specs, doc)
    return doc
