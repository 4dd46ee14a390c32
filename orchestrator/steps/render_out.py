"""`bootstrap render`: each node's launch script as a launch would run it (the facts decide interfaces
and the master's address; ``offline``: the inventory alone), and with ``out_dir`` the files to run by
hand; ``--for slurm``: the batch script and its node part. The CLI prints what comes back."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from orchestrator.render import Renderer, templates_dir_for
from orchestrator.safefiles import write_inside
from orchestrator.view import Said

if TYPE_CHECKING:
    from orchestrator.executor import Outcome
    from orchestrator.inventory import Inventory, Node
    from orchestrator.render import LaunchSpec
    from orchestrator.runner import Reach


@dataclass
class Rendered:
    """The scripts (secrets masked, by file name), the files written with ``--out`` (each with what
    to do with it), or the nodes that could not be read (no script then)."""

    run_id: str
    backend: str = ""
    scripts: dict[str, str] = field(default_factory=dict)
    written: list[str] = field(default_factory=list)  # "PATH" or "PATH (what to do with it)"
    submit: str = ""  # --for slurm --out: how to submit the files
    unreachable: list[Outcome[Any]] = field(default_factory=list)

    def said(self, *, printed: bool) -> list[Said]:
        """The files written and how to submit them; ``printed``: each script too (no --out)."""
        said = [Said("info", f"wrote {path}") for path in self.written]
        said += [Said("info", self.submit)] if self.submit else []
        for name, text in self.scripts.items() if printed else ():
            said += [Said("out", f"# ---- {name} ----"), Said("out", text)]
        return said

    def public_dict(self, *, slurm: bool) -> dict[str, Any]:
        """``--json``: the run id, the backend (not for Slurm) and every script."""
        target = {"for": "slurm"} if slurm else {"backend": self.backend}
        return {"command": "render", **target, "run_id": self.run_id, "scripts": self.scripts}


def render_phase(
    reach: Reach,
    inventory: Inventory,
    selected: list[Node],
    *,
    run_id: str | None,
    templates_dir: Path | None,
    offline: bool,
    out_dir: Path | None,
    slurm: bool = False,
) -> Rendered:
    """The scripts of ``selected`` (a job spans the whole cluster: every rank's place is planned from
    every node's facts), read through ``reach`` unless ``offline``; written into ``out_dir`` when given:
    scripts owner-only (they may hold the run's environment), inside it whatever their names, no link
    followed."""
    from orchestrator.bench.launch import planned_shares
    from orchestrator.runs.ids import new_run_id
    from orchestrator.steps.launch import RANK_CAPTURE, launch_files, launch_scripts, offline_plan, plan

    run_id = new_run_id(inventory.cluster.name, chosen=run_id, reserve=False)
    renderer = Renderer(templates_dir_for(inventory, templates_dir))
    if slurm:
        return _slurm(inventory, renderer, run_id, out_dir)
    if offline:
        launch_plan = offline_plan(inventory, run_id)
        if inventory.cluster.backend == "auto":
            reach.say("note", launch_plan.backend_reason)
    else:
        launch_plan = reach.within(list(inventory.nodes), "facts", lambda on: plan(on, inventory, run_id))
        failed = [o for o in launch_plan.inspected if not o.ok]
        if failed:
            return Rendered(run_id, unreachable=failed)
        for warning in launch_plan.warnings:
            reach.say("warn", warning)
        reach.say("note", f"backend: {launch_plan.backend_reason}")
    specs, shares_note = planned_shares(inventory, launch_plan.specs)  # what a launch adds
    if shares_note:
        reach.say("note", shares_note)
    shown = {n.name for n in selected}
    specs = [s for s in specs if s.node.name in shown]
    done = Rendered(run_id, launch_plan.backend, launch_scripts(renderer, specs))
    if out_dir is not None:
        out_dir.mkdir(parents=True, exist_ok=True)
        for file_name, data in launch_files(renderer, specs).items():
            if file_name == RANK_CAPTURE:  # the POSIX scripts start every rank through it
                path = write_inside(out_dir, file_name, data, mode=0o600)
                done.written.append(f"{path} (copy it beside each .sh script on the node)")
            else:
                done.written.append(str(write_inside(out_dir, file_name, data, mode=0o700)))
        done.written += _write_shares(out_dir, specs)
    return done


def _write_shares(out_dir: Path, specs: list[LaunchSpec]) -> list[str]:
    """The shares helper and file the scripts name (CB_SHARES_HELPER, CB_SHARES_FILE, in the run
    directory on each node, where a launch puts them)."""
    from orchestrator.bench.shares import SHARES_FILE, SHARES_HELPER, shares_helper_file
    from orchestrator.runs.layout import run_dir_for

    shared = [s for s in specs if s.shares_json]
    if not shared:
        return []
    helper = write_inside(out_dir, SHARES_HELPER, shares_helper_file().read_bytes(), mode=0o600)
    doc = write_inside(out_dir, SHARES_FILE, shared[0].shares_json.encode(), mode=0o600)
    where = [f"{s.node.name}: {run_dir_for(s.node, s.run_id)}" for s in shared]
    return [
        f"{helper} and {doc} (copy both to the run directory on each node, where the scripts' "
        f"CB_SHARES_HELPER and CB_SHARES_FILE name them: {', '.join(where)})"
    ]


def _slurm(inventory: Inventory, renderer: Renderer, run_id: str, out_dir: Path | None) -> Rendered:
    """--for slurm: the batch script and the node part (connects to nothing: Slurm allocates the
    nodes when the job starts); ``out_dir``: written with the rank capture, to submit by hand."""
    from orchestrator.slurm.job import BATCH_FILE, NODE_FILE, render_job
    from orchestrator.steps.launch import RANK_CAPTURE, rank_capture_file

    shown = render_job(renderer, inventory, run_id, secrets="mask")
    done = Rendered(run_id, scripts={BATCH_FILE: shown.batch, NODE_FILE: shown.node})
    if out_dir is not None:
        files = render_job(renderer, inventory, run_id, secrets="reference")
        out_dir.mkdir(parents=True, exist_ok=True)
        for name, text in ((BATCH_FILE, files.batch), (NODE_FILE, files.node)):
            done.written.append(str(write_inside(out_dir, name, text.encode(), mode=0o700)))
        capture = rank_capture_file().read_bytes()
        done.written.append(str(write_inside(out_dir, RANK_CAPTURE, capture, mode=0o600)))
        done.submit = (
            f"submit: copy them to {files.job_dir}/ (shared file system), "
            f"then sbatch {files.job_dir}/{BATCH_FILE}"
        )
    return done
