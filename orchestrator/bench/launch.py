"""What a launch ships for ``cluster.train.shares``: the helper, ``cb_shares.json``, two variables.

``steps.launch.plan`` calls :func:`attach_shares` once the specs exist: equal or fixed shares are
written as they are; ``measured`` runs the probe first (:mod:`.probe`) on the same plan, under a run
id of its own (a run directory belongs to one run). Every spec then carries the file's text
(``LaunchSpec.shares_json``, uploaded by ``prepare_plan`` beside the rank capture) and the ranks'
environment names the files (``CB_SHARES_HELPER``, ``CB_SHARES_FILE``; a ``train.env`` value of the
same name wins).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import TYPE_CHECKING

from orchestrator.bench.shares import SharesDoc, SharesError, doc_for_setting, shares_env
from orchestrator.errors import CommandFailedError, UsageError
from orchestrator.resources import package_file

if TYPE_CHECKING:
    from orchestrator.inventory import Inventory
    from orchestrator.render import LaunchSpec
    from orchestrator.session import Session
    from orchestrator.steps.launch import LaunchPlan


def shares_helper_file() -> Path:
    """The node-side helper, as shipped in the package."""
    return package_file("bench/cb_shares.py")


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


def decide_shares(
    session: Session, inventory: Inventory, launch_plan: LaunchPlan, *, run_id: str
) -> SharesDoc:
    """The shares ``cluster.train.shares`` asks for; ``measured`` probes every rank first.

    Raises :class:`UsageError` for a setting that does not fit the nodes (the inventory's checks
    catch it first) and :class:`CommandFailedError` when the probe cannot measure every rank.
    """
    from orchestrator.bench.probe import probe_problems, run_probe

    setting = inventory.cluster.train.shares
    nodes = [(s.node.name, s.nproc) for s in launch_plan.specs]
    try:
        doc = doc_for_setting(setting, nodes)
    except SharesError as exc:
        raise UsageError(f"train.shares: {exc}", hint=f"inventory {inventory.source}") from None
    if doc is not None:
        return doc
    probe_id = probe_run_id(run_id)
    probing = dataclasses.replace(
        launch_plan, specs=[dataclasses.replace(s, run_id=probe_id) for s in launch_plan.specs]
    )
    probe = run_probe(session, inventory, probe_id, launch_plan=probing)
    problems = probe_problems(probe)
    if problems:
        raise CommandFailedError(
            "shares: measured: the throughput probe failed: " + "; ".join(problems),
            hint="`bootstrap bench` shows every rank; or set cluster.train.shares: equal",
        )
    return probe.report.shares()


def attach_shares(session: Session, inventory: Inventory, launch_plan: LaunchPlan, run_id: str) -> SharesDoc:
    """Decide the shares and put them into every spec of ``launch_plan`` (see the module docstring)."""
    doc = decide_shares(session, inventory, launch_plan, run_id=run_id)
    launch_plan.specs = with_shares(launch_plan.specs, doc)
    return doc
