"""The throughput probe: a fixed training workload timed on every rank, with the real launch environment.

It runs the way `bootstrap validate` runs its worker: the launch plan's specs (interface, backend,
interpreter, environment, ``OMP_NUM_THREADS``), the worker uploaded into each node's run directory
and started once per local rank by ``ranks.sh.j2`` (native Windows: its launch template); its results
are records (orchestrator/records.py) ``probe <json>`` with the nonce the controller gave it
(:data:`records.NONCE_ENV`), read here; lines of that shape from anything else are plain output.
The ranks of one node run at the same time, as in training, where they share the node's cores.
"""

from __future__ import annotations

import dataclasses
import datetime
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from orchestrator import records
from orchestrator.bench.shares import SharesDoc, rank_layout
from orchestrator.render import LaunchSpec, Renderer
from orchestrator.resources import package_file
from orchestrator.runs.ranks import owned_rank

log = logging.getLogger(__name__)

if TYPE_CHECKING:
    from orchestrator.executor import Outcome
    from orchestrator.inventory import Inventory
    from orchestrator.session import Session
    from orchestrator.steps.launch import LaunchPlan, NodeRunResult

WORKER = "probe_worker.py"
#: the kind of the worker's records
RECORD = "probe"


@dataclass
class RankSpeed:
    rank: int
    node: str
    local_rank: int
    device: str = ""
    host: str = ""
    rates: list[float] = field(default_factory=list)  # samples/s of each repeat
    samples_per_s: float | None = None  # the median
    spread: float | None = None  # (max - min) / median over the repeats
    error: str | None = None

    def public_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass
class ProbeReport:
    """Every rank's measured speed (or why there is none)."""

    world_size: int
    ranks: dict[int, RankSpeed]
    batch_size: int
    repeats: int
    workload: str  # "mlp" (the shipped one) or the user's module:function
    measured_at: str = ""  # UTC, ISO 8601, when the probe started
    missing: list[int] = field(default_factory=list)
    unreachable: dict[int, str] = field(default_factory=dict)
    node_gpus: dict[str, list[str]] = field(default_factory=dict)  # from the facts
    timed_out: bool = False
    forged: dict[str, int] = field(default_factory=dict)  # node -> records it sent for ranks not its own

    @property
    def ok(self) -> bool:
        return (
            not self.missing
            and not self.unreachable
            and not self.timed_out
            and all(r.samples_per_s is not None and r.samples_per_s > 0 for r in self.ranks.values())
        )

    def rates(self) -> list[float]:
        """Median samples/s per rank, in rank order (only when ``ok``)."""
        return [float(self.ranks[r].samples_per_s or 0.0) for r in sorted(self.ranks)]

    def slowest(self) -> RankSpeed | None:
        measured = [r for r in self.ranks.values() if r.samples_per_s]
        return min(measured, key=lambda r: (r.samples_per_s or 0.0, r.rank)) if measured else None

    def feed(self, record: dict[str, Any], node: str, rank: int | None) -> None:
        """Take one worker record that ``node`` sent on a line tagged as global ``rank``; a record
        for a rank that is not the line's, or not ``node``'s, is ignored and counted in ``forged``."""
        kind = record.get("kind")
        entry = self.ranks.get(rank) if rank is not None else None
        if owned_rank(record, node, rank, entry.node if entry is not None else None) is None:
            self.forged[node] = self.forged.get(node, 0) + 1
            if self.forged[node] == 1:
                log.warning(
                    "%s: ignoring a probe record for rank %r, which this node does not run"
                    " (its line was tagged %s)",
                    node,
                    record.get("rank"),
                    "with no rank" if rank is None else f"as rank {rank}",
                )
            return
        assert rank is not None
        if kind == "missing":
            self.missing = sorted(int(r) for r in record.get("ranks", []))
        elif kind == "unreachable":
            self.unreachable[rank] = f"{record.get('master')}: {record.get('error')}"
        elif entry is None:
            return
        elif kind == "start":
            entry.device = str(record.get("device", ""))
            entry.host = str(record.get("host", ""))
        elif kind == "result":
            entry.rates = [float(r) for r in record.get("rates", [])]
            entry.samples_per_s = float(record["samples_per_s"])
            entry.spread = float(record.get("spread", 0.0))
        elif kind == "error":
            entry.error = str(record.get("error"))

    def shares(self, global_batch: int | None = None) -> SharesDoc:
        """Measured shares of ``global_batch`` (default: batch size x world size)."""
        doc = SharesDoc.measured(
            self.rates(),
            global_batch=global_batch or self.batch_size * self.world_size,
            measured_at=self.measured_at,
            probe=self.summary(),
        )
        doc.ranks = rank_layout(self._layout())
        return doc

    def _layout(self) -> list[tuple[str, int]]:
        nodes: list[tuple[str, int]] = []
        for rank in sorted(self.ranks):
            node = self.ranks[rank].node
            if nodes and nodes[-1][0] == node:
                nodes[-1] = (node, nodes[-1][1] + 1)
            else:
                nodes.append((node, 1))
        return nodes

    def summary(self) -> dict[str, Any]:
        """What the shares file keeps of the probe."""
        return {
            "workload": self.workload,
            "batch_size": self.batch_size,
            "repeats": self.repeats,
            "measured_at": self.measured_at,
            "ranks": [
                {
                    "rank": r.rank,
                    "node": r.node,
                    "device": r.device,
                    "samples_per_s": r.samples_per_s,
                    "spread": r.spread,
                }
                for r in (self.ranks[k] for k in sorted(self.ranks))
            ],
        }

    def public_dict(self) -> dict[str, Any]:
        slowest = self.slowest()
        return {
            "ok": self.ok,
            "world_size": self.world_size,
            "workload": self.workload,
            "batch_size": self.batch_size,
            "repeats": self.repeats,
            "measured_at": self.measured_at,
            "ranks": [self.ranks[r].public_dict() for r in sorted(self.ranks)],
            "slowest": None if slowest is None else {"rank": slowest.rank, "node": slowest.node},
            "node_gpus": self.node_gpus,
            "never_joined": self.missing,
            "unreachable": [{"rank": r, "error": e} for r, e in sorted(self.unreachable.items())],
            "timed_out": self.timed_out,
            # node -> records it sent in another node's ranks' name (ignored); only when there were any
            **({"forged_records": dict(self.forged)} if self.forged else {}),
        }


def probe_specs(
    specs: list[LaunchSpec],
    *,
    batch_size: int,
    repeats: int,
    seconds: float,
    timeout: float,
    workload: str | None = None,
    nonce: str | None = None,
) -> list[LaunchSpec]:
    """The launch specs as the probe runs them: the worker in place of the training script, run from
    the node's run directory (as validation runs its worker; ``validation_specs`` says why), its
    records with ``nonce`` (a fresh one when nobody reads them, the dry run)."""
    from orchestrator.runs.layout import run_dir_for

    env = {records.NONCE_ENV: records.check_nonce(nonce or records.new_nonce())}
    out = []
    for spec in specs:
        args = [
            "--timeout",
            f"{timeout:g}",
            "--batch-size",
            str(batch_size),
            "--repeats",
            str(repeats),
            "--seconds",
            f"{seconds:g}",
        ]
        if workload:
            args += ["--callable", workload, "--code-dir", spec.code_dir]
        run_dir = run_dir_for(spec.node, spec.run_id)
        out.append(
            dataclasses.replace(
                spec,
                code_dir=run_dir,
                script=WORKER,
                args=tuple(args),
                env={**spec.env, **env},
                # the callable's module comes from the code directory: refused when not ours, as launch
                imports_from=spec.code_dir if workload else "",
            )
        )
    return out


def node_gpus(launch_plan: LaunchPlan) -> dict[str, list[str]]:
    """GPU names per node, from the facts the launch plan gathered."""
    out: dict[str, list[str]] = {}
    for outcome in launch_plan.inspected:
        value = outcome.value
        report = value.facts.get("gpus") if value is not None else None
        out[outcome.node] = [str(getattr(g, "name", g)) for g in getattr(report, "gpus", ()) or ()]
    return out


@dataclass
class Probe:
    plan: LaunchPlan
    outcomes: list[Outcome[NodeRunResult]]
    report: ProbeReport


def run_probe(
    session: Session,
    inventory: Inventory,
    run_id: str,
    *,
    launch_plan: LaunchPlan | None = None,
    batch_size: int = 64,
    repeats: int = 5,
    seconds: float = 0.5,
    timeout: float = 60.0,
    workload: str | None = None,
    renderer: Renderer | None = None,
    on_line: Callable[[str, int | None, str], None] | None = None,
) -> Probe:
    """Run the probe worker on every rank of the launch plan (``launch_plan``, else planned here).

    ``on_line(node, rank, text)`` sees every line that is not a probe record. The workers give up
    joining after ``timeout`` s (counted from the moment each has imported torch: a slow node may
    take long to get there); the controller stops everything after twice ``timeout`` + four times
    the repeats' target time + 120 s, whatever happens.
    """
    from orchestrator.steps.launch import plan
    from orchestrator.steps.rank_workers import run_rank_workers

    renderer = renderer or Renderer()
    launch_plan = launch_plan or plan(session, inventory, run_id)
    nonce = records.new_nonce()
    specs = {
        s.node.name: s
        for s in probe_specs(
            launch_plan.specs,
            batch_size=batch_size,
            repeats=repeats,
            seconds=seconds,
            timeout=timeout,
            workload=workload,
            nonce=nonce,
        )
    }
    ranks = {
        spec.first_rank + local: RankSpeed(spec.first_rank + local, spec.node.name, local)
        for spec in specs.values()
        for local in range(spec.nproc)
    }
    report = ProbeReport(
        world_size=len(ranks),
        ranks=ranks,
        batch_size=batch_size,
        repeats=repeats,
        workload=workload or "mlp",
        measured_at=datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        node_gpus=node_gpus(launch_plan),
    )

    def timed_out() -> None:
        report.timed_out = True

    outcomes = run_rank_workers(
        session,
        specs,
        package_file("bench/" + WORKER),
        nonce=nonce,
        record=RECORD,
        feed=report.feed,
        on_line=on_line,
        give_up_after=2 * timeout + repeats * seconds * 4 + 120.0,
        on_give_up=timed_out,
        renderer=renderer,
        step="probe",
    )
    return Probe(launch_plan, outcomes, report)


def probe_problems(probe: Probe) -> list[str]:
    """What went wrong, most telling first (empty when every rank was measured)."""
    report = probe.report
    lines: list[str] = []
    for rank, error in sorted(report.unreachable.items()):
        lines.append(f"rank {rank} on {report.ranks[rank].node} cannot reach the master: {error}")
    if report.missing:
        named = ", ".join(f"{report.ranks[r].node} (rank {r})" for r in report.missing if r in report.ranks)
        lines.append(f"ranks never joined: {named}")
    for rank in sorted(report.ranks):
        entry = report.ranks[rank]
        if entry.error:
            lines.append(f"rank {rank} on {entry.node}: the workload failed: {entry.error}")
    if report.timed_out:
        lines.append("the probe did not finish in time and was stopped")
    for outcome in probe.outcomes:
        if outcome.error is not None and not lines:
            lines.append(str(outcome.error))
    if not lines and not report.ok:
        lines.append("the probe did not measure every rank")
    return lines
