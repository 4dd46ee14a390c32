"""`bench --scaling`: the training script for a bounded number of steps on 1, 2, ... N nodes, each
with equal and with measured shares, its throughput read from the ``CB_METRIC`` lines it prints.

Node sets grow in inventory order, the master always in (it hosts the rendezvous). Each run is a
real launch of the inventory's training script (``train.script``, ``train.args`` plus ``--max-steps
N --log-every K``: the script must accept both, as the shipped example does) on a cluster of only
those nodes, planned like `launch` plans (facts, interfaces, backend) under a run id of its own.
Measured shares come from one probe of the whole cluster: each rank keeps its figure whatever the
set it trains in. A set of one rank runs once: its shares are the same either way.
"""

from __future__ import annotations

import dataclasses
import statistics
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from orchestrator.bench.cb_shares import parse_metric
from orchestrator.bench.shares import SharesDoc, rank_layout

if TYPE_CHECKING:
    from orchestrator.inventory import Inventory, Node
    from orchestrator.logs import RunLog
    from orchestrator.render import LaunchSpec, Renderer
    from orchestrator.session import Session
    from orchestrator.steps.launch import NodeRunResult
    from orchestrator.transports import Transport

MODES = ("equal", "measured")


@dataclass
class RankFigures:
    """One rank's ``summary`` metrics of one run."""

    rank: int
    node: str
    share: int
    step_time: float | None = None  # wall seconds per step
    compute_time: float | None = None  # seconds per step until its gradients were ready
    steps: int = 0

    def public_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass
class ScalingRun:
    """One run: a node set and a mode."""

    nodes: list[str]
    ranks: int
    mode: str  # "equal" or "measured"
    run_id: str
    shares: list[int] = field(default_factory=list)
    global_batch: int = 0
    samples_per_s: float | None = None  # global samples per wall second (the slowest rank's clock)
    step_time: float | None = None
    per_rank: list[RankFigures] = field(default_factory=list)
    losses: list[tuple[int, float]] = field(default_factory=list)  # (step, global mean loss), rank 0
    error: str | None = None
    same_as: str | None = None  # "equal": one rank, so measured shares are the equal ones

    @property
    def ok(self) -> bool:
        return self.error is None and self.samples_per_s is not None

    def public_dict(self) -> dict[str, Any]:
        doc = dataclasses.asdict(self)
        doc["per_rank"] = [r.public_dict() for r in self.per_rank]
        doc["losses"] = [list(p) for p in self.losses]
        return doc


@dataclass
class ScalingRow:
    nodes: int
    ranks: int
    figures: dict[str, tuple[float | None, float | None, float | None]]  # mode -> samples/s, speed-up, eff.
    probe_bound: float | None  # sum of the probe's rates of these ranks / that of the first set


@dataclass
class ScalingReport:
    runs: list[ScalingRun]
    steps: int
    probe_rates: dict[tuple[str, int], float] = field(default_factory=dict)  # (node, local rank)
    rounds: int = 1

    def run(self, nodes: int, mode: str) -> ScalingRun | None:
        """The run the tables show for a node set and mode: with several rounds, the one of median
        samples/s (the lower middle of an even count); a failed run only when none succeeded."""
        runs = [r for r in self.runs if len(r.nodes) == nodes and r.mode == mode]
        good = sorted((r for r in runs if r.ok), key=lambda r: r.samples_per_s or 0.0)
        if good:
            return good[(len(good) - 1) // 2]
        return runs[0] if runs else None

    def round_rates(self, nodes: int, mode: str) -> list[float]:
        """samples/s of every successful round of a node set and mode, in the order they ran."""
        return [
            r.samples_per_s
            for r in self.runs
            if len(r.nodes) == nodes and r.mode == mode and r.ok and r.samples_per_s is not None
        ]

    @property
    def ok(self) -> bool:
        return bool(self.runs) and all(r.ok for r in self.runs)

    def baseline(self) -> ScalingRun | None:
        """The first set's equal-shares run: every speed-up is relative to it."""
        first = min((len(r.nodes) for r in self.runs), default=0)
        return self.run(first, "equal")

    def rows(self) -> list[ScalingRow]:
        base = self.baseline()
        rows = []
        for count in sorted({len(r.nodes) for r in self.runs}):
            figures: dict[str, tuple[float | None, float | None, float | None]] = {}
            ranks = 0
            for mode in MODES:
                run = self.run(count, mode)
                if run is None:
                    continue
                ranks = run.ranks
                speedup = efficiency = None
                if run.samples_per_s and base is not None and base.samples_per_s:
                    speedup = run.samples_per_s / base.samples_per_s
                    efficiency = speedup / (run.ranks / base.ranks)
                figures[mode] = (run.samples_per_s, speedup, efficiency)
            rows.append(ScalingRow(count, ranks, figures, self._probe_bound(count)))
        return rows

    def _probe_bound(self, count: int) -> float | None:
        base = self.baseline()
        run = self.run(count, "equal") or self.run(count, "measured")
        if base is None or run is None or not self.probe_rates:
            return None
        try:
            mine = sum(self.probe_rates[(f.node, i)] for f, i in _locals(run))
            first = sum(self.probe_rates[(f.node, i)] for f, i in _locals(base))
        except KeyError:
            return None
        return mine / first if first else None

    def public_dict(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "steps": self.steps,
            "rounds": self.rounds,
            "runs": [r.public_dict() for r in self.runs],
            "table": [
                {
                    "nodes": row.nodes,
                    "ranks": row.ranks,
                    **{
                        f"{mode}_{name}": value
                        for mode, values in row.figures.items()
                        for name, value in zip(
                            ("samples_per_s", "speedup", "efficiency"), values, strict=True
                        )
                    },
                    "probe_bound": row.probe_bound,
                }
                for row in self.rows()
            ],
        }


def _locals(run: ScalingRun) -> list[tuple[RankFigures, int]]:
    """Each rank of a run with its local rank on its node."""
    out = []
    seen: dict[str, int] = {}
    for figures in sorted(run.per_rank, key=lambda f: f.rank):
        local = seen.get(figures.node, 0)
        seen[figures.node] = local + 1
        out.append((figures, local))
    return out


def node_sets(inventory: Inventory) -> list[list[Node]]:
    """1, 2, ... N nodes: the master, then the others in inventory order (each set in inventory order)."""
    master = inventory.cluster.master
    others = [n for n in inventory.nodes if n.name != master]
    sets = []
    for count in range(1, len(inventory.nodes) + 1):
        chosen = {master, *(n.name for n in others[: count - 1])}
        sets.append([n for n in inventory.nodes if n.name in chosen])
    return sets


def sub_inventory(inventory: Inventory, nodes: list[Node], *, steps: int, log_every: int) -> Inventory:
    """The inventory as a cluster of ``nodes`` only, training ``steps`` steps with a static rendezvous."""
    train = inventory.cluster.train
    args = (*train.args, "--max-steps", str(steps), "--log-every", str(log_every))
    cluster = inventory.cluster.model_copy(
        update={"train": train.model_copy(update={"args": args, "shares": "equal", "elastic": False})}
    )
    return dataclasses.replace(inventory, cluster=cluster, nodes=list(nodes), notes=[])


def read_metrics(run: ScalingRun, records: Sequence[dict[str, Any]], rank_nodes: dict[int, str]) -> None:
    """Fill ``run`` from the ranks' metrics records (``rank`` is the global rank)."""
    summaries = {int(r["rank"]): r for r in records if r.get("kind") == "summary" and "rank" in r}
    told = next((s.get("shares") for s in summaries.values() if isinstance(s.get("shares"), list)), None)
    if told is not None and len(told) == len(rank_nodes) and all(isinstance(x, int) for x in told):
        run.shares = list(told)  # what the script really used (its own global batch)
        run.global_batch = sum(told)
    for record in records:
        if record.get("kind") == "window" and record.get("rank") == 0 and record.get("loss") is not None:
            run.losses.append((int(record["step"]), float(record["loss"])))
    run.per_rank = []
    for rank in sorted(rank_nodes):
        summary = summaries.get(rank, {})
        run.per_rank.append(
            RankFigures(
                rank=rank,
                node=rank_nodes[rank],
                share=run.shares[rank] if rank < len(run.shares) else 0,
                step_time=_number(summary.get("step_time")),
                compute_time=_number(summary.get("compute_time")),
                steps=int(summary.get("steps") or 0),
            )
        )
    if len(summaries) != len(rank_nodes):
        missing = sorted(set(rank_nodes) - set(summaries))
        run.error = run.error or (
            f"no CB_METRIC summary from rank(s) {', '.join(map(str, missing))}: the training script must "
            "print them (docs/bench.md) and accept --max-steps and --log-every"
        )
        return
    seconds = max(float(s.get("seconds") or 0.0) for s in summaries.values())
    samples = statistics.median(float(s.get("global_samples") or 0) for s in summaries.values())
    run.samples_per_s = samples / seconds if seconds > 0 else None
    times = [f.step_time for f in run.per_rank if f.step_time is not None]
    run.step_time = max(times) if times else None


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def run_scaling(
    session: Session,
    inventory: Inventory,
    bench_id: str,
    *,
    rates: dict[tuple[str, int], float],
    steps: int,
    rounds: int = 1,
    log_every: int = 10,
    renderer: Renderer | None = None,
    logs: Callable[[str], RunLog] | None = None,
    on_line: Callable[[str, int | None, str], None] | None = None,
    global_batch: Callable[[int], int] | None = None,
) -> ScalingReport:
    """Every node set, with equal and with measured shares (``rates``: the probe's samples/s per
    (node, local rank); empty: equal shares only), ``rounds`` times each, the two modes alternating
    (equal first in odd rounds, measured first in even ones: a burst of other load does not always
    hit the same mode). ``logs(name)``: where a run's lines are kept; ``global_batch``: the measured
    shares' reference batch for a world size (the helper rescales it to the script's)."""
    from orchestrator.render import Renderer
    from orchestrator.session import Session
    from orchestrator.steps.launch import plan

    renderer = renderer or Renderer()
    report = ScalingReport([], steps, dict(rates), rounds)
    for nodes in node_sets(inventory):
        inv = sub_inventory(inventory, nodes, steps=steps, log_every=log_every)
        # a session of its own: a failed run stops (closes) only this node set's connections
        with Session(
            inv,
            list(nodes),
            ssh=session.ssh,
            passwords=session.passwords,
            on_event=session.executor.on_event,
            max_workers=session.executor.max_workers,
        ) as sub:
            base_id = f"{bench_id}-n{len(nodes)}"
            launch_plan = plan(sub, inv, base_id)
            failed = [o for o in launch_plan.inspected if not o.ok]
            layout = rank_layout([(s.node.name, s.nproc) for s in launch_plan.specs])
            world = len(layout)
            batch = global_batch(world) if global_batch is not None else 64 * world
            order = [(r, m) for r in range(rounds) for m in (MODES if r % 2 == 0 else MODES[::-1])]
            for round_index, mode in order:
                suffix = f"-r{round_index + 1}" if rounds > 1 else ""
                run = ScalingRun([n.name for n in nodes], world, mode, f"{base_id}-{mode}{suffix}")
                if mode == "measured" and world == 1:
                    continue  # one rank: its measured share is the equal one (added below)
                report.runs.append(run)
                if failed:
                    run.error = "; ".join(str(o.error) for o in failed)
                    continue
                if mode == "equal":
                    doc = SharesDoc.equal(world)
                elif all((r["node"], r["local_rank"]) in rates for r in layout):
                    figures = [rates[(r["node"], r["local_rank"])] for r in layout]
                    doc = SharesDoc.measured(figures, global_batch=batch, measured_at="")
                else:
                    run.error = "no measured speed for every rank (the probe failed)"
                    continue
                doc.ranks = layout
                run.shares = doc.for_batch(batch)
                run.global_batch = sum(run.shares)
                log = logs(f"n{len(nodes)}-{mode}{suffix}") if logs is not None else None
                try:
                    records = train_once(sub, launch_plan.specs, doc, run, renderer, log, on_line)
                finally:
                    if log is not None:
                        log.close()
                read_metrics(run, records, {r["rank"]: r["node"] for r in layout})
            if world == 1:  # the same runs stand for measured shares
                for run in [
                    r for r in report.runs if r.nodes == [n.name for n in nodes] and r.mode == "equal"
                ]:
                    report.runs.append(dataclasses.replace(run, mode="measured", same_as="equal"))
    return report


def train_once(
    session: Session,
    specs: list[LaunchSpec],
    doc: SharesDoc,
    run: ScalingRun,
    renderer: Renderer,
    log: RunLog | None,
    on_line: Callable[[str, int | None, str], None] | None,
) -> list[dict[str, Any]]:
    """One scaling run: the training script on every node of ``specs`` with ``doc``'s shares, under
    ``run.run_id``; its ``CB_METRIC`` records (``rank``: the global rank), failures in ``run.error``."""
    from orchestrator.bench.launch import with_shares
    from orchestrator.runs.ranks import split_rank
    from orchestrator.steps.launch import run_node

    renamed = with_shares([dataclasses.replace(s, run_id=run.run_id) for s in specs], doc)
    by_node = {s.node.name: s for s in renamed}
    records: list[dict[str, Any]] = []
    lock = threading.Lock()

    def line(node: str, text: str) -> None:
        if log is not None:
            log.write(node, text)
        local, rest = split_rank(text)
        rank = None if local is None else by_node[node].first_rank + local
        record = parse_metric(rest) if rank is not None else None
        if record is not None:
            record["rank"] = rank
            with lock:
                records.append(record)
        elif on_line is not None:
            on_line(node, rank, rest)

    def one(node: Node, transport: Transport) -> NodeRunResult:
        return run_node(node, transport, by_node[node.name], renderer=renderer, on_line=line)

    outcomes = session.map(one, step=f"train {len(specs)}n {run.mode}", fail_fast=True)
    errors = [o for o in outcomes if o.error is not None]
    if errors:
        run.error = str(errors[0].error)
    return records
