"""Where a run lives, on each node and here: one layout, read by everything that touches a run.

On a node, below its ``workdir`` (the inventory's, default ``~/cluster-bootstrap``; ``{node}`` in it
is the node's name, so nodes that share a filesystem, such as NFS homes, get a directory each)::

    <workdir>/code/                      the code directory (default of train.code_dir, code.dest)
    <workdir>/venv/                      the environment (default of env.path)
    <workdir>/runs/<run-id>/<node>/      the run directory: created new, owner-only, on a path no other
                                         user can change (steps.launch.prepare_script)
        launch.sh | launch.ps1           the launcher: the node's rendered launch script
        rank_capture.py                  POSIX: what the launcher starts each rank through
        pid                              the launcher's identity (POSIX "PID SESSION STARTTIME",
                                         native Windows "PID TICKS")
        ranks                            native Windows: each rank's "PID TICKS"
        node.log                         everything the launcher printed, append-only
        node.log.rc                      its exit code, renamed into place once node.log is complete
        stopped                          `stop` writes it (the node's clock) before it signals anything
        out/                             the run's outputs: $CB_RUN_DIR of the training script
                                         (checkpoints, metrics; `fetch` looks here first)

The run directory is per node even inside one workdir: two nodes sharing a home would otherwise run
the last-written script. Every process of a POSIX run carries the run marker in its environment
(``RUN_MARKER_ENV=<run-id>/<node>/<launcher pid>-<its start time>``, the pid file's values): `stop`
finds exactly them, never a process matched by name, nor one of another launch under the same run id
(from another directory, or of a same-named cluster sharing the machine).

Here, relative to the directory `launch` ran in::

    runs/<run-id>/run.json               the record: which nodes and ranks the run has
    runs/<run-id>/<node>.log             the copy of each node's output (orchestrator/logs.py)
    runs/<run-id>/<node>/                what `fetch` copied

Everything bootstrap creates here is this user's alone: directories 0700, files 0600
(safefiles.private_dirs, safefiles.replacing, safefiles.write_inside).
"""

from __future__ import annotations

import json
import os
import shlex
import socket
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from orchestrator.records import NONCE
from orchestrator.safefiles import private_dirs, write_inside

if TYPE_CHECKING:
    from orchestrator.inventory import Inventory, Node
    from orchestrator.render import LaunchSpec

#: a node's workdir when the inventory gives none (``~``: the connecting user's home on the node)
DEFAULT_WORKDIR = "~/cluster-bootstrap"
#: in a code directory: code sync's scan cache, whose presence says the directory is bootstrap's (what
#: sync may delete there is only what its record of shipped files lists); `launch` writes an empty one
#: into a code directory it creates (steps/probes/code_tree.py CACHE, codesync/ignore.py RESERVED_PREFIX)
CODE_MARKER = ".bootstrap-code.json"
#: replaced by the node's name in ``workdir`` and ``env.path``
NODE_PLACEHOLDER = "{node}"

NODE_LOG = "node.log"
#: in a node's run directory: the training script's own outputs, exported to it as CB_RUN_DIR (with
#: the run id as CB_RUN_ID) by the launch script
RUN_OUTPUTS = "out"
EXIT_CODE = NODE_LOG + ".rc"
PID_FILE = "pid"
STOPPED = "stopped"
#: ... and the one a POSIX run's launcher writes when a signal reached it (whoever sent it: the
#: watcher of a controller that went away or was interrupted): stopped, but not said to be by `stop`
SIGNALLED = "signalled"

#: environment variable holding ``<run-id>/<node>`` in every process of a POSIX run
RUN_MARKER_ENV = "CLUSTER_BOOTSTRAP_RUN"
#: every process of a run also carries its run directory, as the node spells it (runs/posix.py)
RUN_DIR_ENV = "CLUSTER_BOOTSTRAP_RUN_DIR"

#: torchrun copies its workers' output with write() and never flushes: into a pipe, Python buffers
#: 8 KiB, and lines would reach the controller minutes late. Unbuffered, each arrives as printed.
STREAMING_ENV = {"PYTHONUNBUFFERED": "1"}
#: the launcher's environment variable naming the nonce of the run's samples (rank_capture.py)
SAMPLE_NONCE_ENV = "CB_SAMPLE_NONCE"


def launcher_env(sample_nonce: str) -> dict[str, str]:
    """The environment a launcher is started with: lines as they are printed, and the nonce its
    rank capture frames the node's samples with (none: no samples)."""
    return {**STREAMING_ENV, SAMPLE_NONCE_ENV: sample_nonce} if sample_nonce else dict(STREAMING_ENV)


#: the controller's run directories (relative to the current directory, where `launch` ran)
RUNS_ROOT = Path("runs")
RECORD = "run.json"


def node_path(path: str, node_name: str) -> str:
    """A path setting as it is on one node: ``{node}`` becomes the node's name."""
    return path.replace(NODE_PLACEHOLDER, node_name)


def workdir_for(node: Node) -> str:
    """The node's workdir: the inventory's (``{node}`` replaced) or the default, without a trailing
    slash (``/`` stays ``/``)."""
    return node_path(node.workdir or DEFAULT_WORKDIR, node.name).rstrip("/") or "/"


def in_workdir(node: Node, *parts: str) -> str:
    """``<workdir>/<parts...>`` on the node."""
    return "/".join([workdir_for(node).rstrip("/"), *parts])


def run_dir_for(node: Node, run_id: str) -> str:
    """The node's directory for one run (launch script, node.log, pid and exit-code files)."""
    return in_workdir(node, "runs", run_id, node.name)


def node_log(run_dir: str) -> str:
    return f"{run_dir}/{NODE_LOG}"


def run_marker(run_id: str, node_name: str) -> str:
    """What every process of one node's part of a run carries in RUN_MARKER_ENV, before the launcher's
    own token (runs/posix.py run_identity): how `stop` finds them (never by a name pattern that
    could hit another run)."""
    return f"{run_id}/{node_name}"


def logs_where(nodes: Sequence[Node], run_id: str) -> str:
    """Where the nodes keep their logs of ``run_id``, for a line after a run: the path itself when
    every node has the same workdir, else the pattern (`bootstrap inventory` shows each workdir)."""
    workdirs = {workdir_for(n) for n in nodes}
    pattern = f"runs/{run_id}/<node>/{NODE_LOG}"
    if len(workdirs) == 1:
        (workdir,) = workdirs
        return f"{workdir.rstrip('/')}/{pattern} on each node"
    return f"{pattern} under each node's workdir, which `bootstrap inventory` lists"


# -- the controller's record of runs ---------------------------------------------------------------


def write_record(
    directory: Path,
    run_id: str,
    specs: Sequence[LaunchSpec],
    *,
    detached: bool,
    train: Mapping[str, Any] | None = None,
) -> None:
    """``runs/<run-id>/run.json``: which nodes and ranks a run has, so `logs`, `status`, `stop` and
    `fetch` find the latest run without being told; ``train``: the script's arguments and what the
    command line changed (:func:`train_record`), which `status` shows."""
    private_dirs(directory)
    doc = {
        "run_id": run_id,
        "detached": detached,
        "started": time.time(),
        # a foreground run's controller says when it let go of the run (finish_record): a record
        # whose "ended" stays null belongs to a controller that vanished mid-run (controller_lost)
        **({} if detached else {"ended": None, "controller": this_controller()}),
        "nodes": {s.node.name: {"first_rank": s.first_rank, "nproc": s.nproc} for s in specs},
        # how `logs --follow --dashboard` and `status --watch` tell the node's samples in its log
        **({"sample_nonce": specs[0].sample_nonce} if specs and specs[0].sample_nonce else {}),
        **({"train": dict(train)} if train is not None else {}),
    }
    write_inside(directory, RECORD, (json.dumps(doc, indent=2) + "\n").encode())


def sample_nonce(directory: Path) -> str:
    """The nonce of the run's samples in its output, as its record says ("": none recorded)."""
    found = (read_record(directory) or {}).get("sample_nonce")
    return found if isinstance(found, str) and NONCE.fullmatch(found) else ""


def finish_record(directory: Path, *, started: bool = True) -> None:
    """A foreground run's controller lets go of the run (it ended, failed, or was interrupted and
    swept): its record's ``ended`` is set. A controller killed outright never gets here.
    ``started`` False: the master's launcher never started (refused: the port in use, the run id
    used before; the others then stopped at once; a detached start cut short and stopped again);
    such a record is never the ``latest`` run
    (``runs.ids.resolve_run``)."""
    doc = read_record(directory)
    if doc is None or ("ended" not in doc and started):  # a detached run's: only "never started"
        return
    if "ended" in doc:
        doc["ended"] = time.time()
    if not started:
        doc["not_started"] = True
    write_inside(directory, RECORD, (json.dumps(doc, indent=2) + "\n").encode())


def note_stop(directory: Path, unreached: Sequence[str], stopped: Sequence[str] = ()) -> None:
    """A `stop --run` of a run launched from here, in its record (``stops``): when, the nodes it
    could not reach and those where it stopped something. `status` then knows that a non-zero exit
    on an unreached node after those were stopped is their going away (its ranks lost their peers),
    not a failure of the run."""
    doc = read_record(directory)
    if doc is None:
        return
    stops = doc.get("stops")
    earlier = stops if isinstance(stops, list) else []
    doc["stops"] = [*earlier, {"at": time.time(), "unreached": sorted(unreached), "stopped": sorted(stopped)}]
    write_inside(directory, RECORD, (json.dumps(doc, indent=2) + "\n").encode())


def stop_nodes(record: Mapping[str, Any] | None, key: str) -> set[str]:
    """The nodes a `stop --run` of the run could not reach (``key`` "unreached"), or where it
    stopped something ("stopped"), from its record's ``stops``."""
    stops = (record or {}).get("stops")
    return {
        name
        for stop in (stops if isinstance(stops, list) else [])
        if isinstance(stop, dict) and isinstance(stop.get(key), list)
        for name in stop[key]
        if isinstance(name, str)
    }


def controller_lost(record: Mapping[str, Any] | None, states: Sequence[str]) -> bool:
    """One story for a run whose foreground controller vanished (SIGKILL, its machine lost): its
    record was never finished and nothing of it runs any more. Each node's own word then depends
    only on a race (the node's watchdog killed the ranks: "stopped"; the ranks failed first when
    their peers went: "exited (1)"), so the run is told as lost on every node instead. ``states``:
    every node's NodeStatus.state (a node that could not be read: leave the run's story alone)."""
    if not record or record.get("detached") or "ended" not in record or record["ended"] is not None:
        return False
    if states and all(state == "not started" for state in states):
        # started nowhere yet: a launch still uploading, or one killed before it started anything
        return controller_gone(record)
    return bool(states) and all(state in ("stopped", "exited", "no exit code") for state in states)


def _boot_id() -> str | None:
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:  # not Linux: which process started a run cannot be told
        return None


def _started_at(pid: object) -> str | None:
    """When process ``pid`` started (clock ticks after boot: /proc/PID/stat's 22nd field), None: no
    such process. With the pid, it names one process: a pid used again is another start."""
    if not isinstance(pid, int) or pid <= 0:
        return None
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[-1].split()[19]
    except (OSError, IndexError):
        return None


def this_controller() -> dict[str, Any]:
    """This process as a foreground run's record names its controller (:func:`controller_gone`)."""
    return {
        "host": socket.gethostname(),
        "boot": _boot_id(),
        "pid": os.getpid(),
        "since": _started_at(os.getpid()),
    }


def controller_gone(record: Mapping[str, Any]) -> bool:
    """The process that launched a foreground run is known to be gone: on this machine (by its
    name), since a reboot, or its pid no longer the process that started then. False when that cannot
    be told here (another machine, not Linux, an older record)."""
    was = record.get("controller")
    if not isinstance(was, dict) or was.get("host") != socket.gethostname():
        return False
    boot = _boot_id()
    if boot is None or was.get("boot") is None:
        return False
    return was["boot"] != boot or _started_at(was.get("pid")) != was.get("since")


def train_record(inventory: Inventory) -> dict[str, Any]:
    """What a run record keeps of the training: the script, its arguments, where they came from, and
    the train.env values the command line set (secret-looking ones masked, as --json does: by name,
    by flag, and a URL's login in any of them)."""
    from orchestrator.inventory.model import MASK, is_secret_name, masked_args
    from orchestrator.redact import mask_credentials_in

    train = inventory.cluster.train
    overrides = inventory.run_overrides
    env = overrides.get("env") or {}
    record: dict[str, Any] = mask_credentials_in(
        {
            "script": train.script,
            **({"script_from": "command line"} if "script" in overrides else {}),
            "args": list(masked_args(train.args)),
            "args_from": "command line" if "args" in overrides else "inventory",
            "env": {name: MASK if is_secret_name(name) else value for name, value in env.items()},
        }
    )
    return record


def train_args_line(train: Mapping[str, Any] | None) -> str:
    """``args: --lr 0.1 (command line); env: A=1``: what a run's script got (a record's
    :func:`train_record`), for `launch` and `status`; "" when the record has nothing to say (no
    arguments, nothing set for this run). A URL's login is masked again (a record an older version
    wrote kept it)."""
    from orchestrator.redact import mask_credentials_in

    if not train:
        return ""
    train = mask_credentials_in(dict(train))
    parts = [f"script: {train.get('script')} (command line)"] if train.get("script_from") else []
    args = [str(a) for a in train.get("args") or []]
    if args or train.get("args_from") == "command line":
        parts.append(f"args: {shlex.join(args) or '(none)'} ({train.get('args_from', 'inventory')})")
    env = train.get("env") or {}
    if env:
        parts.append("env: " + " ".join(f"{k}={shlex.quote(str(v))}" for k, v in env.items()))
    return "; ".join(parts)


def read_record(directory: Path) -> dict[str, Any] | None:
    """A run's record here (``runs/<run-id>/run.json``), None when there is none or it is unreadable."""
    try:
        doc = json.loads((directory / RECORD).read_text())
    except (OSError, ValueError):
        return None
    return doc if isinstance(doc, dict) else None
