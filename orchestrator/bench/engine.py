"""`bootstrap bench` on a session: the probe on every rank, then (``scaling``) the scaling runs and
their HTML page. Returns a :class:`BenchReport`; writes ``bench.json`` (and ``scaling.html``) into
``runs/<id>/`` beside the nodes' logs. Printing is the CLI's (cli/bench.py)."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from orchestrator.bench.probe import Probe, ProbeReport, probe_problems, run_probe
from orchestrator.bench.scaling import ScalingReport, run_scaling
from orchestrator.bench.shares import SharesDoc
from orchestrator.errors import ExitCode
from orchestrator.executor import exit_code_for
from orchestrator.logs import RunLog
from orchestrator.view import Said, View

if TYPE_CHECKING:
    from orchestrator.inventory import Inventory
    from orchestrator.render import Renderer
    from orchestrator.runner import Reach
    from orchestrator.session import Session
    from orchestrator.steps.contract import Report
    from orchestrator.steps.dry_run import Planned
    from orchestrator.transports import SSHOptions


@dataclass
class BenchOptions:
    batch_size: int = 64  # the probe's batch, on each rank
    repeats: int = 5
    seconds: float = 0.5  # target time of one repeat
    timeout: float = 60.0  # seconds every rank has to join
    workload: str | None = None  # the user's module:function
    scaling: bool = False
    steps: int = 50  # training steps per scaling run
    rounds: int = 1  # scaling runs per node set and mode (the median is shown)
    log_every: int = 10

    def probe(self) -> dict[str, Any]:
        """What the probe is run with (bench.probe: run_probe and probe_specs)."""
        return {
            "batch_size": self.batch_size,
            "repeats": self.repeats,
            "seconds": self.seconds,
            "timeout": self.timeout,
            "workload": self.workload,
        }


#: a rank whose repeats spread wider than this ((max - min) / median) did not measure its device: the
#: machine was busy with something else (the differences between ranks can be that noise)
NOISY_SPREAD = 0.25


def probe_noise(probe: ProbeReport) -> str:
    """A warning when a rank's measurement spread is wider than NOISY_SPREAD: its samples/s (the
    slowest rank, measured shares) are then as much the machine's load as the device's; "" when not."""
    noisy = sorted(
        (r for r in probe.ranks.values() if r.spread is not None and r.spread > NOISY_SPREAD),
        key=lambda r: r.rank,
    )
    if not noisy:
        return ""
    named = ", ".join(f"rank {r.rank} on {r.node} ({(r.spread or 0) * 100:.0f} %)" for r in noisy[:4])
    return (
        f"the measurements are noisy: {named} spread over {NOISY_SPREAD * 100:.0f} % between repeats, as "
        "wide as the differences between ranks may be; the slowest rank and the shares above may be the "
        "machines' other load, not their devices. Run again on idle nodes, or with more --repeats, before "
        "`shares: measured` ships them"
    )


@dataclass
class BenchReport:
    run_id: str
    cluster: str
    options: BenchOptions
    directory: Path  # runs/<id>/ here
    probe: Probe | None = None
    problems: list[str] = field(default_factory=list)
    scaling: ScalingReport | None = None
    html: Path | None = None

    @property
    def probe_report(self) -> ProbeReport | None:
        return None if self.probe is None else self.probe.report

    def shares(self) -> SharesDoc | None:
        """Measured shares of the probe's batch x world (what ``shares: measured`` would ship)."""
        report = self.probe_report
        return report.shares() if report is not None and report.ok else None

    @property
    def ok(self) -> bool:
        report = self.probe_report
        probed = report is not None and report.ok and not self.problems
        return probed and (self.scaling is None or self.scaling.ok)

    def exit_code(self) -> ExitCode:
        if self.probe is not None:
            unreachable = [o for o in self.probe.plan.inspected if not o.ok]
            if unreachable:
                return exit_code_for(self.probe.plan.inspected)
        return ExitCode.OK if self.ok else ExitCode.NODES_FAILED

    def shown(self) -> list[View | Said]:
        """The tables, the slowest rank, the problems, where the files are."""
        views, probe = self.views(), self.probe_report
        said: list[View | Said] = []
        if probe is not None:
            said.append(views.pop(0))
            slowest = probe.slowest()
            fastest = max((r.samples_per_s or 0.0 for r in probe.ranks.values()), default=0.0)
            if slowest is not None and slowest.samples_per_s and len(probe.ranks) > 1:
                said.append(
                    Said(
                        "info",
                        f"slowest: rank {slowest.rank} on {slowest.node} ({slowest.samples_per_s:.0f} "
                        f"samples/s, {fastest / slowest.samples_per_s:.2f}x slower than the fastest)",
                    )
                )
            if noisy := probe_noise(probe):
                said.append(Said("warn", noisy))
            if self.shares() is not None:
                said.append(
                    Said(
                        "note",
                        "cluster.train.shares: measured gives each rank such a share of every "
                        "global batch (the training script's own batch, in the same proportions)",
                    )
                )
        said += [Said("error", problem) for problem in self.problems]
        if self.scaling is not None:
            said += views
            said += [
                Said("error", f"{len(run.nodes)} node(s), {run.mode} shares: {run.error}")
                for run in self.scaling.runs
                if run.error
            ]
            said += [Said("note", f"report: {self.html}")] if self.html is not None else []
        return [*said, Said("note", f"per-node output and bench.json: {self.directory}/")]

    def views(self) -> list[View]:
        """The tables: each rank's samples/s (the slowest in red; with its measured share when the
        probe succeeded), then with --scaling the node sets' figures and the largest set's ranks."""
        from orchestrator.bench.report import (
            PROBE_HEADER,
            RANK_HEADER,
            SCALING_HEADER,
            probe_rows,
            rank_rows,
            scaling_rows,
        )

        views, probe, shares = [], self.probe_report, self.shares()
        if probe is not None:
            backend = self.probe.plan.backend if self.probe else "?"
            title = (
                f"samples/s per rank: {probe.workload}, batch {probe.batch_size}, {probe.repeats} repeats "
                f"(backend {backend})"
            )
            header = [h for h in PROBE_HEADER if h != "error"]
            header += [f"share of {shares.global_batch}"] if shares is not None else []
            view = View(title, header, right=[h for h in header if h not in ("node", "device")])
            slowest = probe.slowest()
            for row, rank in zip(probe_rows(probe), sorted(probe.ranks), strict=True):
                cells = row[: len(PROBE_HEADER) - 1]
                cells += (
                    [str(shares.shares[rank])] if shares is not None and shares.shares is not None else []
                )
                marked = slowest is not None and rank == slowest.rank and len(probe.ranks) > 1
                view.add(*cells, style="bold red" if marked else "")
            views.append(view)
        if (scaling := self.scaling) is not None:
            rounds = f", median of {scaling.rounds} rounds (range)" if scaling.rounds > 1 else ""
            figures = View(
                f"scaling, {scaling.steps} steps per run{rounds}", SCALING_HEADER, right=SCALING_HEADER
            )
            ranks = View(
                "per rank, largest node set", RANK_HEADER, right=[h for h in RANK_HEADER if h != "node"]
            )
            for view, rows in ((figures, scaling_rows(scaling)), (ranks, rank_rows(scaling))):
                for cells in rows:
                    view.add(*cells)
            views += [figures, ranks]
        return views

    def public_dict(self) -> dict[str, Any]:
        report = self.probe_report
        shares = self.shares()
        return {
            "command": "bench",
            "run_id": self.run_id,
            "cluster": self.cluster,
            "ok": self.ok,
            "backend": None if self.probe is None else self.probe.plan.backend,
            "probe": None if report is None else report.public_dict(),
            "shares": None if shares is None else shares.document(),
            "problems": self.problems,
            "scaling": None if self.scaling is None else self.scaling.public_dict(),
            "html": None if self.html is None else str(self.html),
            "directory": str(self.directory),
        }


def run_bench(
    session: Session,
    inventory: Inventory,
    run_id: str,
    options: BenchOptions,
    *,
    renderer: Renderer | None = None,
    on_line: Callable[[str, int | None, str], None] | None = None,
    directory: Path | None = None,
) -> BenchReport:
    """The probe on every rank of the inventory's launch plan; then, with ``options.scaling``, the
    scaling runs (the probe's speeds give their measured shares) and the HTML page."""
    from orchestrator.bench.report import render_html

    directory = directory or Path("runs") / run_id
    directory.mkdir(parents=True, exist_ok=True)
    report = BenchReport(run_id, inventory.cluster.name, options, directory)
    probe_log = RunLog(directory / "probe")

    def probe_line(node: str, rank: int | None, text: str) -> None:
        probe_log.write(node, text)
        if on_line is not None:
            on_line(node, rank, text)

    try:
        report.probe = run_probe(
            session, inventory, run_id, **options.probe(), renderer=renderer, on_line=probe_line
        )
    finally:
        probe_log.close()
    if any(not o.ok for o in report.probe.plan.inspected):
        return report  # nodes unreachable: the CLI names them
    report.problems = probe_problems(report.probe)
    if options.scaling:
        probe = report.probe.report
        rates = (
            {(r.node, r.local_rank): float(r.samples_per_s or 0.0) for r in probe.ranks.values()}
            if probe.ok
            else {}
        )
        report.scaling = run_scaling(
            session,
            inventory,
            run_id,
            rates=rates,
            steps=options.steps,
            rounds=options.rounds,
            log_every=options.log_every,
            renderer=renderer,
            logs=lambda name: RunLog(directory / name),
            on_line=on_line,
            global_batch=lambda world: options.batch_size * world,
        )
        report.html = directory / "scaling.html"
        note = (
            f"cluster {inventory.cluster.name}, bench {run_id}: every figure on this page was measured "
            "on this cluster by this run"
        )
        report.html.write_text(
            render_html(
                title=f"Scaling of {inventory.cluster.name}",
                probe=probe,
                scaling=report.scaling,
                data=report.public_dict(),
                note=note,
            ),
            encoding="utf-8",
        )
    (directory / "bench.json").write_text(json.dumps(report.public_dict(), indent=1, sort_keys=True) + "\n")
    return report


def bench_phase(
    reach: Reach,
    inventory: Inventory,
    options: BenchOptions,
    *,
    templates_dir: Path | None = None,
    dry_run: SSHOptions | None = None,
) -> BenchReport | Report[Planned]:
    """`bootstrap bench` on every node of ``inventory`` (the probe uses the whole cluster's launch
    plan): :func:`run_bench` on a session of ``reach``, the workers' lines shown through
    ``reach.lines``. ``dry_run`` (the SSH options a run would connect with): each node's probe plan,
    connecting to nothing."""
    from orchestrator.bench.probe import WORKER, probe_specs
    from orchestrator.render import LaunchSpec, Renderer, require_secrets, templates_dir_for
    from orchestrator.resources import package_file
    from orchestrator.runs.ids import new_run_id
    from orchestrator.steps.launch import RANKS_TEMPLATE, offline_dry_run

    nodes = list(inventory.nodes)
    renderer = Renderer(templates_dir_for(inventory, templates_dir))
    run_id = new_run_id(inventory.cluster.name, kind="bench", reserve=dry_run is None)
    if dry_run is not None:

        def probes(specs: list[LaunchSpec]) -> list[LaunchSpec]:
            return probe_specs(specs, **options.probe())

        return offline_dry_run(
            "bench",
            inventory,
            run_id,
            renderer,
            probes,
            ssh=dry_run,
            say=reach.say,
            template=RANKS_TEMPLATE,
            script_file=package_file("bench/" + WORKER),
        )
    require_secrets(inventory)
    shown = None if reach.lines is None else reach.lines([n.name for n in nodes])
    on_line = None if shown is None else shown.write_rank
    return reach.within(
        nodes,
        "bench",
        lambda on: run_bench(on, inventory, run_id, options, renderer=renderer, on_line=on_line),
    )
