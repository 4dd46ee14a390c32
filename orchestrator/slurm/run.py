"""A training run as a Slurm job: prepared and submitted through the login host, followed, stopped.

What runs where (docs/slurm.md): the controller reaches only the login host (SSH, like any node).
The job's files go to ``<slurm.dir>/runs/<run-id>/`` on the shared file system; every allocated node
writes its ranks' lines there, in ``<node>/node.log``, through the rank capture an SSH launch uses,
and its exit code in ``node.log.rc``. The controller reads each node.log through the login host with
the tail protocol of `logs --follow` (runs/tail.py): every line once, in order, across reconnects.

A node's log is complete once its ``node.log.rc`` exists: node.sh writes its code, the batch script
writes ``none`` for a node whose task was ended first, and so does :func:`mark_ended` once the job
has ended (a cancelled job's batch script is killed before it can).
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from orchestrator.errors import BootstrapError, CommandFailedError, UsageError
from orchestrator.executor import Outcome
from orchestrator.inventory import Inventory, Node
from orchestrator.inventory.slurm import SlurmSettings
from orchestrator.plans import NodePlan, Put, Run, apply
from orchestrator.platforms import PosixShell
from orchestrator.render import Renderer
from orchestrator.runs.base import refused_dir
from orchestrator.runs.control import Fetched, fetch_node, follow_node
from orchestrator.runs.layout import node_log, run_dir_for
from orchestrator.runs.ranks import split_rank
from orchestrator.slurm import queue
from orchestrator.slurm.job import (
    BATCH_FILE,
    NODE_FILE,
    STOP_GRACE,
    code_dir,
    job_dir,
    login_node,
    render_job,
    slurm_settings,
)
from orchestrator.steps.launch import RANK_CAPTURE, rank_capture_file
from orchestrator.steps.script_check import local_script
from orchestrator.transports import Result, Transport
from orchestrator.transports.base import BlockHandler, Stream
from orchestrator.view import Said

if TYPE_CHECKING:
    from orchestrator.logs import RunLog
    from orchestrator.runner import Reach
    from orchestrator.session import Session

#: the job id, in the job directory (`status`, `stop`, `logs` find the job by the run id)
JOB_FILE = "job"
#: the allocated nodes, one per line in Slurm's order, written by the batch script when it starts
NODES_FILE = "nodes"
POLL = 0.5
#: once every node's log is complete, how long the job may take to reach its final state
END_WAIT = 60.0
TAIL = 20


def compute_node(slurm: SlurmSettings, name: str) -> Node:
    """An allocated node as the run layout sees it: its run directory is ``<job dir>/<name>``."""
    return Node(name=name, host=name, workdir=slurm.dir)


@dataclass(frozen=True)
class SlurmRun:
    run_id: str
    job_id: str
    job_dir: str


def _platform(transport: Transport, login: Node) -> PosixShell:
    platform = transport.platform.as_posix()
    if platform is None:
        raise UsageError("the Slurm login host must be a Linux node", node=login.name)
    return platform


def prepare_plan(inventory: Inventory, platform: PosixShell, run_id: str, renderer: Renderer) -> NodePlan:
    """On the login host, as data: a new private job directory on the shared file system (a run id
    that exists there is refused), the batch script, the node part, the rank capture, and the
    training script into the code directory (a relative one: this project's), a code directory
    another user could change refused first (exit 2, as launch on SSH nodes refuses it)."""
    slurm = slurm_settings(inventory)
    files = render_job(renderer, inventory, run_id)
    directory = job_dir(slurm, run_id)
    train = inventory.cluster.train
    code = code_dir(inventory)
    source = None if train.script.startswith("/") else local_script(train.script)
    target = f"{code}/{train.script}"
    parent = target.rsplit("/", 1)[0]
    login = login_node(inventory).name

    def check(result: Result) -> None:
        refused = refused_dir(result, login)
        if refused is not None:
            raise refused
        if not result.ok:
            raise CommandFailedError(f"cannot create {directory}: {' | '.join(result.tail(3))}", node=login)

    # the ranks run from the code directory and import what lies beside the script first: a path
    # another user could change is refused before anything is made, and again once it exists
    made = platform.no_group_write(platform.mkdir(parent))
    prepare = "\n".join(
        (platform.check_path(code), platform.new_private_dir(directory), made, platform.check_path(parent))
    )
    actions: list[Put | Run] = [
        Run(prepare, timeout=60, what="create the job directory on the shared file system", check=check),
        Put(f"{directory}/{BATCH_FILE}", data=files.batch.encode(), mode=0o700, what="batch script"),
        Put(f"{directory}/{NODE_FILE}", data=files.node.encode(), mode=0o700, what="node part"),
        Put(f"{directory}/{RANK_CAPTURE}", source=rank_capture_file(), mode=0o600, what="rank capture"),
    ]
    if source is not None:
        actions.append(Put(target, source=source, what="training script"))
    return NodePlan(login, actions)


def submit_run(transport: Transport, inventory: Inventory, run_id: str, renderer: Renderer) -> SlurmRun:
    """Prepare the job directory, ``sbatch --parsable`` the batch script, keep the job id beside it."""
    login = login_node(inventory)
    platform = _platform(transport, login)
    apply(prepare_plan(inventory, platform, run_id, renderer), transport)
    directory = job_dir(slurm_settings(inventory), run_id)
    job = queue.submit(transport, login.name, f"{directory}/{BATCH_FILE}")
    transport.run(f"echo {platform.quote(job)} > {platform.path_word(f'{directory}/{JOB_FILE}')}", timeout=30)
    return SlurmRun(run_id, job, directory)


def find_run(transport: Transport, inventory: Inventory, run_id: str) -> SlurmRun:
    """The job of a run submitted before (`status`, `stop`, `logs`), from its job directory."""
    login = login_node(inventory)
    platform = _platform(transport, login)
    directory = job_dir(slurm_settings(inventory), run_id)
    path = platform.path_word(f"{directory}/{JOB_FILE}")
    # the job id is believed only from a directory that is ours alone (check_own_dir refuses others)
    checked = transport.run(platform.check_own_dir(directory), timeout=30)
    refused = refused_dir(checked, login.name)
    if refused is not None:
        raise refused
    answer = queue.ask(transport, login.name, f"cat {path}")
    job = answer.lines[0] if answer.ok and answer.lines else ""
    if not job.isdigit():
        raise UsageError(
            f"no Slurm run {run_id} in {directory}",
            node=login.name,
            hint="`bootstrap runs` lists the runs started from this directory",
        )
    return SlurmRun(run_id, job, directory)


def allocated_nodes(
    transport: Transport, login: Node, run: SlurmRun, job: queue.JobState | None
) -> list[str]:
    """The job's nodes: from the queue while Slurm knows the job, else the list the job wrote."""
    if job is not None and job.nodelist and job.nodelist != "(null)":
        return queue.hostnames(transport, login.name, job.nodelist)
    platform = _platform(transport, login)
    answer = queue.ask(transport, login.name, f"cat {platform.path_word(f'{run.job_dir}/{NODES_FILE}')}")
    return queue.host_names(answer.lines) if answer.ok else []


def mark_ended(transport: Transport, login: Node, run: SlurmRun, nodes: list[str]) -> None:
    """After the job has ended: ``none`` as the exit code of every node that has none, so that its
    node.log is known complete (its task was killed before it could write one)."""
    platform = _platform(transport, login)
    lines = []
    for name in nodes:
        rc = platform.path_word(f"{run.job_dir}/{name}/node.log.rc")
        lines.append(
            f"[ -e {rc} ] || [ ! -d {platform.path_word(f'{run.job_dir}/{name}')} ] || echo none > {rc}"
        )
    if lines:
        transport.run("\n".join(lines), timeout=30)


class _Kept(BlockHandler):
    """Passes blocks on and keeps the node's last lines (the failure summary's tail)."""

    def __init__(self, inner: BlockHandler) -> None:
        self.inner = inner
        self.lines: deque[str] = deque(maxlen=200)

    def block(self, stream: Stream, text: str) -> None:
        self.lines.extend(text[:-1].split("\n") if text.endswith("\n") else text.split("\n"))
        self.inner.block(stream, text)


@dataclass
class NodeEnd:
    """How one allocated node's part ended."""

    node: str
    exit_code: int | None  # None: its task was ended (cancelled, the job's time limit) or unknown
    lines: list[str]
    error: BootstrapError | None = None

    def result(self) -> Result:
        """As a launcher's Result, for the launch's failure headline and tail (steps/launch.py)."""
        return Result(self.node, "node.sh", self.exit_code, "\n".join(self.lines), "", 0.0)


@dataclass
class JobEnd:
    job_id: str
    state: str  # Slurm's last state of the job (COMPLETED, FAILED, CANCELLED, TIMEOUT, ...)
    nodes: list[NodeEnd] = field(default_factory=list)
    failed_first: str | None = None  # the node whose non-zero exit ended the job
    cancelled: bool = False  # this command cancelled it (fail fast)
    nproc: int = 1  # ranks per node: node i has global ranks i * nproc ...
    time_limit: str = ""  # the job's time limit, as squeue says it, when reaching it ended the job

    @property
    def ok(self) -> bool:
        return self.state == "COMPLETED" and all(n.exit_code == 0 for n in self.nodes)

    def time_limit_reached(self) -> str:
        """What a job its time limit ended says (empty when the limit did not end it)."""
        if not self.time_limit:
            return ""
        return (
            f"job {self.job_id} reached its time limit ({self.time_limit}): Slurm stopped every rank "
            f"before it (--signal=TERM@{STOP_GRACE}); what they wrote until then is above and in the logs"
        )

    def failed(self) -> tuple[str, list[str], str] | None:
        """The node that failed first: its headline (``rank 3 exited with code 3 (torchrun exited
        1)``), its last lines as ``[node:rank] text``, and what its failure did to the other nodes
        (empty when this command did not cancel the job); None when no node failed."""
        from orchestrator.steps.launch import failure_headline, failure_tail

        index = {n.node: i for i, n in enumerate(self.nodes)}
        for node in self.nodes:
            if node.node == self.failed_first:
                result = node.result()
                tail = [labelled(node.node, index[node.node] * self.nproc, t) for t in failure_tail(result)]
                others = ", ".join(n.node for n in self.nodes if n is not node)
                stopped = f"job {self.job_id} cancelled because {node.node} failed first: {others} stopped"
                return failure_headline(result), tail, stopped if self.cancelled and others else ""
        return None


def end_said(end: JobEnd) -> list[Said]:
    """How the job ended: the node that failed first and its last lines, the time limit, Slurm's
    state, or every node's exit 0."""
    failed = end.failed()
    if failed is not None:
        said = [
            Said("error", f"{end.failed_first}: {failed[0]}"),
            *(Said("info", f"  {line}") for line in failed[1]),
        ]
        return said + ([Said("note", failed[2])] if failed[2] else [])
    if end.time_limit:
        note = "a longer cluster.slurm.time, or a training script resuming from checkpoints in $CB_RUN_DIR"
        return [Said("error", end.time_limit_reached()), Said("note", note)]
    if not end.ok:
        return [Said("error", f"job {end.job_id} ended {end.state}")]
    return [Said("info", f"job {end.job_id} {end.state}: every node exited 0")]


def labelled(node: str, first_rank: int, line: str) -> str:
    """A line of a node's log as the stream shows it: ``[node:rank] text``, ``[node] text`` for
    torchrun's own."""
    local, text = split_rank(line)
    return f"[{node}{'' if local is None else f':{first_rank + local}'}] {text}"


#: how long before the time limit Slurm may send --signal's signal: STOP_GRACE, and up to 60 s
#: earlier ("the resolution of event handling by Slurm", sbatch(1))
_SIGNAL_EARLY = 60


def reached_time_limit(job: queue.JobState | None, nodes: list[NodeEnd], *, cancelled: bool) -> bool:
    """Whether the job's time limit ended it: Slurm's TIMEOUT, or the stop --signal sends before the
    limit (the nodes stopped by a signal, none failed, nobody cancelled the job) when the job's
    runtime was that close to its limit."""
    if job is None:
        return False
    if job.state == "TIMEOUT":
        return True
    if cancelled or job.state == "CANCELLED" or any(n.exit_code not in (0, None) for n in nodes):
        return False
    limit, ran = queue.seconds(job.time_limit), queue.seconds(job.runtime)
    stopped = any(n.exit_code is None for n in nodes)
    return stopped and limit is not None and ran is not None and limit - ran <= STOP_GRACE + _SIGNAL_EARLY


def await_allocation(
    transport: Transport, inventory: Inventory, job_id: str, say: Callable[[str], None]
) -> queue.JobState | None:
    """Until the job runs (or has ended, or is gone: None), saying its state and pending reason as
    they change. A pending reason that waiting alone does not change (JobState.hopeless) cancels
    the job and raises, naming it."""
    login = login_node(inventory)
    said: tuple[str, str] | None = None
    while True:
        job = queue.state(transport, login.name, job_id)
        if job is None:
            return None  # gone already: read what the nodes wrote
        if (job.state, job.reason) != said:
            said = (job.state, job.reason)
            why = f" ({job.reason})" if job.state == "PENDING" and job.reason not in ("", "None") else ""
            say(f"job {job_id}: {job.state}{why}")
        if job.hopeless:
            queue.cancel(transport, login.name, job_id)
            raise job.cannot_start(login.name)
        if job.state not in ("PENDING", "CONFIGURING"):
            return job
        time.sleep(POLL)


def allocate(
    transport: Transport, inventory: Inventory, say: Callable[[str], None], *, what: str = "check"
) -> tuple[str, list[str]]:
    """A job (named ``cb-<what>``) holding the request's nodes for `check` or `validate` (its steps run
    the probes and ranks: relay.py); returns the job id and its nodes in Slurm's order. The caller
    cancels it."""
    login = login_node(inventory)
    slurm = slurm_settings(inventory)
    _platform(transport, login)
    argv = ["sbatch", "--parsable", f"--job-name=cb-{what}", f"--nodes={slurm.nodes}", "--ntasks-per-node=1"]
    argv += [f"--gpus-per-node={slurm.gpus}"] if slurm.gpus else []
    argv += [f"--partition={slurm.partition}"] if slurm.partition else []
    argv += [f"--account={slurm.account}"] if slurm.account else []
    argv += [f"--time={slurm.time}"] if slurm.time else []
    argv += [*slurm.sbatch, "--output=/dev/null", "--wrap=exec sleep 86400"]
    job = queue.sbatch(transport, login.name, argv[1:])
    say(f"{what}: job {job} holds the nodes while it runs there")
    try:
        state = await_allocation(transport, inventory, job, say)
        if state is None or state.ended:
            raise CommandFailedError(f"job {job} ended before the check ran", node=login.name)
        return job, queue.hostnames(transport, login.name, state.nodelist)
    except BaseException:
        queue.cancel(transport, login.name, job)
        raise


#: the handlers of the allocated nodes (in Slurm's order), each given its first global rank and its
#: ranks per node: called once, when the nodes are known
OutputsFor = Callable[[list[str], int], dict[str, BlockHandler]]


def follow_run(
    transport: Transport,
    inventory: Inventory,
    run: SlurmRun,
    *,
    outputs_for: OutputsFor,
    say: Callable[[str], None],
    fail_fast: bool = True,
    login_python: str | None = None,
    follow: bool = True,
) -> JobEnd:
    """Wait for the allocation (saying the state and reason while it changes), then stream every
    node's lines to its handler from ``outputs_for(nodes, nproc)`` until the job has ended and every log is
    read. ``fail_fast``: the first node that exits non-zero ends the job (``scancel``), as srun's
    --kill-on-bad-exit does inside it. A pending reason that cannot change by waiting
    cancels the job and raises (:func:`await_allocation`). KeyboardInterrupt: the caller
    cancels (:func:`stop_run`). ``follow`` False (`logs` without --follow): every node's lines so
    far, waiting for nothing (a job still pending has none: said, no node in the result)."""
    login = login_node(inventory)
    slurm = slurm_settings(inventory)
    if follow:
        job = await_allocation(transport, inventory, run.job_id, say)
    elif (job := queue.state(transport, login.name, run.job_id)) is not None and job.state == "PENDING":
        say(f"job {run.job_id}: PENDING ({job.reason}): no node has started, no line yet")
        return JobEnd(run.job_id, job.state, nproc=slurm.ranks_per_node)
    nodes = allocated_nodes(transport, login, run, job)
    if not nodes:
        raise CommandFailedError(
            f"job {run.job_id} ended ({job.state if job else 'gone'}) before any node started",
            node=login.name,
            hint=f"Slurm's output of the batch script: {run.job_dir}/slurm-{run.job_id}.out",
        )
    if follow:
        say(f"job {run.job_id}: running on {', '.join(nodes)}")
    # the readers may come before the node's task made its directory: the same private directory now
    platform = _platform(transport, login)
    made = "\n".join(platform.mkdir(f"{run.job_dir}/{name}", private=True) for name in nodes)
    transport.run(made, timeout=30)
    outputs = outputs_for(nodes, slurm.ranks_per_node)
    handlers = {name: _Kept(outputs[name]) for name in nodes}
    ends: dict[str, NodeEnd] = {}
    lock = threading.Lock()

    def read(name: str) -> None:
        try:
            found = follow_node(
                compute_node(slurm, name),
                transport,
                run.run_id,
                follow=follow,
                output=handlers[name],
                python=login_python,
                interval=0.05,
            )
            end = NodeEnd(name, found.exit_code, list(handlers[name].lines))
        except BootstrapError as exc:
            end = NodeEnd(name, None, list(handlers[name].lines), exc)
        with lock:
            ends[name] = end

    threads = [threading.Thread(target=read, args=(n,), name=f"slurm-follow-{n}", daemon=True) for n in nodes]
    for thread in threads:
        thread.start()
    failed_first: str | None = None
    cancelled = False
    last_state = job.state if job is not None else "COMPLETED"
    last_job = job
    next_poll = 0.0
    marked = False
    while any(t.is_alive() for t in threads):
        with lock:
            bad = [e for e in ends.values() if e.exit_code not in (0, None)]
        if bad and failed_first is None:
            failed_first = bad[0].node
            if fail_fast:
                say(f"{failed_first} failed (exit {bad[0].exit_code}); cancelling job {run.job_id}")
                queue.cancel(transport, login.name, run.job_id)
                cancelled = True
        if time.monotonic() >= next_poll and not marked:
            next_poll = time.monotonic() + 1.0
            job = queue.state(transport, login.name, run.job_id)
            if job is not None:
                last_state, last_job = job.state, job
            if job is None or job.ended:
                mark_ended(transport, login, run, nodes)  # every follower ends at its log's end
                marked = True
        for thread in threads:
            thread.join(0.1)
    if not marked:
        # every node's log is complete: the batch script is finishing (RUNNING, then COMPLETING);
        # its final state comes within moments (a loaded machine: seconds)
        deadline = time.monotonic() + (END_WAIT if follow else 0.0)
        job = queue.state(transport, login.name, run.job_id)
        while job is not None and not job.ended and time.monotonic() < deadline:
            time.sleep(POLL)
            job = queue.state(transport, login.name, run.job_id)
        if job is not None:
            last_state, last_job = job.state, job
    if failed_first is None:
        bad = [ends[n] for n in nodes if ends[n].exit_code not in (0, None)]
        failed_first = bad[0].node if bad else None
    node_ends = [ends[n] for n in nodes]
    timed_out = reached_time_limit(last_job, node_ends, cancelled=cancelled)
    return JobEnd(
        run.job_id,
        last_state,
        node_ends,
        failed_first,
        cancelled,
        slurm.ranks_per_node,
        time_limit=(last_job.time_limit if last_job is not None else "") if timed_out else "",
    )


def stop_run(transport: Transport, inventory: Inventory, run: SlurmRun, *, wait: float = 30.0) -> str:
    """``scancel`` the job, await its end (Slurm signals every process of it on every node), then
    mark every node's log complete. Returns the job's last state."""
    login = login_node(inventory)
    queue.cancel(transport, login.name, run.job_id)
    deadline = time.monotonic() + wait
    job = queue.state(transport, login.name, run.job_id)
    while job is not None and not job.ended and time.monotonic() < deadline:
        time.sleep(POLL)
        job = queue.state(transport, login.name, run.job_id)
    nodes = allocated_nodes(transport, login, run, job)
    if job is None or job.ended:
        mark_ended(transport, login, run, nodes)
    return job.state if job is not None else "gone"


def log_lines(text: str) -> list[str]:
    """A node log's lines: they end at "\n" only, so a "\r" a rank printed (a progress bar) stays
    inside its line, where it cannot start a line tagged as another rank's."""
    return [line for line in text.split("\n") if line]


#: how many of a node's last log lines `status` reads to find each of its ranks' last line
_STATUS_TAIL = 200


@dataclass
class RunStatus:
    run_id: str
    job_id: str
    state: str
    reason: str
    nodes: list[str]
    runtime: str
    #: each node's last lines (the tail of its log), oldest first
    last_lines: dict[str, list[str]]

    def labelled_last_lines(self, nproc: int) -> list[str]:
        """Every rank's last line as ``[node:rank] text`` (``nproc`` ranks per node), as streamed, in
        rank order; a node none of whose ranks' lines is in its tail shows its log's last line."""
        shown: list[str] = []
        for i, (node, lines) in enumerate(self.last_lines.items()):
            last: dict[int | None, str] = {}
            for line in lines:
                last[split_rank(line)[0]] = line
            ranks = sorted(r for r in last if r is not None)
            chosen = [last[r] for r in ranks] or lines[-1:]
            shown += [labelled(node, i * nproc, line) for line in chosen]
        return shown


def status_run(transport: Transport, inventory: Inventory, run: SlurmRun) -> RunStatus:
    """The job's state, nodes and runtime as Slurm says, and every node's last log line."""
    login = login_node(inventory)
    platform = _platform(transport, login)
    job = queue.state(transport, login.name, run.job_id)
    nodes = allocated_nodes(transport, login, run, job)
    last: dict[str, list[str]] = {}
    for name in nodes:
        log = node_log(run_dir_for(compute_node(slurm_settings(inventory), name), run.run_id))
        answer = queue.ask(transport, login.name, f"tail -n {_STATUS_TAIL} {platform.path_word(log)}")
        last[name] = log_lines(answer.text) if answer.ok else []
    if job is None:
        return RunStatus(run.run_id, run.job_id, "ENDED", "", nodes, "", last)
    return RunStatus(run.run_id, run.job_id, job.state, job.reason, nodes, job.runtime, last)


def fetch_run(
    transport: Transport,
    inventory: Inventory,
    run_id: str,
    paths: Sequence[str],
    *,
    dest_root: Path,
    from_code: bool = False,
    copy: bool = True,
) -> list[Outcome[list[Fetched]]]:
    """`fetch` of a Slurm run: each allocated node's outputs (``$CB_RUN_DIR``: ``<job dir>/<node>/out``),
    run directory or the code directory, read from the shared file system through the login host
    into ``dest_root/<node>/``; one outcome per node, in Slurm's order. ``copy`` False (--dry-run):
    only listed, what would be copied and where."""
    login = login_node(inventory)
    slurm = slurm_settings(inventory)
    run = find_run(transport, inventory, run_id)
    nodes = allocated_nodes(transport, login, run, None)  # the list the job wrote when it started
    if not nodes:
        raise UsageError(
            f"run {run_id} (Slurm job {run.job_id}) has not started on any node: nothing to fetch",
            node=login.name,
            hint=f"`bootstrap status --run {run_id}` shows the job's state",
        )
    code = code_dir(inventory)
    outcomes: list[Outcome[list[Fetched]]] = []
    for name in nodes:
        began = time.monotonic()
        try:
            got = fetch_node(
                compute_node(slurm, name),
                transport,
                run_id,
                paths,
                code_dir=code,
                dest=dest_root / name,
                from_code=from_code,
                copy=copy,
            )
            outcomes.append(Outcome(name, got, None, time.monotonic() - began, time.monotonic()))
        except BootstrapError as exc:
            outcomes.append(Outcome(name, None, exc, time.monotonic() - began, time.monotonic()))
    return outcomes


@dataclass
class SlurmLogin:
    """The login host of an inventory with cluster.slurm, on an open session: all that `launch`,
    `logs`, `status` and `stop` ask of Slurm. The CLI holds this, never the login host's transport."""

    session: Session
    inventory: Inventory

    @property
    def _transport(self) -> Transport:
        return self.session.transport(login_node(self.inventory))

    def submit(self, run_id: str, renderer: Renderer) -> SlurmRun:
        return submit_run(self._transport, self.inventory, run_id, renderer)

    def find(self, run_id: str) -> SlurmRun:
        return find_run(self._transport, self.inventory, run_id)

    def follow(self, run: SlurmRun, *, outputs_for: OutputsFor, say: Callable[[str], None]) -> JobEnd:
        """The launch's own stream: the first node that fails ends the job."""
        return follow_run(self._transport, self.inventory, run, outputs_for=outputs_for, say=say)

    def logs(
        self, run: SlurmRun, *, outputs_for: OutputsFor, say: Callable[[str], None], follow: bool
    ) -> JobEnd:
        """`logs` (``follow``: until the end): only reads, never cancels the job."""
        return follow_run(
            self._transport,
            self.inventory,
            run,
            outputs_for=outputs_for,
            say=say,
            fail_fast=False,
            follow=follow,
        )

    def stop(self, run: SlurmRun) -> str:
        return stop_run(self._transport, self.inventory, run)

    def status(self, run: SlurmRun) -> RunStatus:
        return status_run(self._transport, self.inventory, run)


def _outputs_for(reach: Reach, log: RunLog) -> OutputsFor:
    """The allocated nodes' handlers, once Slurm has named them: the controller's log, and
    ``reach.outputs`` showing them as `[node:rank]`."""

    def outputs_for(nodes: list[str], nproc: int) -> dict[str, BlockHandler]:
        labels = {name: (i * nproc, nproc) for i, name in enumerate(nodes)}
        return dict(reach.outputs(labels, log, None, "")) if reach.outputs else {}

    return outputs_for


@dataclass
class SlurmLaunch:
    """What `launch` on Slurm did: the job submitted (``detach``: only that), then its end; or the
    Ctrl-C or SIGTERM that cut the follow short, with what cancelling the job gave (None: a second
    interrupt cut that short: the job may still run)."""

    run: SlurmRun
    end: JobEnd | None = None
    log_dir: Path | None = None
    interrupted: BaseException | None = None
    cancelled: str | None = None


def launch_job(
    reach: Reach, inventory: Inventory, *, run_id: str | None, templates_dir: Path | None, detach: bool
) -> SlurmLaunch:
    """`launch` on an inventory with cluster.slurm: a new run id and record, the job submitted through
    the login host, then (unless ``detach``) followed to its end, every line kept in runs/<run-id>/."""
    from orchestrator.logs import RunLog
    from orchestrator.render import require_secrets, templates_dir_for
    from orchestrator.runs.ids import new_run_id
    from orchestrator.runs.layout import train_record, write_record

    slurm = slurm_settings(inventory)
    login = login_node(inventory)
    renderer = Renderer(templates_dir_for(inventory, templates_dir))
    require_secrets(inventory)
    run_id = new_run_id(inventory.cluster.name, chosen=run_id)
    directory = Path("runs") / run_id
    write_record(directory, run_id, [], detached=detach, train=train_record(inventory))
    with reach.connect([login]) as session:
        slurm_login = SlurmLogin(session, inventory)
        launched = SlurmLaunch(slurm_login.submit(run_id, renderer))
        ranks = f"{slurm.nodes} node(s) x {slurm.ranks_per_node} rank(s)"
        reach.say(
            "info", f"run {run_id}: Slurm job {launched.run.job_id} submitted through {login.name} ({ranks})"
        )
        if detach:
            return launched
        log = RunLog(directory)
        launched.log_dir = log.directory
        say = lambda text: reach.say("note", text)  # noqa: E731
        try:
            launched.end = slurm_login.follow(launched.run, outputs_for=_outputs_for(reach, log), say=say)
        except KeyboardInterrupt as stop:
            log.close()
            launched.interrupted = stop
            try:
                launched.cancelled = slurm_login.stop(launched.run)
            except KeyboardInterrupt:
                pass
        finally:
            log.close()
    return launched


def job_logs(reach: Reach, inventory: Inventory, run_id: str, *, follow: bool) -> JobEnd:
    """`logs --run ID [--follow]` of a Slurm run: every node's log from its start, shown through
    ``reach.outputs`` and kept (staged, then committed per node) in runs/<run-id>/ here."""
    from orchestrator.logs import RunLog

    log = RunLog(Path("runs") / run_id, staged=True)
    with reach.connect([login_node(inventory)]) as session:
        login = SlurmLogin(session, inventory)
        run = login.find(run_id)
        try:
            end = login.logs(
                run,
                outputs_for=_outputs_for(reach, log),
                say=lambda text: reach.say("note", text),
                follow=follow,
            )
            for node in end.nodes:
                log.commit(node.node)
        finally:
            log.close()  # staged parts not committed (a Ctrl-C) are dropped
    return end
