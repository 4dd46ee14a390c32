"""`logs`, `status`, `stop` and `fetch` over a run's nodes: which nodes and rank labels a run has,
each operation of runs/control.py on every node at once, and what its results mean (a node with no
such run failed, a controller that vanished, a missing path, which copy of a log is kept). The CLI
shows these reports; it decides nothing of them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from orchestrator.errors import ExitCode, UsageError
from orchestrator.executor import GroupResult, Outcome, exit_code_for
from orchestrator.facts.interpreter import interpreter_for
from orchestrator.runs.control import (
    Fetched,
    NodeStatus,
    StopResult,
    fetch_node,
    follow_node,
    no_such_run,
    status_node,
    stop_node,
)
from orchestrator.runs.layout import RUNS_ROOT, controller_lost, read_record, sample_nonce
from orchestrator.runs.ranks import rank_labels
from orchestrator.runs.tail import FollowResult

if TYPE_CHECKING:
    from orchestrator.inventory import Inventory, Node
    from orchestrator.logs import RunLog
    from orchestrator.session import Session
    from orchestrator.transports.base import BlockHandler


def recorded_nodes(
    inventory: Inventory, nodes: list[Node], run_id: str, *, narrowed: bool
) -> tuple[list[Node], dict[str, tuple[int, int]]]:
    """The nodes a run launched from here used (its record: ``launch --nodes`` may have left some
    out) unless ``narrowed`` (``--nodes`` names them), and each node's rank labels as that run gave
    them (an elastic run's lines carry their global rank themselves)."""
    labels = rank_labels(inventory)
    record = read_record(RUNS_ROOT / run_id) or {}
    recorded = record.get("nodes")
    if not isinstance(recorded, dict) or not recorded:
        return nodes, labels
    if not narrowed:
        nodes = [n for n in inventory.nodes if n.name in recorded] or nodes
    if not inventory.cluster.train.elastic:
        for name, doc in recorded.items():
            try:
                labels[str(name)] = (int(doc["first_rank"]), int(doc["nproc"]))
            except (KeyError, TypeError, ValueError):
                continue
    return nodes, labels


# -- logs ----------------------------------------------------------------------------------------------


@dataclass
class LogsReport:
    """Every node's read of its log; ``copies``: per node what became of runs/<run-id>/<node>.log
    here (``RunLog.settle``; empty with ``--tail``, which writes no copy); ``interrupted``: the
    Ctrl-C or SIGTERM that cut the reads short (the copies were settled first)."""

    outcomes: GroupResult[FollowResult]
    copies: dict[str, str] = field(default_factory=dict)
    interrupted: KeyboardInterrupt | None = None

    def node_fields(self, outcome: Outcome[FollowResult]) -> dict[str, Any]:
        """A node's ``--json`` fields: byte offsets in its node.log (reading began at ``start``, 0
        without ``--tail``, and ended at ``end``; ``bytes`` read), lines, reconnects, and ``copy``:
        runs/<run-id>/<node>.log here "written", "kept" (the read failed), "busy" (a running launch or
        another `logs` writes it), "none" (failed, and there is none); null with ``--tail``."""
        read = outcome.value
        return {
            "exit_code": read.exit_code if read else None,
            "lines": read.lines if read else None,
            "start": read.start if read else None,
            "end": read.offset if read else None,
            "bytes": read.offset - read.start if read else None,
            "reconnects": read.reconnects if read else None,
            "copy": self.copies.get(outcome.node),
        }

    def exit_code(self, *, follow: bool) -> ExitCode:
        """A failed read; with ``--follow``, also a node whose training did not exit 0."""
        code = exit_code_for(self.outcomes)
        ended_badly = any(isinstance(o.value, FollowResult) and o.value.exit_code != 0 for o in self.outcomes)
        return ExitCode.NODES_FAILED if follow and code == ExitCode.OK and ended_badly else code


def read_logs(
    session: Session,
    run_id: str,
    outputs: Mapping[str, BlockHandler],
    run_log: RunLog | None,
    *,
    follow: bool,
    tail: int | None,
    on_note: Callable[[str, str], None],
    on_read: Callable[[str, FollowResult], None] | None = None,
) -> LogsReport:
    """Every node's log from its start (or its last ``tail`` lines) into ``outputs``; ``run_log``
    (staged: None with ``tail``) settles each node's copy here: a node read to the end replaces it,
    a failed read keeps it, a read cut short by Ctrl-C replaces it only when longer (of two prefixes
    of the same append-only log, the longer). ``on_read``: each node's read as it ends."""
    read: dict[str, FollowResult] = {}  # nodes whose read has ended well (known before Ctrl-C too)
    samples = sample_nonce(RUNS_ROOT / run_id)  # not shown: a tail's N lines do not count them

    def one(node: Node, t: Any) -> FollowResult:
        result = follow_node(
            node,
            t,
            run_id,
            follow=follow,
            output=outputs[node.name],
            on_note=on_note,
            python=interpreter_for(node),  # the run's own: it is there
            lines=tail,
            samples=samples,
        )
        read[node.name] = result
        if on_read is not None:
            on_read(node.name, result)
        return result

    try:
        with session:
            outcomes = session.map(one, step="logs")
        report = LogsReport(outcomes)
        if run_log is not None:
            report.copies = run_log.settle(outputs, {o.node: "replace" if o.ok else "keep" for o in outcomes})
        return report
    except KeyboardInterrupt as stop:
        report = LogsReport(GroupResult(), interrupted=stop)
        if run_log is not None:
            report.copies = run_log.settle(
                outputs, {n: "replace" if n in read else "longer" for n in outputs}
            )
        return report
    finally:
        if run_log is not None:
            run_log.close()  # drops the parts not committed: the copies stay as they were


# -- status --------------------------------------------------------------------------------------------


@dataclass
class StatusReport:
    """Every node's status of the run: a node with no such run failed (its state kept); ``lost``:
    the run's foreground controller vanished (every node then says "controller lost", its own word
    in ``node_state``); ``train``: the record's arguments of a run launched from here."""

    outcomes: GroupResult[NodeStatus]
    lost: bool = False
    train: dict[str, Any] | None = None


def status_all(session: Session, run_id: str) -> StatusReport:
    by_name = {n.name: n for n in session.nodes}
    outcomes = session.map(lambda node, t: status_node(node, t, run_id), step="status")
    outcomes = GroupResult(_unknown_run(o, by_name[o.node], run_id) for o in outcomes)
    record = read_record(RUNS_ROOT / run_id)
    lost = controller_lost(
        record, [o.value.state if o.ok and o.value is not None else "unknown" for o in outcomes]
    )
    if lost:
        outcomes = GroupResult(_as_lost(o) for o in outcomes)
    train = (record or {}).get("train")
    return StatusReport(outcomes, lost, train if isinstance(train, dict) else None)


def _unknown_run(outcome: Outcome[NodeStatus], node: Node, run_id: str) -> Outcome[NodeStatus]:
    if outcome.value is None or outcome.value.state != "no run":
        return outcome
    return dataclasses.replace(outcome, error=no_such_run(node, run_id))


def _as_lost(outcome: Outcome[NodeStatus]) -> Outcome[NodeStatus]:
    value = outcome.value
    assert value is not None
    said = (
        value.state if value.exit_code is None or value.state == "stopped" else f"exited ({value.exit_code})"
    )
    return dataclasses.replace(
        outcome, value=dataclasses.replace(value, state="controller lost", node_state=said)
    )


# -- stop and fetch ------------------------------------------------------------------------------------


def stop_all(session: Session, run_id: str, *, grace: float) -> GroupResult[StopResult]:
    return session.map(lambda node, t: stop_node(node, t, run_id, grace=grace), step="stop")


@dataclass
class FetchReport:
    outcomes: GroupResult[list[Fetched]]

    @property
    def missing(self) -> list[tuple[str, str]]:
        """(node, path) for every path a node did not have."""
        return [(o.node, f.path) for o in self.outcomes if o.value for f in o.value if f.source is None]

    def exit_code(self) -> ExitCode:
        code = exit_code_for(self.outcomes)
        return ExitCode.NODES_FAILED if code == ExitCode.OK and self.missing else code

    @staticmethod
    def node_fields(outcome: Outcome[list[Fetched]]) -> dict[str, Any]:
        return {"paths": [dataclasses.asdict(f) for f in outcome.value] if outcome.value else []}


def fetch_on_slurm(
    session: Session,
    inventory: Inventory,
    run_id: str,
    paths: Sequence[str],
    *,
    from_code: bool,
    copy: bool = True,
) -> FetchReport:
    """fetch of a Slurm run: its nodes' directories are on the shared file system, read through the
    login host (``session``: over that host alone); ``copy`` False (--dry-run) lists, copies nothing."""
    check_fetch_paths(paths)
    from orchestrator.slurm.job import login_node
    from orchestrator.slurm.run import fetch_run

    login = session.transport(login_node(inventory))
    dest = RUNS_ROOT / run_id
    return FetchReport(
        GroupResult(
            fetch_run(login, inventory, run_id, paths, dest_root=dest, from_code=from_code, copy=copy)
        )
    )


def check_fetch_paths(paths: Sequence[str]) -> None:
    """An empty PATH names nothing (as a relative path it would be the whole run's outputs): a usage
    error, not a copy of everything."""
    if any(not path.strip() for path in paths):
        raise UsageError("fetch: an empty PATH names no file", hint="name the file or directory to copy")


def fetch_all(
    session: Session, run_id: str, paths: Sequence[str], *, code_dir: str | None, from_code: bool
) -> FetchReport:
    """Each path from every node into runs/<run-id>/<node>/ here."""
    check_fetch_paths(paths)
    return FetchReport(
        session.map(
            lambda node, t: fetch_node(
                node,
                t,
                run_id,
                paths,
                code_dir=code_dir,
                dest=RUNS_ROOT / run_id / node.name,
                from_code=from_code,
            ),
            step="fetch",
        )
    )
