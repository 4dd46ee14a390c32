"""Nodes whose workdirs are one directory (NFS homes, a lab's shared disk), found by markers.

Each node writes a file named after itself, holding a token of this check, into
``<dir>/.cluster-bootstrap-nodes/``; once every node has written (a barrier: the end of one fan-out),
each lists that directory. A node that finds another node's file with *this* check's token shares the
directory with it: no path comparison could tell (``/home/alice`` is a different directory on every
machine, or the same one over NFS). Files from earlier checks carry other tokens and are ignored.

Used by `check` (the ``workdir`` verdict, :func:`check_shared_workdirs`) and by the environment sync,
which writes its marker in its probe and reads the markers before building: nodes that would build in
one directory are stopped before they delete each other's builds, with that as the headline.

Two round trips per node (write, then read), run by the node's own Python: the same text on POSIX
and Windows nodes.
"""

from __future__ import annotations

import functools
import json
import secrets
from collections.abc import Sequence
from importlib import resources
from typing import TYPE_CHECKING

from orchestrator.errors import CommandFailedError
from orchestrator.facts.interpreter import interpreter_for
from orchestrator.runs.layout import workdir_for
from orchestrator.steps.preflight.model import Verdict, fail, ok, warn

if TYPE_CHECKING:
    from orchestrator.executor import Outcome
    from orchestrator.inventory import Inventory, Node
    from orchestrator.platforms import Platform
    from orchestrator.session import Session
    from orchestrator.transports import Result, Transport

#: the directory (inside each checked directory) holding one marker file per node
MARKER_DIR = ".cluster-bootstrap-nodes"
#: the verdict's name in `check`'s table
CHECK = "workdir"
#: what a marker write says of a link or a file where the markers' directory goes (probes/safe_path.py
#: ``_sp_marks``, rounds.py ``mark_command``)
PLANTED = "not a directory of its own"

# Runs under the node's Python (any 3.x, standard library only). Argument: {"op": "write"|"read",
# "dirs": [...], "name": node name, "token": ...}. Prints one JSON line: {dir: {"path": absolute,
# "seen": {node: token}} or {"error": why}}.
MARKER_CODE = r"""
import json, os, sys
args = json.loads(sys.argv[1])
out = {}
for d in args["dirs"]:
    path = os.path.abspath(os.path.expanduser(d))
    marks = os.path.join(path, MARKER_DIR)
    try:
        if args["op"] == "write":
            refused = unsafe_path(path)  # (prepended: probes/safe_path.py)
            if refused:
                out[d] = {"path": path, "error": refused}
                continue
            if not os.path.isdir(path):
                os.makedirs(path)
            marks_write(marks, args["name"], args["token"].encode())  # never through a link
            out[d] = {"path": path}
        else:
            seen = {}
            for name, token in marks_read(marks).items():
                try:
                    seen[name] = token.decode().strip()
                except UnicodeError:
                    pass
            out[d] = {"path": path, "seen": seen}
    except OSError as exc:
        out[d] = {"path": path, "error": "%s: %s" % (exc.filename or path, exc.strerror or exc)}
sys.stdout.write(json.dumps(out) + "\n")
""".replace("MARKER_DIR", repr(MARKER_DIR))


def new_token() -> str:
    return secrets.token_hex(8)


def marker_command(node: Node, platform: Platform, args: dict[str, object]) -> str:
    """The command running the marker script with ``args`` under the node's Python: a marker is
    written only into a directory no other user can change (``unsafe_path``)."""
    return platform.join([interpreter_for(node), "-c", safe_path_source() + MARKER_CODE, json.dumps(args)])


@functools.cache
def safe_path_source() -> str:
    """``unsafe_path(path)`` for node-side Python scripts (probes/safe_path.py), to put before them."""
    return resources.files("orchestrator.steps.probes").joinpath("safe_path.py").read_text() + "\n"


def _run(node: Node, transport: Transport, args: dict[str, object]) -> dict[str, dict[str, object]]:
    return marker_answer(node, transport.run(marker_command(node, transport.platform, args), timeout=60))


def marker_answer(node: Node, result: Result) -> dict[str, dict[str, object]]:
    """What the marker script answered (``result``), or CommandFailedError."""
    lines = [line for line in result.stdout.splitlines() if line.startswith("{")]
    if not result.ok or not lines:
        tail = " | ".join(result.tail(3)) or f"exit code {result.exit_code}"
        raise CommandFailedError(f"the workdir marker script failed: {tail}", node=node.name, result=result)
    data: dict[str, dict[str, object]] = json.loads(lines[-1])
    return data


def write_markers(node: Node, transport: Transport, dirs: Sequence[str], token: str) -> dict[str, str]:
    """Write this node's marker into each of ``dirs`` (created when missing): dir -> error, for the
    directories where that failed."""
    data = _run(node, transport, {"op": "write", "dirs": list(dirs), "name": node.name, "token": token})
    return {d: str(v["error"]) for d, v in data.items() if v.get("error")}


def read_args(node: Node, dirs: Sequence[str]) -> dict[str, object]:
    return {"op": "read", "dirs": list(dirs), "name": node.name, "token": ""}


def read_markers(node: Node, transport: Transport, dirs: Sequence[str]) -> dict[str, dict[str, str]]:
    """dir -> {node name: token} as this node sees the markers there."""
    return seen_markers(_run(node, transport, read_args(node, dirs)))


def seen_markers(data: dict[str, dict[str, object]]) -> dict[str, dict[str, str]]:
    """dir -> {node name: token} from the marker script's answer to a read."""
    out: dict[str, dict[str, str]] = {}
    for d, v in data.items():
        seen = v.get("seen")
        out[d] = {str(k): str(t) for k, t in seen.items()} if isinstance(seen, dict) else {}
    return out


def sharing(me: str, seen: dict[str, str], tokens: dict[str, str]) -> list[str]:
    """The other nodes whose marker of *this* check (``tokens``: node -> token) is in the directory
    ``me`` listed (``seen``): they share it."""
    return sorted(n for n, t in seen.items() if n != me and n in tokens and tokens[n] == t)


def fix_text(dirs_label: str = "workdir") -> str:
    return (
        f"give each node its own directory: `{dirs_label}: ~/cluster-bootstrap/{{node}}` in the inventory "
        "(under `defaults:` for every node; {node} becomes each node's name)"
    )


def check_shared_workdirs(session: Session, inventory: Inventory, nodes: list[Node]) -> dict[str, Verdict]:
    """The ``workdir`` verdict of every node in ``nodes`` that answered (two round trips each).

    Sharing fails when the nodes' environments are built there (cluster.env or a --from-master sync,
    without env.path): nodes would delete each other's builds. Otherwise it warns: launch keeps a run
    directory per node, but the first environment sync would break."""
    if len(nodes) < 2:
        return {n.name: ok(CHECK, "one node checked: nothing to share it with") for n in nodes}
    tokens = {n.name: new_token() for n in nodes}
    dirs = {n.name: workdir_for(n) for n in nodes}
    written = session.map(
        lambda node, t: write_markers(node, t, [dirs[node.name]], tokens[node.name]),
        step="workdir",
        nodes=nodes,
    )
    writers = [n for n, o in zip(nodes, written, strict=True) if o.value is not None]
    read = session.map(
        lambda node, t: read_markers(node, t, [dirs[node.name]]), step="workdir", nodes=writers
    )
    return workdir_verdicts(inventory, nodes, dirs, tokens, written, read)


def workdir_verdicts(
    inventory: Inventory,
    nodes: list[Node],
    dirs: dict[str, str],
    tokens: dict[str, str],
    written: list[Outcome[dict[str, str]]],
    read: list[Outcome[dict[str, dict[str, str]]]],
) -> dict[str, Verdict]:
    """The verdicts from what each node's marker write gave (``written``, in ``nodes`` order: dir ->
    error) and what each node that wrote then listed (``read``, in that order: dir -> {node: token});
    `check` gathers both inside its own round trips on Linux nodes (steps/preflight/rounds.py)."""
    writers = [n for n, o in zip(nodes, written, strict=True) if o.value is not None]
    from orchestrator.steps.envsync.master import recorded_nodes

    env = inventory.cluster.env
    # the environment is built in <workdir>/venv unless env.path puts it elsewhere: nodes sharing the
    # workdir would delete each other's builds (code sync writes the same files from every node: racy,
    # but the same bytes)
    builds_here = not env.path and (env.declared or bool(recorded_nodes(inventory)))
    verdicts: dict[str, Verdict] = {}
    for node, outcome in zip(nodes, written, strict=True):
        where = dirs[node.name]
        if outcome.error is not None or outcome.value is None:
            why = outcome.error.args[0] if outcome.error is not None and outcome.error.args else "no answer"
            verdicts[node.name] = warn(CHECK, f"not checked: {why}", "fix that, then rerun", workdir=where)
            continue
        said = outcome.value.get(where, "") if outcome.value else ""
        if said.startswith("refusing "):  # a workdir another user could change: nothing written
            verdicts[node.name] = fail(
                CHECK,
                said,
                "set workdir: to a directory of yours (launch refuses this one too)",
                workdir=where,
            )
        elif outcome.value:
            planted = PLANTED in outcome.value[where]  # a link or a file where the markers go
            verdicts[node.name] = fail(
                CHECK,
                f"cannot write in {where}: {outcome.value[where]}",
                f"remove it (bootstrap makes {MARKER_DIR} itself), then rerun"
                if planted
                else "make the workdir writable by the node's user, or set workdir: to a directory it owns",
                workdir=where,
            )
    for node, listed in zip(writers, read, strict=True):
        if node.name in verdicts:
            continue
        where = dirs[node.name]
        if listed.value is None:
            verdicts[node.name] = warn(
                CHECK, "not checked: the markers could not be read", "rerun", workdir=where
            )
            continue
        others = sharing(node.name, listed.value.get(where, {}), tokens)
        if not others:
            verdicts[node.name] = ok(CHECK, f"{where}: this node's own", workdir=where)
            continue
        reason = (
            f"{where} is the same directory on {', '.join(others)} (a shared filesystem: NFS home, "
            "shared disk)"
        )
        if builds_here:
            verdicts[node.name] = fail(
                CHECK,
                reason + ": `bootstrap sync` on these nodes would delete each other's environments",
                fix_text(),
                workdir=where,
                shared_with=others,
            )
        else:
            verdicts[node.name] = warn(
                CHECK,
                reason + ": training keeps a run directory per node, but an environment sync there "
                "(cluster.env, `bootstrap sync --from-master`) would break",
                fix_text(),
                workdir=where,
                shared_with=others,
            )
    return verdicts
