"""`bootstrap validate`: prove the cluster can train before it trains.

Every rank of the real launch plan (same interfaces, backend, interpreter, environment) runs the shipped
worker (``probes/validate_worker.py``) through ``ranks.sh.j2``: one process per local rank with
torchrun's environment. The worker joins through the master's TCPStore, checks an all_reduce result,
then times all_reduce for a few sizes. Its results are records (orchestrator/records.py) ``validate
<json>`` with the nonce the controller gave it (:data:`records.NONCE_ENV`), collected here into a
report; a join that does not complete becomes "ranks never joined: ..." with node names, not a hang.
Lines of the same shape printed by anything else (the user's environment, a library) are plain output.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from orchestrator import records
from orchestrator.errors import (
    BootstrapError,
    CancelledError,
    CommandFailedError,
    ConnectError,
    ExitCode,
    UnsafeDirectoryError,
)
from orchestrator.executor import exit_code_for
from orchestrator.render import LaunchSpec, Renderer
from orchestrator.resources import package_file
from orchestrator.runs.layout import run_dir_for
from orchestrator.runs.ranks import owned_rank, split_worker_rank
from orchestrator.steps.launch import RANKS_TEMPLATE, plan
from orchestrator.steps.rank_workers import run_rank_workers
from orchestrator.transports.base import Result
from orchestrator.view import Said, View, human_bytes

log = logging.getLogger(__name__)

if TYPE_CHECKING:
    from orchestrator.executor import Outcome
    from orchestrator.inventory import Inventory
    from orchestrator.runner import Reach
    from orchestrator.session import Session
    from orchestrator.steps.contract import Report
    from orchestrator.steps.launch import LaunchPlan, NodeRunResult
    from orchestrator.transports import SSHOptions

WORKER = "validate_worker.py"
DEFAULT_SIZES = (4096, 262144, 4194304)  # 4 KiB (latency), 256 KiB, 4 MiB (bandwidth)
#: the kind of the worker's records
RECORD = "validate"


@dataclass
class SizeResult:
    bytes: int
    iters: int
    latency_s: float
    algbw: float  # bytes/s
    busbw: float  # bytes/s, nccl-tests convention: algbw * 2(n-1)/n for all_reduce


@dataclass
class ValidateReport:
    world_size: int
    ranks: dict[int, str]  # global rank -> node
    started: set[int] = field(default_factory=set)
    joined: dict[int, float] = field(default_factory=dict)  # rank -> seconds to join
    missing: list[int] = field(default_factory=list)  # reported by rank 0: never registered
    unreachable: dict[int, str] = field(default_factory=dict)  # rank -> error reaching the master
    correct: bool | None = None
    results: list[SizeResult] = field(default_factory=list)
    timed_out: bool = False
    torch: dict[int, str] = field(default_factory=dict)
    forged: dict[str, int] = field(default_factory=dict)  # node -> records it sent for ranks not its own
    nonce: str = ""  # of the workers' records

    @property
    def ok(self) -> bool:
        return (
            self.correct is True
            and len(self.joined) == self.world_size
            and not self.missing
            and not self.unreachable
            and not self.timed_out
        )

    def view(self) -> View | None:
        """The all_reduce table (None: nothing was timed): per size its iterations, latency, algorithm
        and bus bandwidth."""
        if not self.results:
            return None
        columns = ("size", "iterations", "latency", "algbw", "busbw")
        view = View(f"all_reduce, {self.world_size} ranks", columns, right=columns)
        for r in self.results:
            latency = f"{r.latency_s * 1e3:.3f} ms"
            view.add(
                human_bytes(r.bytes),
                str(r.iters),
                latency,
                f"{human_bytes(r.algbw)}/s",
                f"{human_bytes(r.busbw)}/s",
            )
        return view

    def never_joined(self) -> list[int]:
        """Ranks that did not join: what rank 0 reported, else every rank that never said "joined"."""
        if self.missing:
            return sorted(self.missing)
        if self.correct is None:
            return sorted(set(self.ranks) - set(self.joined))
        return []

    def describe_ranks(self, ranks: list[int]) -> str:
        """``node2 (ranks 2, 3), node3 (rank 4)``."""
        by_node: dict[str, list[int]] = {}
        for rank in ranks:
            by_node.setdefault(self.ranks.get(rank, "?"), []).append(rank)
        parts = []
        for node, rs in by_node.items():
            label = "rank" if len(rs) == 1 else "ranks"
            parts.append(f"{node} ({label} {', '.join(str(r) for r in rs)})")
        return ", ".join(parts)

    def feed(self, record: dict[str, Any], node: str, rank: int | None) -> None:
        """Take one worker record that ``node`` sent on a line tagged as global ``rank``; a record
        for a rank that is not the line's, or not ``node``'s, is ignored and counted in ``forged``."""
        kind = record.get("kind")
        if owned_rank(record, node, rank, self.ranks.get(rank) if rank is not None else None) is None:
            self.forged[node] = self.forged.get(node, 0) + 1
            if self.forged[node] == 1:
                log.warning(
                    "%s: ignoring a validation record for rank %r, which this node does not run"
                    " (its line was tagged %s)",
                    node,
                    record.get("rank"),
                    "with no rank" if rank is None else f"as rank {rank}",
                )
            return
        assert rank is not None
        if kind == "start":
            self.started.add(rank)
            if isinstance(record.get("torch"), str):
                self.torch[rank] = record["torch"]
        elif kind == "joined":
            self.joined[rank] = float(record.get("seconds", 0.0))
        elif kind == "missing":
            self.missing = [int(r) for r in record.get("ranks", [])]
        elif kind == "unreachable":
            self.unreachable[rank] = f"{record.get('master')}: {record.get('error')}"
        elif kind == "correct":
            ok = bool(record.get("ok"))
            self.correct = ok if self.correct is None else self.correct and ok
        elif kind == "result":
            self.results.append(
                SizeResult(
                    bytes=int(record["bytes"]),
                    iters=int(record["iters"]),
                    latency_s=float(record["latency_s"]),
                    algbw=float(record["algbw"]),
                    busbw=float(record["busbw"]),
                )
            )

    def public_dict(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "world_size": self.world_size,
            "joined": len(self.joined),
            "never_joined": [{"rank": r, "node": self.ranks.get(r)} for r in self.never_joined()],
            "unreachable": [
                {"rank": r, "node": self.ranks.get(r), "error": e}
                for r, e in sorted(self.unreachable.items())
            ],
            "correct": self.correct,
            "timed_out": self.timed_out,
            "all_reduce": [dataclasses.asdict(r) for r in self.results],
            # node -> records it sent in another node's ranks' name (ignored); only when there were any
            **({"forged_records": dict(self.forged)} if self.forged else {}),
        }


def parse_sizes(text: str) -> tuple[int, ...]:
    """``4K,1M,64M`` -> bytes (K/M/G are powers of 1024)."""
    sizes = []
    for part in text.split(","):
        part = part.strip().upper().removesuffix("B").removesuffix("I")
        if not part:
            continue
        factor = 1
        for suffix, value in (("K", 1 << 10), ("M", 1 << 20), ("G", 1 << 30)):
            if part.endswith(suffix):
                factor, part = value, part[:-1]
                break
        try:
            number = int(part) * factor
        except ValueError:
            raise ValueError(f"not a size: {part!r} (examples: 4096, 256K, 4M)") from None
        if number < 4:
            raise ValueError(f"size {number} is smaller than one float32")
        sizes.append(number)
    if not sizes:
        raise ValueError("no sizes given")
    return tuple(sizes)


def validation_specs(
    specs: list[LaunchSpec], timeout: float, sizes: tuple[int, ...], nonce: str | None = None
) -> list[LaunchSpec]:
    """The launch specs as validation runs them: the shipped worker in place of the training script,
    its records with ``nonce`` (in its environment: :data:`records.NONCE_ENV`; a fresh one when
    nobody reads them, the dry run).

    The worker is a relative script in the code directory, and the code directory is the node's run
    directory: ``prepare_node``/``prepare_windows_node`` upload a relative script to
    ``code_dir/script``, and the rank scripts enter ``code_dir`` (``cd``, ``Set-Location``) before
    running ``python script``. So the worker is uploaded to, and run from, ``run_dir/validate_worker.py``
    on Linux, WSL and native Windows, whether the workdir is absolute or starts with ``~`` (a path
    with ``~`` passed to Python as an argument would be relative: no shell expands it there).
    """
    env = {records.NONCE_ENV: records.check_nonce(nonce or records.new_nonce())}
    out = []
    for spec in specs:
        args = ("--backend", spec.backend, "--timeout", f"{timeout:g}", "--sizes", ",".join(map(str, sizes)))
        run_dir = run_dir_for(spec.node, spec.run_id)
        out.append(
            dataclasses.replace(spec, code_dir=run_dir, script=WORKER, args=args, env={**spec.env, **env})
        )
    return out


@dataclass
class Validation:
    plan: LaunchPlan
    outcomes: list[Outcome[NodeRunResult]]
    report: ValidateReport
    run_id: str = ""
    log_dir: Path | None = None  # the controller's copy of every worker line (validation_phase)

    @staticmethod
    def node_fields(outcome: Outcome[NodeRunResult]) -> dict[str, Any]:
        """A node's ``--json`` fields: none beyond the common ones (the ranks' results are the run's)."""
        return {}

    def shown(self) -> list[View | Said]:
        """Who joined (and how slow the slowest), the all_reduce table, what failed, and where every
        worker line is when anything did."""
        report, problems = self.report, failure_summary(self)
        said: list[View | Said] = []
        if report.joined:
            slowest = max(report.joined.values())
            correct = "; all_reduce result correct" if report.correct else ""
            said.append(
                Said(
                    "info",
                    f"{len(report.joined)} of {report.world_size} rank(s) joined "
                    f"(backend {self.plan.backend}, slowest {slowest:.2f} s){correct}",
                )
            )
        said += [view] if (view := report.view()) is not None else []
        said += [Said("error", problem) for problem in problems]
        if problems and self.log_dir is not None:
            said.append(
                Said(
                    "note", f"per-node output: {self.log_dir}/ (validation worker lines; -v shows them live)"
                )
            )
        return said

    def exit_code(self) -> ExitCode:
        """3 when a node could not be reached, before the run or during it, else 1 when anything
        failed."""
        unreachable = exit_code_for(self.plan.inspected)
        if unreachable != ExitCode.OK:
            return unreachable
        if any(isinstance(o.error, ConnectError) for o in self.outcomes):
            return ExitCode.CONNECTION  # lost while it ran
        if _refusals(self):
            return ExitCode.USAGE  # a workdir another user could change: the inventory has to change
        return ExitCode.OK if self.report.ok and not failure_summary(self) else ExitCode.NODES_FAILED


def validate(
    session: Session,
    inventory: Inventory,
    run_id: str,
    *,
    timeout: float = 60.0,
    sizes: tuple[int, ...] = DEFAULT_SIZES,
    renderer: Renderer | None = None,
    on_line: Callable[[str, int | None, str], None] | None = None,
    launch_plan: LaunchPlan | None = None,
) -> Validation:
    """Run the validation worker on every rank; ``on_line(node, rank, text)`` sees every other line.

    The workers give up after ``timeout`` seconds of joining; the controller stops everything
    ``timeout`` + 60 s after the start whatever happens (a rank stuck inside a collective).
    """
    renderer = renderer or Renderer()
    launch_plan = launch_plan or plan(session, inventory, run_id)
    worker = package_file("steps/probes/" + WORKER)
    nonce = records.new_nonce()
    specs = {spec.node.name: spec for spec in validation_specs(launch_plan.specs, timeout, sizes, nonce)}
    ranks: dict[int, str] = {}
    for spec in specs.values():
        for local in range(spec.nproc):
            ranks[spec.first_rank + local] = spec.node.name
    report = ValidateReport(world_size=len(ranks), ranks=ranks, nonce=nonce)

    def timed_out() -> None:
        report.timed_out = True

    # no fail fast: a rank that cannot reach the master gives up at the same moment rank 0 names the
    # missing ranks; every worker is bounded by --timeout on its own, the watchdog 60 s later
    outcomes = run_rank_workers(
        session,
        specs,
        worker,
        nonce=nonce,
        record=RECORD,
        feed=report.feed,
        on_line=on_line,
        give_up_after=timeout + 60.0,
        on_give_up=timed_out,
        renderer=renderer,
        step="validate",
    )
    return Validation(launch_plan, outcomes, report)


def failure_summary(validation: Validation) -> list[str]:
    """What went wrong, most telling first (empty when validation passed)."""
    refused = _refusals(validation)
    if refused:  # no rank started there, so the others waited in vain: the refusal is the cause
        return refused
    report = validation.report
    lines: list[str] = []
    never = report.never_joined()
    if report.unreachable:
        for rank, error in sorted(report.unreachable.items()):
            lines.append(f"rank {rank} on {report.ranks.get(rank)} cannot reach the master: {error}")
    if never:
        lines.append(
            f"ranks never joined: {report.describe_ranks(never)} "
            f"({len(report.ranks) - len(never)} of {report.world_size} joined)"
        )
    if report.correct is False:
        lines.append("all_reduce returned a WRONG result: ranks disagree (mixed builds or a broken backend)")
    if report.timed_out:
        lines.append("validation did not finish in time and was stopped (a rank hung inside a collective)")
    started_nodes = {report.ranks.get(rank) for rank in report.started}
    for outcome in validation.outcomes:
        failure = outcome.error
        if failure is None or isinstance(failure, CancelledError):
            continue
        if isinstance(failure, CommandFailedError) and (never or report.unreachable):
            if outcome.node in started_nodes:
                continue  # explained above: every worker exits non-zero when a rank is missing
            # none of its workers started (no python, no torch, no code dir): that is the cause
            lines.append(str(failure))
            lines.extend(f"  {outcome.node}: {text}" for text in _last_words(failure, report.nonce))
            continue
        if isinstance(failure, BootstrapError):
            lines.append(str(failure))
    if not lines and not report.ok:
        lines.append("validation did not complete")
    return lines


def _refusals(validation: Validation) -> list[str]:
    """The nodes whose run directory was refused (``UnsafeDirectoryError``), one line each."""
    return [str(o.error) for o in validation.outcomes if isinstance(o.error, UnsafeDirectoryError)]


def _last_words(failure: CommandFailedError, nonce: str, count: int = 3) -> list[str]:
    """The last distinct lines a failed node printed (its ranks print the same error once each),
    its workers' records (of ``nonce``) left out."""
    result = failure.result
    if not isinstance(result, Result):
        return []
    words: list[str] = []
    for text in reversed(result.tail(50)):
        _, text = split_worker_rank(text)
        text = text.strip()
        if text and records.decode_line(text, nonce) is None and text not in words:
            words.append(text)
        if len(words) == count:
            break
    return words[::-1]


@dataclass
class Skipped:
    """Validation not run: nothing it checks changed since it passed on these ``nodes`` at ``when``."""

    when: float
    nodes: int = 0

    def said(self) -> Said:
        when = time.strftime("%Y-%m-%d %H:%M", time.localtime(self.when))
        return Said(
            "info",
            f"validate: skipped: nothing it checks changed since it passed on these {self.nodes} node(s) at "
            f"{when} (addresses, interpreters, torch, interfaces, backend, firewall settings, train.env and "
            "-e); --validate runs it anyway",
        )


def validate_unless_unchanged(
    session: Session, inventory: Inventory, run_id: str, *, reuse: bool, **options: Any
) -> Validation | Skipped:
    """:func:`validate` on the launch plan of the facts the session holds (the preflight's: no round
    trip), skipped when ``reuse`` and nothing it depends on changed since it last passed on these
    nodes (steps/validate_stamp.py); a success writes the stamp either way."""
    from orchestrator.steps.validate_stamp import save_stamp, unchanged_since

    launch_plan = plan(session, inventory, run_id)
    key, last = unchanged_since(inventory, launch_plan, reuse=reuse)
    if last is not None:
        return Skipped(last.when, len(inventory.nodes))
    result = validate(session, inventory, run_id, launch_plan=launch_plan, **options)
    if result.exit_code() == ExitCode.OK and key is not None:
        save_stamp(inventory, key)
    return result


def validation_phase(
    reach: Reach,
    inventory: Inventory,
    *,
    timeout: float = 60.0,
    sizes: tuple[int, ...] = DEFAULT_SIZES,
    templates_dir: Path | None = None,
    reuse: bool = False,
    dry_run: SSHOptions | None = None,
) -> Validation | Skipped | Report[Any]:
    """`bootstrap validate` and the main pipeline's validate phase on every node of ``inventory``:
    :func:`validate_unless_unchanged` (``reuse``: the pipeline without ``--validate``) on a session of
    ``reach``, every worker line kept in runs/<run-id>/ here and shown through ``reach.lines``.
    ``templates_dir``: ``--templates``, else the inventory's. ``dry_run`` (the SSH options a run
    would connect with): each node's plan, connecting to nothing."""
    from orchestrator.logs import RunLog
    from orchestrator.render import templates_dir_for
    from orchestrator.runs.ids import new_run_id
    from orchestrator.steps.launch import offline_dry_run

    nodes = list(inventory.nodes)
    renderer = Renderer(templates_dir_for(inventory, templates_dir))
    run_id = new_run_id(inventory.cluster.name, kind="validate", reserve=dry_run is None)
    if dry_run is not None:
        worker = package_file("steps/probes/" + WORKER)
        return offline_dry_run(
            "validate",
            inventory,
            run_id,
            renderer,
            lambda specs: validation_specs(specs, timeout, sizes),
            ssh=dry_run,
            say=reach.say,
            template=RANKS_TEMPLATE,
            script_file=worker,
        )
    log = RunLog(Path("runs") / run_id)
    shown = None if reach.lines is None else reach.lines([n.name for n in nodes])

    def on_line(node: str, rank: int | None, text: str) -> None:
        log.write(node, text)
        if shown is not None:
            shown.write_rank(node, rank, text)

    try:
        result = reach.within(
            nodes,
            "validate",
            lambda on: validate_unless_unchanged(
                on,
                inventory,
                run_id,
                reuse=reuse,
                timeout=timeout,
                sizes=sizes,
                renderer=renderer,
                on_line=on_line,
            ),
        )
    finally:
        log.close()
    kept = log.directory.is_dir() and any(log.directory.iterdir())
    if not kept:  # skipped, or no worker said anything: no empty directory left to look into
        with contextlib.suppress(OSError):
            log.directory.rmdir()
    if isinstance(result, Validation):
        result.run_id, result.log_dir = run_id, log.directory if kept else None
    return result
