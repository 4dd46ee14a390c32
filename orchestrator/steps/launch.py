"""Plan and start training on every node: render, upload, run, stream `[node:rank]` lines back.

Every node gets its rendered script in ``<workdir>/runs/<run-id>/<node>/launch.sh`` and keeps its
output in ``node.log`` beside it; the controller keeps its own copy (``runs/<run-id>/<node>.log``).
A node that fails stops the others (fail fast: the session closes their connections, which stops
each remote process group; see PosixShell.stop_on_hangup).

Native Windows nodes get ``launch.ps1``, started outside the WinRS shell's job exactly as `launch
--detach` starts it, with a watchdog; the controller follows node.log in rounds of the tail protocol
and the watchdog stops the run when the controller's follower is killed or goes silent
(runs/windows.py). Foreground and detached runs differ only in who waits.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import posixpath
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from orchestrator import records
from orchestrator.errors import (
    BootstrapError,
    CancelledError,
    CommandFailedError,
    RunStoppedError,
    UsageError,
)
from orchestrator.inventory.model import WINDOWS_ABSOLUTE
from orchestrator.neutralise import one_line
from orchestrator.plans import NodePlan, Put, Run, apply
from orchestrator.platforms import Platform, PosixShell, PowerShell
from orchestrator.render import LaunchSpec, Renderer, plan_launch, render_all
from orchestrator.resources import package_file
from orchestrator.runs.base import refused_dir
from orchestrator.runs.culprit import (
    Failure,
    culprit,
    is_victim,
    stopped_pids,
    tagged_lines,
    torchrun_failures,
)
from orchestrator.runs.ids import is_run_id
from orchestrator.runs.layout import (
    CODE_MARKER,
    RUN_MARKER_ENV,
    RUN_OUTPUTS,
    STOPPED,
    in_workdir,
    launcher_env,
    run_dir_for,
    run_marker,
)
from orchestrator.runs.posix import PosixRuns
from orchestrator.runs.start import FIRST_ROUND_TIMEOUT, DetachedStart, Followed, follow_windows, start_all
from orchestrator.runs.windows import WindowsRuns
from orchestrator.runs.windows_follow import ROUND_SECONDS
from orchestrator.steps.addresses import reached_nodes
from orchestrator.steps.node_facts import training_python
from orchestrator.steps.preflight import check_interfaces, gather_node_facts
from orchestrator.steps.preflight.checks import choose_backend
from orchestrator.steps.script_check import local_script

if TYPE_CHECKING:
    from orchestrator.executor import Outcome
    from orchestrator.inventory import Inventory, Node
    from orchestrator.session import Session
    from orchestrator.steps.contract import Report
    from orchestrator.steps.dry_run import Planned
    from orchestrator.steps.node_facts import InspectedNode
    from orchestrator.steps.preflight.checks import PreflightFacts
    from orchestrator.transports import Result, SSHOptions, Transport
    from orchestrator.transports.base import OnLine, Stream

#: our rank workers (validate's, bench's) on Linux/WSL: one process per rank started by this template;
#: native Windows' launch template already starts one process per rank
RANKS_TEMPLATE = "ranks.sh.j2"

TAIL = 20


@dataclass
class LaunchPlan:
    specs: list[LaunchSpec]
    backend: str
    backend_reason: str
    inspected: list[Outcome[InspectedNode]]
    warnings: list[str]


def plan(session: Session, inventory: Inventory, run_id: str, *, starting: bool = False) -> LaunchPlan:
    """Facts from every node (route to the master, CPUs), then one LaunchSpec per node. ``starting``:
    for a run about to start (not `render`): refused on nodes without their declared environment."""
    master = inventory.master_node
    inspected, facts = gather_node_facts(session, inventory)
    if starting and (missing := _no_environment(inventory, facts)):
        raise missing
    single = len(inventory.nodes) == 1
    verdicts = check_interfaces(facts, master.name, single=single, reached=reached_nodes(session, [master]))
    warnings = [f"node {n!r}: {v.reason} ({v.fix})" for n, v in verdicts.items() if v.level == "fail"]
    interfaces = {n: (v.data.get("gloo_socket_ifname"), v.data.get("source")) for n, v in verdicts.items()}
    master_verdict = verdicts.get(master.name)
    cpus = {
        o.node: o.value.facts.get("cpus")
        for o in inspected
        if o.value is not None and isinstance(o.value.facts.get("cpus"), int)
    }
    backend, why, _ = choose_backend(inventory.cluster, facts)
    return _decide(
        inventory,
        run_id,
        backend=(backend, why),
        master_addr=master_verdict.data.get("master_address") if master_verdict else None,
        interfaces=interfaces,
        cpus=cpus,
        inspected=inspected,
        warnings=warnings,
    )


def _no_environment(inventory: Inventory, facts: Sequence[PreflightFacts]) -> CommandFailedError | None:
    """The refusal of a launch on nodes whose declared environment (``cluster.env``) is not there yet,
    or has no torch: every rank would fail on it ("venv/bin/python: not found", exit 127)."""
    if not inventory.cluster.env.declared:
        return None
    lacking = [
        f.node.name
        for f in facts
        # the interpreter answered nothing, with no read failing (not there: "venv/bin/python: not
        # found"), or answered without torch
        if (f.python is None and f.torch is None and not (f.python_error or f.torch_error))
        or (f.torch is not None and not f.torch.installed)
    ]
    if not lacking:
        return None
    paths = sorted({training_python(n, inventory) for n in inventory.nodes if n.name in lacking})
    return CommandFailedError(
        f"{', '.join(lacking)}: no environment with torch at {', '.join(paths)} (cluster.env is declared, "
        "not synced there yet): every rank would fail on it; nothing was started",
        hint="`bootstrap sync --only env` builds it; plain `bootstrap` syncs, then trains",
    )


def offline_plan(
    inventory: Inventory, run_id: str, *, say: Callable[[str], None] | None = None
) -> LaunchPlan:
    """The launch plan from the inventory alone (``render --offline``, every ``--dry-run``): the same
    decisions as :func:`plan` with no facts: interfaces as the inventory names them, the master at
    its inventory address, ``backend: auto`` taken as gloo (``backend_reason`` says so, told to
    ``say``)."""
    backend: str = inventory.cluster.backend
    why = f"{backend}, as the inventory says"
    if backend == "auto":
        backend, why = "gloo", "offline: backend auto rendered as gloo (check decides with the nodes' facts)"
        if say is not None:
            say(why)
    return _decide(inventory, run_id, backend=(backend, why), master_addr=None, interfaces={}, cpus={})


def _decide(
    inventory: Inventory,
    run_id: str,
    *,
    backend: tuple[str, str],
    master_addr: str | None,
    interfaces: dict[str, tuple[str | None, str | None]],
    cpus: dict[str, int],
    inspected: list[Outcome[InspectedNode]] | None = None,
    warnings: list[str] | None = None,
) -> LaunchPlan:
    """Every node's LaunchSpec from what is known (facts online, none offline): one decision of the
    master address, the interpreters and native Windows' interfaces for both."""
    master = inventory.master_node
    single = len(inventory.nodes) == 1
    inspected, warnings = inspected or [], warnings or []
    pythons = {n.name: training_python(n, inventory) for n in inventory.nodes}
    for node in inventory.nodes:
        if node.os == "windows" and node.windows.mode == "native":
            own_python = node.python is None and not inventory.cluster.env.declared
            _native_windows_plan(
                node, inspected, interfaces, pythons if own_python else {}, warnings, single=single
            )
    specs = plan_launch(
        inventory,
        backend=backend[0],
        master_addr="127.0.0.1" if single else master_addr or master.host,
        run_id=run_id,
        interfaces=interfaces,
        cpus=cpus,
        pythons=pythons,
    )
    warnings.extend(ignored_env_warnings(inventory))
    return LaunchPlan(specs, backend[0], backend[1], inspected, warnings)


def with_code_record(inventory: Inventory, specs: list[LaunchSpec]) -> list[LaunchSpec]:
    """``specs`` with what a code sync of the project would record on each node (``cluster.code``),
    which the launch compares with the node's own record before it starts anything (its dry run
    shows that read too), and the project's training script to upload."""
    if not inventory.cluster.code_declared:
        return specs
    from orchestrator.steps.codesync import code_source
    from orchestrator.steps.codesync.manifest import shipped_record
    from orchestrator.steps.codesync.sync import prepare_tree
    from orchestrator.steps.script_check import not_the_project, script_file

    if not_the_project(inventory, code_source(inventory.cluster)) is not None:
        return specs  # run from another directory: nothing here to compare (nor to list: /tmp)
    # the script launch uploads is the project's, as the syntax check read it (code.source may not
    # be the current directory: the copy here, or none, would leave the nodes the last sync's)
    found = script_file(inventory)
    specs = [dataclasses.replace(spec, script_source=str(found) if found else "") for spec in specs]
    try:
        record = shipped_record(prepare_tree(inventory).files)
    except (BootstrapError, OSError):
        return specs  # no project here to compare with: sync says why
    return [dataclasses.replace(spec, code_record=record) for spec in specs]


#: variables tutorials tell users to set that nothing in torch or gloo reads (FIELD_NOTES)
IGNORED_ENV = {
    "GLOO_TIMEOUT_SECONDS": "collective timeouts are init_process_group(timeout=...)",
    "TORCH_DISTRIBUTED_BACKEND": "the backend is init_process_group(backend=...): "
    "read CLUSTER_BOOTSTRAP_BACKEND there, as the example does",
}


def missing_script_warning(inventory: Inventory) -> str | None:
    """A relative ``train.script`` that is not in the current directory is not uploaded (prepare_plan):
    said before a launch, since every node would fail on it or run an old copy; with ``cluster.code``,
    when the project it syncs (``code.source``, relative to the current directory) lacks the script:
    bootstrap runs from another directory. None: the script is absolute (on the nodes already)."""
    script = inventory.cluster.train.script
    if script.startswith("/") or WINDOWS_ABSOLUTE.match(script):
        return None
    if inventory.cluster.code_declared:  # the project sync ships: is it here?
        from orchestrator.steps.codesync import code_source
        from orchestrator.steps.script_check import not_the_project

        source = code_source(inventory.cluster)
        if not_the_project(inventory, source) is None:
            return None
        return (
            f"train.script {script!r} is not in {source}, the project cluster.code syncs from here: "
            "this is not your project's directory, so every node runs the code the last sync shipped "
            "(and this run's logs are kept under ./runs here); run bootstrap from your project's directory"
        )
    if local_script(script) is not None:
        return None
    dirs = {inventory.cluster.train.code_dir or in_workdir(n, "code") for n in inventory.nodes}
    where = f"{dirs.pop()}/{script}" if len(dirs) == 1 else f"<workdir>/code/{script}"
    return (
        f"train.script {script!r} is not in {Path.cwd()}: it is not uploaded, so every node runs what "
        f"is there already ({where}; an earlier launch's copy included); run bootstrap from your "
        "project's directory, or add cluster.code to the inventory to sync the project"
    )


#: what the training script of a project is usually called: one of them here while the shipped
#: example trains is a mistake more often than not
USUAL_SCRIPTS = ("train.py", "main.py", "train_ddp.py")


def example_notice(inventory: Inventory) -> tuple[str, str] | None:
    """(level, text) when the run trains the shipped example (no ``train.script``: an Ansible
    inventory has no train section): said always, as a warning when a usual training script is in the
    directory bootstrap runs from (the user's own, which is not what runs)."""
    from orchestrator.inventory.model import TrainSettings

    example = TrainSettings().script
    if inventory.cluster.train.script != example:
        return None
    said = f"script: {example}, the example shipped with bootstrap: the inventory names no train.script"
    mine = [name for name in USUAL_SCRIPTS if Path(name).is_file()]
    if not mine:
        return "info", said
    return "warn", (
        f"{said}, so {mine[0]} here is not what runs; name it in cluster.train.script, or for this run "
        f"`--script {mine[0]}` (an Ansible inventory has no train section: --script is the way)"
    )


def ignored_env_warnings(inventory: Inventory) -> list[str]:
    """One warning per train.env variable that is passed on but read by nothing."""
    return [
        f"train.env {name}: nothing in torch or gloo reads it ({IGNORED_ENV[name]})"
        for name, _value in inventory.cluster.train.env
        if name in IGNORED_ENV
    ]


def _native_windows_plan(
    node: Node,
    inspected: list[Outcome[InspectedNode]],
    interfaces: dict[str, tuple[str | None, str | None]],
    pythons: dict[str, str],
    warnings: list[str],
    *,
    single: bool = False,
) -> None:
    """A native Windows node: GLOO_SOCKET_IFNAME is the adapter that routes to the master
    (``Find-NetRoute``, see facts/windows.py) or the inventory's ``interface:`` (the adapter's
    friendly name, which gloo matches exactly on Windows); without ``python:`` (``pythons`` then
    holds the node), the interpreter is the Windows Python the facts found (``python3``, the POSIX
    default, is usually the Store stub there)."""
    if not (interfaces.get(node.name) or (None, None))[0]:
        interfaces[node.name] = (node.interface, None)
        if not node.interface and not single:  # one machine: its ranks meet on loopback
            warnings.append(
                f"node {node.name!r}: native Windows: no GLOO_SOCKET_IFNAME (gloo may bind the wrong "
                "adapter; set interface: to the adapter's name as Get-NetAdapter shows it, e.g. Ethernet)"
            )
    if node.name in pythons:
        found = next((o.value for o in inspected if o.node == node.name and o.value is not None), None)
        python = found.facts.get("python") if found is not None else None
        path = getattr(python, "path", None)
        pythons[node.name] = path if isinstance(path, str) and path else "python"


@dataclass
class NodeRunResult:
    exit_code: int
    duration: float
    tail: list[str]
    node_log: str
    #: what the launch said before it started: the node's code directory is not the project's
    stale_code: str = ""


#: how the launch's notice of a node whose code directory is not the project's begins
STALE_CODE = "this node's code directory is not the project as it is on the controller"


#: the record (orchestrator/records.py) the preparing script prints when the run directory already
#: holds a run's log
RAN_BEFORE = "ran-before"
#: ... and when the master's rendezvous port is taken already (a run still holding it, another program)
PORT_BUSY = "port-busy"


def prepare_script(
    platform: PosixShell | PowerShell,
    run_dir: str,
    code_dir: str,
    *,
    code_root: str | None = None,
    nonce: str | None = None,
    refuse: str = "",
) -> str:
    """What prepares a node for a run, on every platform: refuse a run id that ran there before,
    create the run directory, and the directory the training script goes to.

    ``refuse``: a further refusal, checked after the run id and before anything is created.

    ``code_root``: the code directory a training script is uploaded into; when launch creates it,
    it is marked as bootstrap's (``CODE_MARKER``). The run's outputs directory (``$CB_RUN_DIR``) is
    made with the run directory.

    The run directory is always new and private (created owner-only: ``mkdir -m 700`` on POSIX, an
    access list of one entry for the connecting user on Windows): the launch script written into it
    may hold ``train.env`` secrets, and its pid file tells `stop` what to signal. One that exists, or
    a path another user could change, is refused (``new_private_dir``: exit UNSAFE_DIR_EXIT, one
    line), and so is a code directory another user could change (POSIX: ``check_path``). One
    function for both launch paths, so no path can forget it.
    ``nonce``: the one of the record it prints (a fresh one when the answer is not read).
    """
    said = records.record(nonce or records.new_nonce(), RAN_BEFORE).rstrip("\n")
    code_check = platform.check_path(code_dir)
    # created without group or other write: a code directory others can write to is refused below
    made = (
        *([platform.mkdir_marked(code_root, CODE_MARKER)] if code_root is not None else []),
        platform.mkdir(code_dir),
    )
    make_code = platform.no_group_write("\n".join(made))
    return "\n".join(
        (
            platform.check_own_dir(run_dir),
            # the script runs from the code directory, and imports what lies beside it first: checked
            # before anything is made, and again once it exists (one raced in meanwhile)
            code_check,
            platform.say_if_exists(f"{run_dir}/node.log", said),
            *([refuse] if refuse else []),
            platform.new_private_dir(run_dir),
            platform.mkdir(f"{run_dir}/{RUN_OUTPUTS}"),  # $CB_RUN_DIR: the run's own outputs
            make_code,
            code_check,
        )
    )


#: the record of the code directory's files a code sync wrote there (its answer: ``code-record``, the
#: file's text; ``code-none``: no such file)
CODE_RECORD, NO_CODE_RECORD = "code-record", "code-none"


def read_code_record(posix: PosixShell, code_dir: str) -> str:
    """Shell text (after ``record_functions``) answering the code directory's shipped-files record."""
    from orchestrator.steps.codesync.ignore import SHIPPED_RECORD

    return posix.say_file(f"{code_dir.rstrip('/')}/{SHIPPED_RECORD}", CODE_RECORD, NO_CODE_RECORD)


def stale_code(stdout: str, nonce: str, expected: Mapping[str, str], uploaded: str | None) -> str | None:
    """What to tell when the node's code directory does not hold the project as it is here (its
    record of the last code sync there, read by :func:`read_code_record`, against ``expected``): a
    sync that failed on this node (or never ran) leaves it training other code than the others, with
    nothing said. ``uploaded``: the training script launch uploads itself (not counted)."""
    if records.find(stdout, nonce, NO_CODE_RECORD) is not None:
        return (
            "no code sync has put the project in this node's code directory: only the training script "
            "is uploaded (`bootstrap sync --only code` puts the rest there)"
        )
    found = records.find(stdout, nonce, CODE_RECORD)
    if found is None:
        return None
    try:
        files = json.loads(found.text(0)).get("files")
    except (ValueError, AttributeError):
        files = None
    if not isinstance(files, dict):
        return None  # a record of another version: code sync reads (and rewrites) it
    differ = sorted(
        rel for rel in set(expected) | {str(k) for k in files} if expected.get(rel) != files.get(rel)
    )
    differ = [rel for rel in differ if rel != uploaded]
    if not differ:
        return None
    # the names come from the node's record (any run's code can rewrite it): one line of ours each
    shown = ", ".join(map(one_line, differ[:3])) + (f" and {len(differ) - 3} more" if len(differ) > 3 else "")
    return (
        f"{STALE_CODE}: {len(differ)} "
        f"file(s) differ ({shown}); the last code sync did not finish on this node, kept a file of"
        " the node's own there, or the project changed since. The run uses what the node has:"
        " `bootstrap sync --only code` brings it up to date, or says which file it keeps and why"
    )


#: in a run directory on the master: the rendezvous port that run's torchrun takes (``port_busy``)
PORT_FILE = "port"


def port_busy(posix: PosixShell, port: int, nonce: str, node: Node | None = None) -> str:
    """Lines that print the PORT_BUSY record (and end the script) when ``port`` is in use, with the
    run of bootstrap whose process (one of ours: another user's may carry one of our run ids, to have
    us stop our own run for their port) holds it: its run marker's id; empty: not one, not known.
    With ``node``, also when a run of this workdir on it is still starting with that port: its
    launcher alive (the pid file's process, with its start time), no exit code yet, and its
    ``PORT_FILE`` naming ``port`` (torchrun binds the port only once torch is imported: a launch a
    second after `launch --detach` was not refused, and failed on EADDRINUSE while its other nodes
    dialled the first run's store). The script has ``_cb_rec`` (PosixRuns.other_runs comes first)."""
    listening = posix.say_if_listening(port, PORT_BUSY, holder_env=RUN_MARKER_ENV)
    if node is None:
        return listening
    runs = posix.path_word(in_workdir(node, "runs"))
    return listening + (
        # the launcher alive: not a zombie, and started when its pid file says (not a reused pid)
        '\n_cb_up() { [ "$1" != Z ] && [ "${20}" = "$_cb_start" ]; }'
        f"\nfor _cb_pf in {runs}/*/{posix.quote(node.name)}/{PORT_FILE}; do\n"
        '  [ -f "$_cb_pf" ] && [ ! -L "$_cb_pf" ] || continue\n'
        '  _cb_d=${_cb_pf%/*}; [ -e "$_cb_d/node.log.rc" ] && continue\n'
        f'  {{ IFS= read -r _cb_p < "$_cb_pf"; }} 2>/dev/null && [ "$_cb_p" = {int(port)} ] || continue\n'
        # a plain file only: a FIFO put there (a run's code can) would block the read, and the launch
        '  [ -f "$_cb_d/pid" ] && [ ! -L "$_cb_d/pid" ] || continue\n'
        '  { read -r _cb_pid _cb_sid _cb_start < "$_cb_d/pid"; } 2>/dev/null || continue\n'
        '  case $_cb_pid in ""|*[!0-9]*) continue ;; esac\n'
        '  [ -O "/proc/$_cb_pid" ] || continue\n'
        '  { IFS= read -r _cb_l < "/proc/$_cb_pid/stat"; } 2>/dev/null && _cb_up ${_cb_l##*) } || continue\n'
        f'  _cb_r=${{_cb_d%/*}}; _cb_rec {PORT_BUSY} "${{_cb_r##*/}}"; exit 0\n'
        "done"
    )


def _check_prepared(prepare: Result, node: Node, spec: LaunchSpec, run_dir: str, nonce: str) -> None:
    """A run id names one run: a second launch under it would append to the first's log and take
    its exit code file for its own. Refused before anything is uploaded."""
    refused = refused_dir(prepare, node.name)
    if refused is not None:
        raise refused
    if (busy := records.find(prepare.stdout, nonce, PORT_BUSY)) is not None:
        holder = busy.text(0) if busy.fields else ""  # the node's word: only a run id is repeated
        if holder and is_run_id(holder) and holder != "latest":
            held = f"run {holder} of bootstrap holds it"
            hint = f"`bootstrap stop --run {holder}` ends it; or set cluster.port to a free port"
        else:
            held = (
                "torchrun's rendezvous needs it free"
                if node.python_os != "windows"
                else "rank 0 needs it free"
            )
            hint = (
                "`bootstrap check` names what holds it (a run of bootstrap: its id, and the `stop --run` "
                "that ends it); or set cluster.port in the inventory to a free port"
            )
        raise CommandFailedError(
            f"port {spec.master_port} is in use on this node, the master: {held} (nothing was started)",
            node=node.name,
            hint=hint,
        )
    if records.find(prepare.stdout, nonce, RAN_BEFORE) is not None:
        raise UsageError(
            f"run {spec.run_id} already ran on this node ({run_dir}/node.log exists)",
            node=node.name,
            hint="choose another --run-id, or leave it out for a new one; "
            f"`logs --run {spec.run_id}` (same inventory) shows the earlier run",
        )
    if not prepare.ok:  # the node's own words (mkdir's), not the records beside them
        said = [t for t in records.plain(prepare.stdout, nonce).split("\n") + prepare.stderr.split("\n") if t]
        raise CommandFailedError(f"cannot create {run_dir}: {' | '.join(said[-3:])}", node=node.name)


#: the node-side per-rank capture (complete lines only), uploaded beside every POSIX launch script
RANK_CAPTURE = "rank_capture.py"


def rank_capture_file() -> Path:
    return package_file(f"steps/probes/{RANK_CAPTURE}")


def other_runs_in(stdout: str, nonce: str) -> dict[str, int]:
    """The runs of bootstrap the preparing script found still running on the node (``other_runs``'
    records): run id -> processes (one entry per run: a machine seen as several nodes counts once)."""
    counts: dict[str, int] = {}
    for said in records.decode(stdout, nonce):
        if said.kind == "leftover":
            count, marker = said.text(0), said.text(1)
            other = marker.rsplit("/", 1)[0]
            if count.isdigit() and is_run_id(other):  # any process can carry any value: only a run id
                counts[other] = counts.get(other, 0) + int(count)
    return counts


def _leftover_notice(notice: Callable[[str], None] | None, nonce: str) -> Callable[[str], None]:
    def parse(stdout: str) -> None:
        for run, processes in other_runs_in(stdout, nonce).items() if notice is not None else ():
            assert notice is not None
            notice(
                f"bootstrap: {processes} process(es) of run {run} still running on this node "
                f"(`bootstrap stop --run {run}` ends them if they should not)"
            )

    return parse


def prepare_plan(
    node: Node,
    platform: Platform,
    spec: LaunchSpec,
    *,
    renderer: Renderer,
    template: str | None = None,
    script_file: Path | None = None,
    notice: Callable[[str], None] | None = None,
    secrets: Literal["mask"] | None = None,
    nonce: str | None = None,
) -> NodePlan:
    """Everything before the launcher starts, as data: refuse a run id that ran on the node before and
    create the (private) run directory, then upload the launch script, the rank capture (POSIX, the
    shipped launch template) and the training script.

    A relative training script is this project's: uploaded into the code directory (full code sync
    comes with `bootstrap sync`). An absolute one is taken to be on the node already.
    ``secrets="mask"``: the launch script as --dry-run shows it (the plan is then for showing only).
    """
    run_dir = run_dir_for(node, spec.run_id)
    powershell, posix = platform.as_powershell(), platform.as_posix()
    native = powershell is not None
    if powershell is None and posix is None:
        raise UsageError(f"launching on {platform.name} nodes is not supported yet", node=node.name)
    absolute = bool(WINDOWS_ABSOLUTE.match(spec.script)) if native else spec.script.startswith("/")
    source = script_file  # bench --callable's worker; else the project's script (cluster.code), or here
    if source is None and not absolute:
        source = Path(spec.script_source) if spec.script_source else local_script(spec.script)
    target_script = spec.script if absolute else f"{spec.code_dir.rstrip('/')}/{spec.script}"
    code_root = None if source is None else spec.code_dir  # a script uploaded: into the code directory
    rendered = renderer.render(spec, platform, template=template, secrets=secrets)
    nonce = records.new_nonce()
    notice_of = _leftover_notice(notice, nonce)

    def check(prepare: Result) -> None:
        _check_prepared(prepare, node, spec, run_dir, nonce)
        notice_of(prepare.stdout)
        if notice is not None and spec.code_record is not None:
            uploaded = None if source is None else posixpath.normpath(spec.script)
            if said := stale_code(prepare.stdout, nonce, spec.code_record, uploaded):
                notice(f"bootstrap: {said}")

    if powershell is not None:
        parent = posixpath.dirname(target_script.replace("\\", "/")) or "."
        # on the master: its rendezvous port must be free, as on Linux (no holder named: another
        # process's environment is not read on Windows)
        busy = records.record(nonce, PORT_BUSY, "").rstrip("\n")
        refuse = powershell.say_if_listening(spec.master_port, busy) if spec.node_rank == 0 else ""
        prepare = prepare_script(powershell, run_dir, parent, code_root=code_root, nonce=nonce, refuse=refuse)
        launch = Put(f"{run_dir}/launch.ps1", data=powershell.script_file(rendered), what="launch script")
    else:
        assert posix is not None
        code_dir = spec.code_dir + ("" if absolute else "/" + str(Path(spec.script).parent))
        prepare = (
            PosixRuns(posix).other_runs(run_marker(spec.run_id, node.name), nonce, in_workdir(node, "runs"))
            + "\n"
            + (read_code_record(posix, spec.code_dir) + "\n" if spec.code_record is not None else "")
            + prepare_script(
                posix,
                run_dir,
                code_dir,
                code_root=code_root,
                nonce=nonce,
                # on the master: its rendezvous port must be free (torchrun would fail there, and the
                # other nodes could join whatever holds it); a directory the ranks import from, ours
                refuse="\n".join(
                    [
                        *([posix.check_path(spec.imports_from)] if spec.imports_from else []),
                        *([port_busy(posix, spec.master_port, nonce, node)] if spec.node_rank == 0 else []),
                    ]
                ),
            )
            # the master's run says which port it takes: a launch while it starts is refused
            + (
                f"\nprintf '%s\\n' {int(spec.master_port)} > {posix.path_word(run_dir)}/{PORT_FILE}"
                if spec.node_rank == 0
                else ""
            )
        )
        launch = Put(f"{run_dir}/launch.sh", data=rendered.encode("utf-8"), mode=0o700, what="launch script")
    actions: list[Put | Run] = [
        Run(prepare, timeout=60, what="refuse a run id used before; create the run directory", check=check),
        launch,
    ]
    if not native and template is None:  # the launch template starts every rank through it
        actions.append(
            Put(f"{run_dir}/{RANK_CAPTURE}", source=rank_capture_file(), mode=0o600, what="rank capture")
        )
    if spec.shares_json:  # each rank's share of the global batch, and the helper that reads it
        from orchestrator.bench.shares import SHARES_FILE, SHARES_HELPER, shares_helper_file

        helper, shares = shares_helper_file(), spec.shares_json.encode()
        actions.append(Put(f"{run_dir}/{SHARES_HELPER}", source=helper, mode=0o600, what="shares helper"))
        actions.append(Put(f"{run_dir}/{SHARES_FILE}", data=shares, mode=0o600, what="shares"))
    if source is not None and spec.code_record is not None and posix is not None and not absolute:
        actions += _script_into_code_sync(node, posix, spec, source, nonce, notice)
    elif source is not None:
        actions.append(Put(target_script, source=source, what="training script"))
    return NodePlan(node.name, actions)


#: the record a launch prints when it kept the node's own training script (edited on the node)
KEPT_SCRIPT = "kept-script"


def _script_into_code_sync(
    node: Node,
    posix: PosixShell,
    spec: LaunchSpec,
    source: Path,
    nonce: str,
    notice: Callable[[str], None] | None,
) -> list[Put | Run]:
    """The training script into code sync's directory: uploaded beside its place, then put there
    unless the node's file there is its own (edited on the node: neither the bytes a sync or a
    launch put there, nor the project's), which is kept, and said, as code sync keeps and says it
    (one `bootstrap` warned "kept: the node runs with it", then its launch overwrote it). What was put
    there is recorded for code sync (``LAUNCHED_RECORD``): the next sync replaces it as a file it
    shipped (it called it "the node's own, kept" after every `edit, launch`)."""
    from orchestrator.steps.codesync.ignore import LAUNCHED_RECORD, SHIPPED_RECORD

    code, rel = spec.code_dir.rstrip("/"), posixpath.normpath(spec.script)
    digest = hashlib.sha256(source.read_bytes()).hexdigest()
    arrived = f"{code}/{posixpath.dirname(rel) + '/' if '/' in rel else ''}.{posixpath.basename(rel)}.{nonce}"
    w, q, named = posix.path_word, posix.quote, json.dumps(rel)
    shipped, launched = w(f"{code}/{SHIPPED_RECORD}"), w(f"{code}/{LAUNCHED_RECORD}")
    put = (
        f"t={w(f'{code}/{rel}')} n={w(arrived)} r={launched}\n"
        # a link or a directory there is the node's own (code sync keeps it too): never followed
        'if [ -L "$t" ] || { [ -e "$t" ] && [ ! -f "$t" ]; }; then\n'
        f'  rm -f -- "$n"; _cb_rec {KEPT_SCRIPT}; exit 0\n'
        "fi\n"
        # a file: replaced when it holds the project's bytes or those a sync or launch recorded; with
        # no record at all (copied there by hand), replaced as code sync replaces it
        f'if [ -f "$t" ] && {{ [ -f {shipped} ] || [ -f "$r" ]; }}; then\n'
        '  s=$(sha256sum < "$t" 2>/dev/null) && s=${s%% *} && [ "${#s}" = 64 ] ||'
        ' { rm -f -- "$n"; echo "cannot hash $t: sha256sum is needed on the node (coreutils)"; exit 1; }\n'
        f'  if [ "$s" != {digest} ] && ! grep -qsF -- {q(json.dumps(rel) + ": ")}"\\"$s\\"" {shipped}'
        f' && ! grep -qsxF -- "$s "{q(named)} "$r"; then\n'
        f'    rm -f -- "$n"; _cb_rec {KEPT_SCRIPT}; exit 0\n'
        "  fi\n"
        "fi\n"
        'mv -f -- "$n" "$t" || exit 1\n'
        # the record gets a line (every script launched stays there until the next sync): a new file
        # renamed into place, never written through a link
        '{ rm -f -- "$r.$$"; (set -C; { [ -f "$r" ] && [ ! -L "$r" ] && cat -- "$r"; '
        f'printf \'%s\\n\' {q(f"{digest} {named}")}; }} > "$r.$$") && mv -f -- "$r.$$" "$r"; }} 2>&1'
    )

    def said(result: Result) -> None:
        if records.find(result.stdout, nonce, KEPT_SCRIPT) is not None and notice is not None:
            notice(
                f"bootstrap: {one_line(rel)} in {one_line(code)} is the node's own (edited there: not what a"
                " sync or launch put there), so it was kept, not replaced by the project's: the run trains"
                " with it; move it away on the node to train the project's"
            )
        elif not result.ok:
            raise CommandFailedError(
                f"cannot put the training script in place: {' | '.join(result.tail(3))}", node=node.name
            )

    return [
        Put(arrived, source=source, what="training script, beside its place"),
        Run(
            posix.record_functions(nonce) + "\n" + put,
            timeout=60,
            what="put the training script in place, unless the node's own is there",
            check=said,
        ),
    ]


def node_plan(
    node: Node,
    platform: Platform,
    spec: LaunchSpec,
    *,
    renderer: Renderer,
    template: str | None = None,
    script_file: Path | None = None,
    notice: Callable[[str], None] | None = None,
    secrets: Literal["mask"] | None = None,
    nonce: str | None = None,
) -> NodePlan:
    """A node's whole part of a foreground run, as data: ``prepare_plan`` then the launcher, its output
    streamed (and kept in node.log on the node). What --dry-run prints, what ``run_node`` applies.

    Native Windows: the last action writes the follower and the watchdog into the run directory and
    runs the follower's first round, which starts the watchdog and the launcher outside the WinRS
    job and follows node.log (runs/windows.py); ``run_node`` then runs the next rounds
    (``& follow.ps1 -Offset N``) until the launcher has ended. ``nonce``: the first round's records'
    (``run_node`` reads them; a fresh one when nobody does)."""
    prepared = prepare_plan(
        node,
        platform,
        spec,
        renderer=renderer,
        template=template,
        script_file=script_file,
        notice=notice,
        secrets=secrets,
    )
    run_dir = run_dir_for(node, spec.run_id)
    if (powershell := platform.as_powershell()) is not None:
        launcher = Run(
            windows_command(powershell, run_dir, nonce or records.new_nonce()),
            stream=True,
            keep_lines=20,
            timeout=FIRST_ROUND_TIMEOUT,
            what="start the launcher and its watchdog outside the WinRS job, then follow node.log"
            f" (the next rounds: follow.ps1 -Offset N every {ROUND_SECONDS:g} s)",
        )
    else:
        posix = platform.as_posix()
        assert posix is not None
        command = posix_command(posix, node, spec)
        launcher = Run(
            command, env=launcher_env(spec.sample_nonce), stream=True, keep_lines=200, what="the launcher"
        )
    return NodePlan(node.name, [*prepared.actions, launcher])


def launch_scripts(renderer: Renderer, specs: list[LaunchSpec]) -> dict[str, str]:
    """`render`: each node's launch script, secrets masked, in the shell it runs in (a WSL-mode
    Windows node renders the Linux torchrun script: it runs inside the distribution)."""
    from orchestrator.platforms import platform_for_node

    return render_all(renderer, specs, {s.node.name: platform_for_node(s.node) for s in specs}, mask=True)


def launch_files(renderer: Renderer, specs: list[LaunchSpec]) -> dict[str, bytes]:
    """`render --out`: file name -> bytes of each node's script to run by hand (``<node>.sh``, or
    ``<node>.ps1`` in UTF-8 with a BOM, which Windows PowerShell 5.1 needs), secrets referenced not
    written, and the rank capture the POSIX scripts start every rank through."""
    from orchestrator.platforms import platform_for_node

    platforms = {s.node.name: platform_for_node(s.node) for s in specs}
    files: dict[str, bytes] = {}
    for name, text in render_all(renderer, specs, platforms, mask=False).items():
        powershell = platforms[name].as_powershell()
        if powershell is not None:
            files[f"{name}.ps1"] = powershell.script_file(text)
        else:
            files[f"{name}.sh"] = text.encode("utf-8")
    if any(p.as_powershell() is None for p in platforms.values()):
        files[RANK_CAPTURE] = rank_capture_file().read_bytes()
    return files


def offline_dry_run(
    command: str,
    inventory: Inventory,
    run_id: str,
    renderer: Renderer,
    specs: Callable[[list[LaunchSpec]], list[LaunchSpec]],
    *,
    ssh: SSHOptions,
    say: Callable[[str, str], None],
    **options: Any,
) -> Report[Planned]:
    """``--dry-run`` of launch, validate and bench, connecting to nothing: the offline launch plan
    (how an auto backend was taken: ``say``), ``specs`` (the command's ranks from the launch's), each
    node's plan (:func:`dry_run_nodes`, given ``options``)."""
    launch_plan = offline_plan(inventory, run_id)
    if inventory.cluster.backend == "auto":
        say("note", launch_plan.backend_reason)
    data = {"run_id": run_id, "backend": launch_plan.backend}
    chosen = specs(launch_plan.specs)
    return dry_run_nodes(command, inventory, chosen, renderer, ssh=ssh, data=data, **options)


def dry_run_nodes(
    step: str,
    inventory: Inventory,
    specs: list[LaunchSpec],
    renderer: Renderer,
    *,
    ssh: SSHOptions,
    template: str | None = None,
    script_file: Path | None = None,
    detach: bool = False,
    data: dict[str, Any] | None = None,
) -> Report[Planned]:
    """The dry run of a launch, validate or bench, connecting to nothing: per node its plan
    (``steps.launch.node_plan``, the very object ``run_node`` applies) with its launch script's secrets
    masked, and the exact texts the node's shell receives (``transport.plan``). Each node's ``--json``
    entry adds ``run_dir``, ``uploads``, ``script``, ``prepare`` and ``commands`` (the launcher's).

    ``template``: another template than the platform's launch template, for POSIX shells (native
    Windows keeps its own, as validation does). ``script_file``: a file of ours uploaded for
    ``spec.script`` (validation's worker). ``detach``: the launcher is `launch --detach`'s
    start script.
    """
    from orchestrator.plans import sent_text
    from orchestrator.runs.control import start_script
    from orchestrator.steps.dry_run import Planned, dry_run_report, unconnected

    by_name = {s.node.name: s for s in specs}
    nodes = [n for n in inventory.nodes if n.name in by_name]
    with unconnected(inventory, nodes, ssh) as transport_of:

        def one(node: Node) -> tuple[NodePlan, Planned]:
            spec = by_name[node.name]
            transport = transport_of(node)
            platform = transport.platform
            native = platform.as_powershell() is not None
            plan = node_plan(
                node,
                platform,
                spec,
                renderer=renderer,
                template=None if native else template,
                script_file=script_file,
                secrets="mask",
            )
            if detach:
                start = start_script(platform, node, spec.run_id)
                plan.actions[-1] = Run(
                    start, env=launcher_env(spec.sample_nonce), what="start the launcher detached"
                )
            sent = [sent_text(transport, a) for a in plan.actions if isinstance(a, Run)]
            launch_put = next(a for a in plan.actions if isinstance(a, Put))
            script = launch_put.content().decode("utf-8-sig")
            fields = {
                "run_dir": run_dir_for(node, spec.run_id),
                "uploads": plan.uploads,
                "script": script,
                "prepare": sent[:-1],
                "commands": sent[-1:],
                "plan": plan.public_dict(transport),
            }
            return plan, Planned(transport.describe(), sent, {launch_put.target: script}, fields)

        return dry_run_report(step, nodes, one, data)


def prepare_node(
    node: Node,
    transport: Transport,
    spec: LaunchSpec,
    *,
    renderer: Renderer,
    template: str | None = None,
    script_file: Path | None = None,
    notice: Callable[[str], None] | None = None,
) -> tuple[PosixShell, str, str]:
    """``prepare_plan`` applied on a POSIX node. Returns (platform, run directory, node log path)."""
    platform = transport.platform.as_posix()
    if platform is None:
        raise UsageError(f"launching on {transport.platform.name} nodes is not supported yet", node=node.name)
    planned = prepare_plan(
        node, platform, spec, renderer=renderer, template=template, script_file=script_file, notice=notice
    )
    apply(planned, transport)
    run_dir = run_dir_for(node, spec.run_id)
    return platform, run_dir, f"{run_dir}/node.log"


def prepare_windows_node(
    node: Node,
    transport: Transport,
    platform: PowerShell,
    spec: LaunchSpec,
    *,
    renderer: Renderer,
    template: str | None = None,
    script_file: Path | None = None,
) -> tuple[str, str]:
    """``prepare_plan`` applied on a native Windows node: ``launch.ps1`` (UTF-8 with BOM, which Windows
    PowerShell 5.1 needs) and the training script. Returns (command, node log path): the command is
    ``windows_command``, the first round of the run's follower (runs/windows.py).
    """
    planned = prepare_plan(
        node, platform, spec, renderer=renderer, template=template, script_file=script_file
    )
    apply(planned, transport)
    run_dir = run_dir_for(node, spec.run_id)
    return windows_command(platform, run_dir, records.new_nonce()), f"{run_dir}/node.log"


def start_detached(
    session: Session, specs: list[LaunchSpec], *, renderer: Renderer, train_doc: Mapping[str, Any] | None
) -> DetachedStart:
    """`launch --detach`: the run's record (``runs/<run-id>/run.json``, ``train_doc`` its arguments),
    then on every node ``prepare_plan`` applied (run directory, launcher, training script), then the
    launcher started detached; all or nothing (runs.start.start_all)."""
    from orchestrator.runs.layout import RUNS_ROOT, finish_record, write_record

    if specs:
        run_id = specs[0].run_id
        write_record(RUNS_ROOT / run_id, run_id, specs, detached=True, train=train_doc)

    def prepare(node: Node, transport: Transport, spec: LaunchSpec) -> None:
        apply(prepare_plan(node, transport.platform, spec, renderer=renderer), transport)

    started = start_all(session, specs, prepare)
    # cut short, or refused on a node (the port in use), and stopped again everywhere: it never ran,
    # so it is never `latest` (`status` then called the run that holds the port "gone")
    cut = started.interrupted is not None or bool(started.failed)
    if specs and cut and started.swept_all and all(o.ok for o in started.undone):
        finish_record(RUNS_ROOT / specs[0].run_id, started=False)
    return started


def windows_command(platform: PowerShell, run_dir: str, nonce: str) -> str:
    """What starts a native Windows node's part of a foreground run and follows it: launch.ps1
    created outside the WinRS job (it writes its log), with the watchdog that stops it when the
    controller is gone; the first round of its follower (``WindowsRuns.foreground``)."""
    return WindowsRuns(platform).foreground(run_dir, f"{run_dir}/node.log", nonce)


def posix_command(platform: PosixShell, node: Node, spec: LaunchSpec) -> str:
    """What runs a Linux (or WSL) node's part of a foreground run: pid file + marker (so `bootstrap
    stop/status/logs --run` work on foreground runs too), then launch.sh with its output kept in
    node.log."""
    run_dir = run_dir_for(node, spec.run_id)
    return (
        PosixRuns(platform).run_identity(run_dir, run_marker(spec.run_id, node.name))
        + "\n"
        + PosixRuns(platform).logged(platform.run_script(f"{run_dir}/launch.sh"), f"{run_dir}/node.log")
    )


def run_node(
    node: Node,
    transport: Transport,
    spec: LaunchSpec,
    *,
    renderer: Renderer,
    on_line: Callable[[str, str], None] | None = None,
    output: OnLine | None = None,
    template: str | None = None,
    script_file: Path | None = None,
    started: set[str] | None = None,
) -> NodeRunResult:
    """Apply the node's plan (``node_plan``): upload, then run its launcher; raises CommandFailedError
    (with the tail) on failure.

    Its output goes to ``on_line(node, line)``, or to ``output``, the node's own handler (a
    ``BlockHandler`` such as ``RankedOutput`` takes it a block of lines at a time).

    ``template``: another launch template than the platform's default (validation uses one);
    ``script_file``: a local file uploaded for ``spec.script`` (to ``code_dir/script`` when relative) instead
    of the training script. ``started`` gets the node's name just before its launcher is started:
    the nodes where this run may have processes (a node that refused the run id has none of this
    run, and another run's by that id must not be touched).
    """
    if output is None:
        per_line = on_line

        def output(stream: Stream, line: str) -> None:
            if per_line is not None:
                per_line(node.name, line)

    said = output
    stale = []  # the notice of a code directory that is not the project's, said again in the summary

    def noticed(text: str) -> None:
        stale.extend([text.removeprefix("bootstrap: ")] if STALE_CODE in text else [])
        said("stderr", text)

    node_log = f"{run_dir_for(node, spec.run_id)}/node.log"
    nonce = records.new_nonce()  # the follower's first round's (native Windows)
    planned = node_plan(
        node,
        transport.platform,
        spec,
        renderer=renderer,
        template=template,
        script_file=script_file,
        # other runs still on the node, said where its lines go (a launch, not a validation)
        notice=noticed if template is None else None,
        nonce=nonce,
    )
    launched = False

    def starting(_: Run) -> None:
        nonlocal launched
        launched = True
        if started is not None:
            started.add(node.name)

    # native Windows: the plan's last action is the follower's first round (the tail protocol)
    native = transport.platform.as_powershell() is not None
    followed = Followed(node.name, output, nonce) if native else None
    try:
        results = apply(planned, transport, output=followed or output, before=starting)
    except BootstrapError as exc:
        if not launched and transport.closed and not isinstance(exc, CancelledError):
            # another node failed (or Ctrl-C) while this one was being prepared: nothing started here
            raise CancelledError("stopped before it started", node=node.name) from exc
        raise
    result = results[-1]
    killed = False  # the launcher ended without an exit code (native Windows: its processes were ended)
    if followed is not None:
        # later rounds until the launcher has ended; cancelled: the node's watchdog stops the run
        end = follow_windows(node, transport, run_dir_for(node, spec.run_id), followed, result)
        result, killed = end.result, end.ended and end.result.exit_code is None
    if result.exit_code is None and not killed:
        if result.timed_out:  # native Windows: a round of the follower that never ended
            raise CommandFailedError(
                "following the run timed out (the node's watchdog stops it)",
                node=node.name,
                hint=f"the node keeps its log in {node_log}",
                result=result,
            )
        # our own connection was closed: another node failed (fail fast) or the user interrupted
        raise CancelledError("stopped", node=node.name, hint=f"its log: {node_log}")
    if killed or result.exit_code != 0:
        if stopped_by_operator(transport, node, spec):
            raise RunStoppedError(
                "stopped by stop --run", node=node.name, hint=f"the node keeps its log in {node_log}"
            )
        error = CommandFailedError(
            "the launcher ended without an exit code: its processes were ended on the node"
            if killed
            else failure_headline(result, global_tags=spec.elastic),
            node=node.name,
            hint=f"the node keeps its log in {node_log}",
            result=result,
        )
        raise error
    return NodeRunResult(0, result.duration, result.tail(TAIL), node_log, stale_code="".join(stale[:1]))


def stopped_by_operator(transport: Transport, node: Node, spec: LaunchSpec) -> bool:
    """Whether `stop --run` ended this node's part of the run (not a failure of its own): it wrote
    ``stopped`` in the run directory (POSIX and native Windows alike) before stopping anything."""
    platform = transport.platform.as_posix() or transport.platform.as_powershell()
    if platform is None:
        return False
    nonce = records.new_nonce()
    stopped = records.record(nonce, "stopped").rstrip("\n")
    try:
        said = transport.run(
            platform.say_if_exists(f"{run_dir_for(node, spec.run_id)}/{STOPPED}", stopped), timeout=30
        )
    except BootstrapError:
        return False  # the node is gone too: report what its launcher said
    return records.find(said.stdout, nonce, "stopped") is not None


def root_cause(result: Result, *, global_tags: bool = False) -> tuple[int, int] | None:
    """(global rank, its own exit code) of the rank that made torchrun fail, when it printed its
    failure summary: torchrun's first observed failure, unless that is a co-located victim of the
    culprit's closed connection (runs/culprit.py). ``global_tags``: the node's lines are tagged with
    global ranks (elastic runs), not local ones.

    torchrun itself exits 1 whatever its worker did (FIELD_NOTES, "torchrun"): the rank's code (3, or
    -9 for a kill) is only in this summary."""
    found = _culprit(result, global_tags=global_tags)
    return None if found is None else (found.rank, found.exit_code)


def _culprit(result: Result, *, global_tags: bool = False) -> Failure | None:
    text = result.stdout + "\n" + result.stderr

    def last_lines(failure: Failure) -> list[str]:
        tag = failure.rank if global_tags or failure.local_rank is None else failure.local_rank
        return tagged_lines(text, tag)

    return culprit(torchrun_failures(text), last_lines, stopped_pids(text))


def died_of_a_peer(result: Result, *, global_tags: bool = False) -> bool:
    """Whether the node's failure looks like another node's consequence: the rank its torchrun
    failed for (runs/culprit.py) died of gloo's closed connection (a peer went away first)."""
    found = _culprit(result, global_tags=global_tags)
    text = result.stdout + "\n" + result.stderr
    if found is None or found.pid in stopped_pids(text):
        return False
    tag = found.rank if global_tags or found.local_rank is None else found.local_rank
    return is_victim(tagged_lines(text, tag))


def failure_headline(result: Result, *, global_tags: bool = False) -> str:
    """ "rank 5 exited with code 3" when torchrun named the rank, else the launcher's own exit code."""
    cause = root_cause(result, global_tags=global_tags)
    if cause is not None:
        rank, code = cause
        how = f"was killed by signal {-code}" if code < 0 else f"exited with code {code}"
        return f"rank {rank} {how} (torchrun exited {result.exit_code})"
    return f"training exited with code {result.exit_code}"


def _lines(text: str) -> list[str]:
    """``text``'s lines, ended by "\n" only (a CRLF's "\r" dropped)."""
    lines = text.split("\n")
    if lines[-1] == "":
        lines.pop()
    return [line.removesuffix("\r") for line in lines]


def failure_tail(result: Result, lines: int = TAIL, *, global_tags: bool = False) -> list[str]:
    """What a user needs from a failed node: the last lines its ranks printed, then torchrun's root
    cause (host, rank, exit code). torchrun's own ChildFailedError traceback (30+ lines) would
    otherwise push the worker's actual error out of a plain tail."""
    # lines end at "\n" only, as the stream and the log read them: a rank's \x1e, \u2028 or \r
    # (which splitlines() ends a line at) cannot start a line tagged as another rank's
    text = _lines(result.stdout) + _lines(result.stderr)
    ranked = [line for line in text if line.startswith("[default")]
    if not ranked:
        return text[-lines:]
    found = _culprit(result, global_tags=global_tags)
    cause = list(found.fields[:3]) if found is not None else []
    return ranked[-(lines - len(cause)) :] + cause
